"""Agent specs: commands, presets, prompt placement, continuation, clear errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import turnkeeper
from turnkeeper.agents.spec import CLAUDE_CODE_ENV, AgentSpec, require_prompt, safe_session_id
from turnkeeper.errors import (
    AgentError,
    EmptyPromptError,
    PromptError,
    PromptTooLongError,
    UnknownAgentError,
)
from turnkeeper.sandbox import PROMPT, PROMPT_FILE, AgentCommand
from turnkeeper.sandbox.command import MAX_ARGUMENT_BYTES, prompt_refusal


def test_a_command_spec_places_the_prompt_only_in_its_own_element() -> None:
    spec = AgentSpec.from_payload(
        {
            "command": ["my-agent", "--task", "{prompt}", "x{prompt}", "{prompt_file}"],
            "format": "agui",
            "env": {"A": "1"},
        }
    )
    assert spec.argv("rm -rf / ; echo") == [
        "my-agent", "--task", "rm -rf / ; echo", "x{prompt}", "{prompt_file}",
    ]  # fmt: skip
    assert spec.start_command() == AgentCommand(
        ("my-agent", "--task", PROMPT, "x{prompt}", PROMPT_FILE), env={"A": "1"}
    )
    assert spec.env == {"A": "1"}
    assert not spec.can_continue
    with pytest.raises(AgentError) as caught:
        spec.continuation_command()
    assert caught.value.reason == "cannot-continue"
    assert AgentSpec.from_payload(spec.to_payload()) == spec
    on_stdin = AgentSpec.from_payload({"command": ["cat"], "format": "text", "prompt_stdin": True})
    assert on_stdin.start_command() == AgentCommand(("cat",), stdin_prompt=True)
    assert AgentSpec.from_payload(on_stdin.to_payload()) == on_stdin


def test_presets_resolve_to_their_commands() -> None:
    scripted = AgentSpec.from_payload({"preset": "scripted", "seed": 7, "turns": 3})
    assert scripted.format == "claude-code"
    argv = (
        sys.executable, "-m", "turnkeeper.agents.scripted", "--prompt", PROMPT,
        "--seed", "7", "--turns", "3", "--pace", "0.05",
    )  # fmt: skip
    package = str(Path(turnkeeper.__file__).resolve().parent)
    read_only = tuple(dict.fromkeys([sys.prefix, sys.base_prefix, package]))
    assert scripted.start_command() == AgentCommand(argv, read_only=read_only)
    assert scripted.argv("hi")[4] == "hi"
    assert scripted.continuation_command(start_turn=2).argv[-2:] == ("--start-turn", "2")
    assert scripted.to_payload() == {"preset": "scripted", "seed": 7, "turns": 3}
    assert AgentSpec.from_payload(scripted.to_payload()) == scripted

    # The CLI presets read the prompt on stdin: no argument of theirs is ever the prompt.
    # Their own permission prompts are off (nobody answers one in -p mode): the jail is
    # the boundary.
    claude = AgentSpec.from_payload("claude-code")
    flags = ("--output-format", "stream-json", "--verbose", "--include-partial-messages")
    flags += ("--permission-mode", "bypassPermissions")
    assert claude.start_command() == AgentCommand(
        ("claude", "-p", *flags), env=CLAUDE_CODE_ENV, stdin_prompt=True
    )
    assert claude.continuation_command(session_id="s-1") == AgentCommand(
        ("claude", "-p", "--resume", "s-1", *flags), env=CLAUDE_CODE_ENV, stdin_prompt=True
    )
    assert claude.to_payload() == {"preset": "claude-code"}
    with pytest.raises(AgentError) as caught:
        claude.continuation_command()
    assert caught.value.reason == "no-session-id"

    codex = AgentSpec.from_payload("codex")
    assert codex.format == "codex"
    outside = ("--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox")
    assert codex.start_command() == AgentCommand(
        ("codex", "exec", "--json", *outside, "-"), stdin_prompt=True
    )
    assert codex.continuation_command(session_id="th").argv == (
        "codex", "exec", "--json", *outside, "resume", "th", "-",
    )  # fmt: skip


def test_preset_options_narrow_what_the_agent_may_do() -> None:
    claude = AgentSpec.from_payload(
        {
            "preset": "claude-code",
            "permission_mode": "dontAsk",
            "allowed_tools": ["Bash(git *)", "Read"],
            "disallowed_tools": ["WebFetch"],
            "model": "sonnet",
            "env": {"IS_SANDBOX": "0"},
        }
    )
    assert claude.start_command().argv[-8:] == (
        "--permission-mode", "dontAsk", "--allowedTools", "Bash(git *),Read",
        "--disallowedTools", "WebFetch", "--model", "sonnet",
    )  # fmt: skip
    assert claude.env == {**CLAUDE_CODE_ENV, "IS_SANDBOX": "0"}
    assert AgentSpec.from_payload(claude.to_payload()) == claude
    codex = AgentSpec.from_payload(
        {"preset": "codex", "profile": "review", "base_url": "https://llm.internal/v1"}
    )
    assert codex.start_command().argv[5:-1] == (
        "--profile", "review", "-c", 'openai_base_url="https://llm.internal/v1"',
    )  # fmt: skip
    assert AgentSpec.from_payload(codex.to_payload()) == codex
    for bad in [
        {"preset": "claude-code", "permission_mode": "manual"},
        {"preset": "codex", "base_url": 'https://x" -c sandbox="off'},
        {"preset": "codex", "allowed_tools": ["Bash"]},
        {"preset": "claude-code", "model": "--dangerously-skip-permissions"},
        {"preset": "claude-code", "allowed_tools": ["--mcp-config=/x"]},
        {"preset": "codex", "profile": '--config=openai_base_url="http://elsewhere"'},
        {"preset": "codex", "model": "-c"},
    ]:
        with pytest.raises(AgentError) as caught:
            AgentSpec.from_payload(bad)
        assert caught.value.reason == "bad-spec"


@pytest.mark.parametrize(
    "name",
    ["LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "BASH_FUNC_x%%", "PYTHONSTARTUP",
     "PYTHONPATH", "PERL5OPT", "NODE_OPTIONS", "GIT_SSH_COMMAND", "GIT_CONFIG_COUNT",
     "GIT_CONFIG_PARAMETERS", "JAVA_TOOL_OPTIONS", "GLIBC_TUNABLES", "https_proxy", "NO_PROXY"],
)  # fmt: skip
def test_environment_names_that_run_code_are_refused(name: str) -> None:
    with pytest.raises(AgentError, match=f"env.*{name.replace('%', '')[:8]}") as caught:
        AgentSpec.from_payload({"command": ["x"], "format": "text", "env": {name: "v"}})
    assert caught.value.reason == "bad-spec"
    with pytest.raises(AgentError):  # a preset's env is checked the same way
        AgentSpec.from_payload({"preset": "claude-code", "env": {name: "v"}})


def test_ordinary_environment_names_pass() -> None:
    env = {"ANTHROPIC_API_KEY": "k", "PATH": "/opt/bin:/usr/bin", "_X1": "", "GIT_AUTHOR_NAME": "a"}
    spec = AgentSpec.from_payload({"command": ["x"], "format": "text", "env": env})
    assert spec.start_command().env == env


@pytest.mark.parametrize(
    ("payload", "error", "needle"),
    [
        ({"preset": "gpt-9"}, UnknownAgentError, "unknown agent preset 'gpt-9'"),
        ({"preset": "scripted", "turns": -1}, AgentError, "turns"),
        ({"preset": "codex", "seed": 1}, AgentError, "seed"),
        ({"command": [], "format": "text"}, AgentError, "command"),
        ({"command": ["x"], "format": "yaml"}, AgentError, "format"),
        ({"command": ["x"], "format": "text", "env": {"A=B": "1"}}, AgentError, "env"),
        ({"command": ["x"], "format": "text", "env": {"1A": "1"}}, AgentError, "env"),
        ({"command": ["x"], "format": "text", "env": {"A": "\x00"}}, AgentError, "NUL"),
        ({"command": ["x\x00"], "format": "text"}, AgentError, "NUL"),
        ({"command": ["x"], "format": "text", "surprise": 1}, AgentError, "surprise"),
    ],
)
def test_bad_specs_fail_with_a_clear_error(
    payload: dict[str, object], error: type[AgentError], needle: str
) -> None:
    with pytest.raises(error, match=needle) as caught:
        AgentSpec.from_payload(payload)
    assert type(caught.value) is error


def test_a_follow_up_resumes_the_agents_own_conversation_or_starts_anew() -> None:
    flags = ("--output-format", "stream-json", "--verbose", "--include-partial-messages")
    flags += ("--permission-mode", "bypassPermissions")
    claude = AgentSpec.from_payload("claude-code")
    # Each follow-up forks: the run's own id then names the conversation as it left it.
    assert claude.follow_up_command(session_id="s-1") == AgentCommand(
        ("claude", "-p", "--resume", "s-1", *flags, "--fork-session"),
        env=CLAUDE_CODE_ENV,
        stdin_prompt=True,
    )
    # No id reported (or one unsafe to pass back): a new conversation, as a first run.
    for unusable in (None, "--dangerously-skip-permissions", "a b", "../x", "", "x" * 201):
        assert claude.follow_up_command(session_id=unusable) == claude.start_command()
    codex = AgentSpec.from_payload("codex")
    assert codex.follow_up_command(session_id="th").argv == (
        "codex", "exec", "--json", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox", "resume", "th", "-",
    )  # fmt: skip
    scripted = AgentSpec.from_payload("scripted")
    assert scripted.recalls_transcript
    assert scripted.follow_up_command(session_id="s-1") == scripted.start_command()
    template = ["agent", "--resume", "{session_id}"]
    declared = {"command": ["agent"], "format": "text", "continue": template}
    assert AgentSpec.from_payload(declared).follow_up_command(session_id="c1").argv == (
        "agent", "--resume", "c1",
    )  # fmt: skip
    for plain in (True, False):  # no template: a new process each run
        spec = AgentSpec.from_payload({"command": ["agent"], "format": "text", "continue": plain})
        assert spec.follow_up_command(session_id="c1") == spec.start_command()
    with pytest.raises(AgentError) as caught:
        claude.continuation_command(session_id="-rf")
    assert caught.value.reason == "unsafe-session-id"


@pytest.mark.parametrize(
    ("value", "safe"),
    [("0f9c-1b2a", True), ("thread_01:abc.def", True), ("-x", False), ("a/b", False),
     ("a\nb", False), ("", False), (7, False), ("é", False)],
)  # fmt: skip
def test_safe_session_id(value: object, safe: bool) -> None:
    assert (safe_session_id(value) == value) is safe


def test_a_branch_is_refused_where_the_agent_cannot_fork_there() -> None:
    claude = AgentSpec.from_payload("claude-code")
    codex = AgentSpec.from_payload("codex")
    forgetful = AgentSpec.from_payload({"command": ["agent"], "format": "text"})
    for spec in (AgentSpec.from_payload("scripted"), forgetful):
        assert spec.branch_refusal(at_run_end=False, at_leaf=False) is None
    assert claude.branch_refusal(at_run_end=True, at_leaf=False) is None
    assert "where an earlier run ended" in str(
        claude.branch_refusal(at_run_end=False, at_leaf=False)
    )
    assert "cannot fork" in str(codex.branch_refusal(at_run_end=True, at_leaf=False))
    assert codex.branch_refusal(at_run_end=True, at_leaf=True) is None, "no branch at all"


def _refused(spec: AgentSpec, prompt: str) -> tuple[type[Exception], str | None, dict[str, Any]]:
    with pytest.raises(PromptError) as caught:
        spec.check_prompt(prompt)
    return type(caught.value), caught.value.reason, caught.value.fields


def test_a_prompt_is_measured_in_the_utf8_bytes_the_agent_receives() -> None:
    """Admission's check is spawn's decision (``prompt_refusal``): the argument limit
    counts UTF-8 bytes, not characters, and holds wherever ``{prompt}`` is an argument
    (the scripted preset's first process and its continuation, or a command's
    continuation alone); a prompt on stdin or in its file has none."""
    scripted = AgentSpec.from_payload("scripted")
    assert scripted.prompt_as_argument
    scripted.check_prompt("x" * MAX_ARGUMENT_BYTES)  # exactly at the limit
    over = ("x" * (MAX_ARGUMENT_BYTES + 1), "ü" * (MAX_ARGUMENT_BYTES // 2 + 1))
    assert len(over[1]) < MAX_ARGUMENT_BYTES < len(over[1].encode())  # fewer characters
    for prompt in over:
        size = len(prompt.encode())
        assert _refused(scripted, prompt) == (
            PromptTooLongError,
            "prompt-too-long",
            {"prompt_bytes": size, "limit_bytes": MAX_ARGUMENT_BYTES},
        )
        assert prompt_refusal(prompt.encode(), as_argument=True) is not None
    scripted.check_prompt("ü" * (MAX_ARGUMENT_BYTES // 2) + "x")  # 131071 bytes
    assert _refused(scripted, "a\x00b")[:2] == (PromptError, "bad-prompt")
    assert _refused(scripted, "a\ud800")[:2] == (PromptError, "bad-prompt")
    # The message says what the agent takes and how many bytes the prompt is.
    with pytest.raises(PromptTooLongError) as caught:
        scripted.check_prompt(over[1])
    assert caught.value.message == (
        f"the prompt is {MAX_ARGUMENT_BYTES + 1} bytes (UTF-8), and the agent takes it as "
        f"one command-line argument, at most {MAX_ARGUMENT_BYTES} bytes: shorten it, or give "
        "the agent {prompt_file} or its standard input instead"
    )
    continued = AgentSpec.from_payload(
        {"command": ["agent"], "format": "text", "continue": ["agent", "--task", PROMPT]}
    )
    assert _refused(continued, over[0])[1] == "prompt-too-long"
    mebibyte = "x" * (1024 * 1024)
    for payload in (
        "claude-code",  # stdin
        "codex",
        {"command": ["agent", PROMPT_FILE], "format": "text"},
        {"command": ["agent"], "format": "text", "prompt_stdin": True},
        {"command": ["agent", "x{prompt}"], "format": "text"},  # not the whole element
    ):
        spec = AgentSpec.from_payload(payload)
        assert not spec.prompt_as_argument, payload
        spec.check_prompt(mebibyte + "\x00")
        assert prompt_refusal((mebibyte + "\x00").encode(), as_argument=False) is None


@pytest.mark.parametrize("prompt", ["", " ", "\n\t ", "\u3000"])
def test_an_empty_prompt_is_refused_at_the_edges(prompt: str) -> None:
    with pytest.raises(EmptyPromptError) as caught:
        require_prompt(prompt)
    assert (caught.value.reason, caught.value.message) == (
        "empty-prompt",
        "the prompt is empty: give the agent the input of its turn",
    )
    assert require_prompt(" x ") == " x "


def test_an_env_value_no_exec_can_pass_is_refused_before_a_run_exists() -> None:
    """The spawn's own limit (``check_command``), applied when the spec is read: a run
    is never admitted only to fail with ``env-too-long``."""
    fits = "v" * (MAX_ARGUMENT_BYTES - len("BIG="))
    assert AgentSpec.from_payload({"preset": "scripted", "env": {"BIG": fits}}).env == {"BIG": fits}
    with pytest.raises(AgentError) as caught:
        AgentSpec.from_payload({"preset": "scripted", "env": {"BIG": fits + "v"}})
    assert "the environment variable BIG is 131072 bytes as NAME=value" in str(caught.value)
