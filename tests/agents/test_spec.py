"""Agent specs: commands, presets, prompt placement, continuation, clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import turnkeeper
from turnkeeper.agents.spec import AgentSpec, safe_session_id
from turnkeeper.errors import AgentError, UnknownAgentError
from turnkeeper.sandbox import PROMPT, PROMPT_FILE, AgentCommand


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
    claude = AgentSpec.from_payload("claude-code")
    flags = ("--output-format", "stream-json", "--verbose", "--include-partial-messages")
    assert claude.start_command() == AgentCommand(("claude", "-p", *flags), stdin_prompt=True)
    assert claude.continuation_command(session_id="s-1") == AgentCommand(
        ("claude", "-p", "--resume", "s-1", *flags), stdin_prompt=True
    )
    with pytest.raises(AgentError) as caught:
        claude.continuation_command()
    assert caught.value.reason == "no-session-id"

    codex = AgentSpec.from_payload({"preset": "codex", "args": ["--skip-git-repo-check"]})
    assert codex.format == "codex"
    assert codex.start_command() == AgentCommand(
        ("codex", "exec", "--json", "--skip-git-repo-check", "-"), stdin_prompt=True
    )
    assert codex.continuation_command(session_id="th").argv == (
        "codex", "exec", "--json", "--skip-git-repo-check", "resume", "th", "-",
    )  # fmt: skip


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
    claude = AgentSpec.from_payload("claude-code")
    # Each follow-up forks: the run's own id then names the conversation as it left it.
    assert claude.follow_up_command(session_id="s-1") == AgentCommand(
        ("claude", "-p", "--resume", "s-1", *flags, "--fork-session"), stdin_prompt=True
    )
    # No id reported (or one unsafe to pass back): a new conversation, as a first run.
    for unusable in (None, "--dangerously-skip-permissions", "a b", "../x", "", "x" * 201):
        assert claude.follow_up_command(session_id=unusable) == claude.start_command()
    codex = AgentSpec.from_payload("codex")
    assert codex.follow_up_command(session_id="th").argv == (
        "codex", "exec", "--json", "resume", "th", "-",
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
