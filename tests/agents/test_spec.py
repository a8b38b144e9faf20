"""Agent specs: commands, presets, prompt placement, continuation, clear errors."""

from __future__ import annotations

import sys

import pytest

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.errors import AgentError, UnknownAgentError


def test_a_command_spec_places_the_prompt_only_in_its_own_element() -> None:
    spec = AgentSpec.from_payload(
        {
            "command": ["my-agent", "--task", "{prompt}", "x{prompt}"],
            "format": "agui",
            "env": {"A": "1"},
        }
    )
    assert spec.argv("rm -rf / ; echo") == ["my-agent", "--task", "rm -rf / ; echo", "x{prompt}"]
    assert spec.env == {"A": "1"}
    assert not spec.can_continue
    with pytest.raises(AgentError) as caught:
        spec.continuation_argv("p")
    assert caught.value.reason == "cannot-continue"
    assert AgentSpec.from_payload(spec.to_payload()) == spec


def test_presets_resolve_to_their_commands() -> None:
    scripted = AgentSpec.from_payload({"preset": "scripted", "seed": 7, "turns": 3})
    assert scripted.format == "claude-code"
    assert scripted.argv("hi") == [
        sys.executable,
        "-m",
        "turnkeeper.agents.scripted",
        "--prompt",
        "hi",
        "--seed",
        "7",
        "--turns",
        "3",
        "--pace",
        "0.05",
    ]
    assert scripted.continuation_argv("go on", start_turn=2)[-2:] == ["--start-turn", "2"]
    assert scripted.to_payload() == {"preset": "scripted", "seed": 7, "turns": 3}
    assert AgentSpec.from_payload(scripted.to_payload()) == scripted

    claude = AgentSpec.from_payload("claude-code")
    assert claude.argv("fix it") == [
        "claude",
        "-p",
        "fix it",
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
    ]
    assert claude.continuation_argv("go on", session_id="s-1")[:5] == [
        "claude",
        "-p",
        "go on",
        "--resume",
        "s-1",
    ]
    with pytest.raises(AgentError) as caught:
        claude.continuation_argv("go on")
    assert caught.value.reason == "no-session-id"

    codex = AgentSpec.from_payload({"preset": "codex", "args": ["--skip-git-repo-check"]})
    assert codex.format == "codex"
    assert codex.argv("p") == ["codex", "exec", "--json", "--skip-git-repo-check", "p"]
    assert codex.continuation_argv("q", session_id="th") == [
        "codex",
        "exec",
        "--json",
        "--skip-git-repo-check",
        "resume",
        "th",
        "q",
    ]


@pytest.mark.parametrize(
    ("payload", "error", "needle"),
    [
        ({"preset": "gpt-9"}, UnknownAgentError, "unknown agent preset 'gpt-9'"),
        ({"preset": "scripted", "turns": -1}, AgentError, "turns"),
        ({"preset": "codex", "seed": 1}, AgentError, "seed"),
        ({"command": [], "format": "text"}, AgentError, "command"),
        ({"command": ["x"], "format": "yaml"}, AgentError, "format"),
        ({"command": ["x"], "format": "text", "env": {"A=B": "1"}}, AgentError, "env"),
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
