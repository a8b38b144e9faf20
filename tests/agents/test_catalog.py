"""The agent catalog: names over HTTP, inline specs only with leave, limits only tightened."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnkeeper.agents.catalog import Catalog, at_least_as_strong
from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError, InvalidInputError, NotPermittedError, UnknownAgentError

AGENTS = """
[agents.reviewer]
preset = "claude-code"
args = ["--model", "sonnet"]
env_from = ["ANTHROPIC_API_KEY"]
env = { REVIEW_MODE = "strict" }
request_env = ["EXTRA"]
provider = "bwrap"
timeout = 900
max_attempts = 3

[agents.keyed]
preset = "codex"
env_from = ["OPENAI_API_KEY"]

[agents.lint]
command = ["ruff", "check", "."]
format = "text"

[agents.filed]
preset = "claude-code"
env_files = { ANTHROPIC_API_KEY = "/etc/turnkeeper/anthropic.key" }
"""


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    path = tmp_path / "agents.toml"
    path.write_text(AGENTS)
    return Catalog.load(Settings(agents_file=path, run_timeout=3600, max_attempts=5))


def test_names_resolve_to_specs_with_the_catalogs_limits(catalog: Catalog) -> None:
    assert catalog.names == [
        "claude-code",
        "codex",
        "filed",
        "keyed",
        "lint",
        "reviewer",
        "scripted",
    ]
    reviewer = catalog.admit("reviewer", allow_commands=False, env={"EXTRA": "1"})
    assert reviewer.agent == {
        "preset": "claude-code",
        "args": ["--model", "sonnet"],
        "env_from": ["ANTHROPIC_API_KEY"],
    }
    assert reviewer.env == {"REVIEW_MODE": "strict", "EXTRA": "1"}
    assert (reviewer.provider, reviewer.timeout, reviewer.max_attempts) == ("bwrap", 900, 3)
    lint = catalog.admit("lint", allow_commands=False)
    assert lint.agent["command"] == ["ruff", "check", "."]
    assert (lint.provider, lint.timeout, lint.max_attempts) == (None, 3600, 5)
    tight = catalog.admit(
        "reviewer", allow_commands=False, provider="bwrap", timeout=10.5, max_attempts=1
    )
    assert (tight.provider, tight.timeout, tight.max_attempts) == ("bwrap", 10.5, 1)
    assert catalog.admit("scripted", allow_commands=False, provider="bwrap").provider == "bwrap"


@pytest.mark.parametrize(
    ("agent", "options", "error", "reason"),
    [
        ("nope", {}, UnknownAgentError, "unknown-agent"),
        ({"command": ["sh"], "format": "text"}, {}, NotPermittedError, "inline-agent"),
        ({"preset": "scripted", "turns": 1}, {}, NotPermittedError, "inline-agent"),
        ("reviewer", {"provider": "local"}, NotPermittedError, "provider-downgrade"),
        ("reviewer", {"provider": "ssh"}, NotPermittedError, "provider-downgrade"),
        ("reviewer", {"timeout": 901}, InvalidInputError, "timeout-out-of-range"),
        ("lint", {"timeout": 3601}, InvalidInputError, "timeout-out-of-range"),
        ("lint", {"timeout": float("inf")}, InvalidInputError, "timeout-out-of-range"),
        ("reviewer", {"max_attempts": 4}, InvalidInputError, "attempts-out-of-range"),
        ("lint", {"max_attempts": 6}, InvalidInputError, "attempts-out-of-range"),
        ("reviewer", {"env": {"REVIEW_MODE": "lax"}}, NotPermittedError, "env-fixed"),
        ("reviewer", {"env": {"ANTHROPIC_API_KEY": "x"}}, NotPermittedError, "env-fixed"),
        # Beside the operator's key, a request's env could send that key elsewhere.
        (
            "reviewer",
            {"env": {"ANTHROPIC_BASE_URL": "http://x"}},
            NotPermittedError,
            "env-not-listed",
        ),
        ("keyed", {"env": {"OPENAI_BASE_URL": "http://x"}}, NotPermittedError, "env-not-listed"),
        ("keyed", {"env": {"PATH": "/tmp"}}, NotPermittedError, "env-not-listed"),
        # A file's key is the operator's as much as a worker variable's.
        ("filed", {"env": {"ANTHROPIC_API_KEY": "x"}}, NotPermittedError, "env-fixed"),
        ("filed", {"env": {"ANTHROPIC_BASE_URL": "http://x"}}, NotPermittedError, "env-not-listed"),
    ],
)
def test_what_would_loosen_is_refused(
    catalog: Catalog,
    agent: object,
    options: dict[str, object],
    error: type[Exception],
    reason: str,
) -> None:
    with pytest.raises(error) as caught:
        catalog.admit(agent, allow_commands=False, **options)  # type: ignore[arg-type]
    assert getattr(caught.value, "reason", None) == reason


def test_inline_specs_with_leave_but_never_worker_variables(catalog: Catalog) -> None:
    spec = {"command": ["sh", "-c", "echo $A"], "format": "text", "env": {"A": "1"}}
    admitted = catalog.admit(spec, allow_commands=True, env={"A": "2"})
    assert admitted.agent["env"] == {"A": "1"}  # the client merges (and seals) both
    assert admitted.env == {"A": "2"}
    with pytest.raises(NotPermittedError) as caught:
        catalog.admit({**spec, "env_from": ["HOME"]}, allow_commands=True)
    assert caught.value.reason == "env-from"


def test_env_files_names_the_files_and_never_holds_their_values(catalog: Catalog) -> None:
    """The payload (what Postgres keeps) holds the variable's name and its file's path;
    the worker reads the value as it builds the sandbox."""
    filed = catalog.admit("filed", allow_commands=False)
    assert filed.agent == {
        "preset": "claude-code",
        "env_files": {"ANTHROPIC_API_KEY": "/etc/turnkeeper/anthropic.key"},
    }
    assert filed.env == {}
    assert catalog.agents["filed"].request_env == frozenset()
    assert catalog.agents["filed"].operator
    assert not catalog.agents["claude-code"].operator


def test_inline_specs_never_name_worker_files(catalog: Catalog) -> None:
    for spec in (
        {"command": ["cat"], "format": "text", "env_files": {"K": "/etc/shadow"}},
        {"preset": "claude-code", "env_files": {"ANTHROPIC_API_KEY": "/etc/shadow"}},
    ):
        with pytest.raises(NotPermittedError) as caught:
            catalog.admit(spec, allow_commands=True)
        assert caught.value.reason == "env-files"
        assert "only the operator's catalog may set it" in caught.value.message


def test_provider_strength() -> None:
    assert at_least_as_strong("bwrap", "local")
    assert at_least_as_strong("local", "local")
    assert not at_least_as_strong("local", "bwrap")
    assert not at_least_as_strong("ssh", "bwrap")
    assert not at_least_as_strong("bwrap", "ssh")
    assert not at_least_as_strong("local", "ssh")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[agents.x]\ncommand = []\nformat = 'text'", "must not be empty"),
        ("[agents.x]\ncommand = ['a']\nformat = 'yaml'", "format"),
        ("[agents.x]\npreset = 'scripted'\nprovider = 'docker'", "provider is one of"),
        ("[agents.x]\npreset = 'scripted'\ntimeout = -1", "timeout is a positive"),
        ("[agents.x]\npreset = 'scripted'\nmax_attempts = 0", "max_attempts is an integer"),
        ("[agents.x]\npreset = 'scripted'\nenv_from = ['TURNKEEPER_SECRET']", "env_from cannot"),
        ("[agents.x]\npreset = 'scripted'\nenv = { A = 1 }", "env maps names to strings"),
        ("[agents.x]\npreset = 'scripted'\nenv_files = ['/k']", "env_files maps env names"),
        ("[agents.x]\npreset = 'scripted'\nenv_files = { K = 1 }", "env_files maps env names"),
        ("[agents.x]\npreset = 'scripted'\nenv_files = { K = 'k' }", "must be an absolute path"),
        ("[agents.x]\npreset = 'scripted'\nenv_files = { LD_PRELOAD = '/k' }", "LD_PRELOAD"),
        (
            "[agents.x]\npreset = 'scripted'\nenv_files = { TURNKEEPER_SECRET = '/k' }",
            "cannot set the variable",
        ),
        (
            "[agents.x]\npreset = 'scripted'\nenv_from = ['K']\nenv_files = { K = '/k' }",
            "named by both env_from and env_files",
        ),
        ("[agents.x]\npreset = 'scripted'\nrequest_env = 'A'", "request_env is a list"),
        ("[agents.x]\npreset = 'scripted'\nrequest_env = ['LD_PRELOAD']", "LD_PRELOAD"),
        ("[agents.'a b']\npreset = 'scripted'", "a name is 1 to 64 ASCII letters"),
        ("[agents.'é']\npreset = 'scripted'", "a name is 1 to 64 ASCII letters"),
        ("[tools.x]\npreset = 'scripted'", "only [agents.NAME] tables"),
        ("[agents.x\n", "not TOML"),
    ],
)
def test_a_bad_agents_file_is_a_one_line_config_error(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        Catalog.load(Settings(agents_file=path))
    assert caught.value.message.startswith(f"TURNKEEPER_AGENTS_FILE ({path}): ")
    assert problem in caught.value.message
    assert "\n" not in caught.value.message
