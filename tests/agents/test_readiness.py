"""The checks up front: each agent's CLI where its jail finds it, its model host allowed,
its key set; each problem one line that says what to set. Real files: a fake ``claude``
script, key files, an agents file."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from turnkeeper.agents.readiness import Readiness, check_agents, log_readiness
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.agents.worker_env import read_env_file, worker_values
from turnkeeper.config import Settings
from turnkeeper.errors import AgentError

INSTALL_HINT = (
    "install it (npm install -g @anthropic-ai/claude-code), or add its directory to "
    "TURNKEEPER_SANDBOX_RO_BINDS and to PATH in the agent's env"
)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A directory holding a fake ``claude``, as ``npm install -g`` would put one."""
    directory = tmp_path / "bin"
    directory.mkdir()
    claude = directory / "claude"
    claude.write_text("#!/bin/sh\necho fake claude\n")
    claude.chmod(0o755)
    return directory


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "anthropic.key"
    path.write_text("sk-test-key\n")
    return path


def check(
    tmp_path: Path, body: str, *, environ: dict[str, str] | None = None, **settings: object
) -> dict[str, Readiness]:
    """The reports of an agents file holding ``[agents.a]`` with ``body``."""
    agents = tmp_path / "agents.toml"
    agents.write_text(f"[agents.a]\n{body}\n")
    options = {"sandbox_provider": "bwrap", "data_dir": tmp_path / "data", **settings}
    config = Settings(agents_file=agents, **options)  # type: ignore[arg-type]
    return {r.agent: r for r in check_agents(config, environ or {"PATH": "/nonexistent"})}


def claude_agent(bin_dir: Path, key: str, env: str = "") -> str:
    path = f'PATH = "{bin_dir}:/usr/bin:/bin"'
    return f'preset = "claude-code"\nenv = {{ {path}{env} }}\n{key}'


def test_all_ok_is_one_line_of_what_was_found(
    tmp_path: Path, bin_dir: Path, key_file: Path
) -> None:
    body = claude_agent(bin_dir, f'env_files = {{ ANTHROPIC_API_KEY = "{key_file}" }}')
    report = check(tmp_path, body, sandbox_ro_binds=str(bin_dir))["a"]
    assert report == Readiness(
        "a",
        problems=(),
        found=f"{bin_dir}/claude; api.anthropic.com:443 allowed; ANTHROPIC_API_KEY from {key_file}",
    )


def test_a_cli_missing_says_how_to_install_it(tmp_path: Path, bin_dir: Path) -> None:
    (bin_dir / "claude").unlink()
    body = claude_agent(bin_dir, 'env_from = ["ANTHROPIC_API_KEY"]')
    report = check(tmp_path, body, environ={"PATH": "/nonexistent", "ANTHROPIC_API_KEY": "k"})
    assert report["a"].problems == (
        f"the jail finds no claude on its PATH ({bin_dir}:/usr/bin:/bin): {INSTALL_HINT}",
    )


def test_a_cli_the_jail_does_not_see_says_what_to_bind(tmp_path: Path, bin_dir: Path) -> None:
    body = claude_agent(bin_dir, 'env_from = ["ANTHROPIC_API_KEY"]')
    report = check(tmp_path, body, environ={"PATH": "/nonexistent", "ANTHROPIC_API_KEY": "k"})
    assert report["a"].problems == (
        (
            f"the jail finds no claude on its PATH ({bin_dir}:/usr/bin:/bin); this host has it "
            f"at {bin_dir}/claude: add {bin_dir} to TURNKEEPER_SANDBOX_RO_BINDS"
        ),
    )
    # Under `local` the agent is a host process: it sees everything, egress is not asked.
    local = check(tmp_path, body, environ={"ANTHROPIC_API_KEY": "k"}, sandbox_provider="local")["a"]
    assert local.problems == ()
    assert local.found == (
        f"{bin_dir}/claude; api.anthropic.com:443 (egress not checked: the local provider "
        "has no proxy); ANTHROPIC_API_KEY from the worker's environment"
    )


def test_a_cli_off_the_agents_path_says_to_put_it_there(tmp_path: Path, bin_dir: Path) -> None:
    body = 'preset = "claude-code"\nenv_from = ["ANTHROPIC_API_KEY"]'
    environ = {"PATH": f"/nonexistent:{bin_dir}", "ANTHROPIC_API_KEY": "k"}
    report = check(tmp_path, body, environ=environ, sandbox_ro_binds=str(bin_dir))
    assert report["a"].problems == (
        (
            "the jail finds no claude on its PATH (/usr/local/bin:/usr/bin:/bin); this host has "
            f"it at {bin_dir}/claude: add {bin_dir} to PATH in the agent's env"
        ),
    )


def test_an_interpreter_the_jail_lacks_is_named(tmp_path: Path, bin_dir: Path) -> None:
    (bin_dir / "claude").write_text("#!/usr/bin/env tk-no-such-node\n")
    body = claude_agent(bin_dir, 'env_from = ["ANTHROPIC_API_KEY"]')
    environ = {"PATH": "/nonexistent", "ANTHROPIC_API_KEY": "k"}
    report = check(tmp_path, body, environ=environ, sandbox_ro_binds=str(bin_dir))
    assert report["a"].problems == (
        (
            f"claude ({bin_dir}/claude) runs tk-no-such-node (its #! line), but the jail finds "
            f"no tk-no-such-node on its PATH ({bin_dir}:/usr/bin:/bin): install it there, or "
            "add its directory to TURNKEEPER_SANDBOX_RO_BINDS and to PATH in the agent's env"
        ),
    )


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        (
            "",
            (
                "TURNKEEPER_SANDBOX_EGRESS does not allow api.anthropic.com:443, the model API's "
                "host (the default): add it"
            ),
        ),
        (
            ', ANTHROPIC_BASE_URL = "https://llm.example.com:8443/anthropic"',
            (
                "TURNKEEPER_SANDBOX_EGRESS does not allow llm.example.com:8443, the model API's "
                "host (ANTHROPIC_BASE_URL): add it"
            ),
        ),
    ],
)
def test_a_model_host_not_in_egress_says_to_add_it(
    tmp_path: Path, bin_dir: Path, key_file: Path, env: str, problem: str
) -> None:
    agent = claude_agent(bin_dir, f'env_files = {{ ANTHROPIC_API_KEY = "{key_file}" }}', env)
    report = check(
        tmp_path, agent, sandbox_ro_binds=str(bin_dir), sandbox_egress="api.openai.com:443"
    )
    assert report["a"].problems == (problem,)


def test_codex_takes_its_host_from_its_base_url_option(tmp_path: Path) -> None:
    codex = tmp_path / "bin" / "codex"
    codex.parent.mkdir()
    codex.write_text("#!/bin/sh\n")
    codex.chmod(0o755)
    body = (
        f'preset = "codex"\nbase_url = "https://llm.example.com/v1"\n'
        f'env = {{ PATH = "{codex.parent}:/usr/bin:/bin" }}\nrequest_env = ["CODEX_API_KEY"]'
    )
    report = check(tmp_path, body, sandbox_ro_binds=str(codex.parent))["a"]
    assert report.problems == (
        (
            "TURNKEEPER_SANDBOX_EGRESS does not allow llm.example.com:443, the model API's host "
            "(its base_url option): add it"
        ),
    )
    allowed = check(
        tmp_path,
        body,
        sandbox_ro_binds=str(codex.parent),
        sandbox_egress="llm.example.com:443",
    )["a"]
    assert allowed.found == f"{codex}; llm.example.com:443 allowed; CODEX_API_KEY from each request"


def test_a_key_missing_says_where_to_set_it(tmp_path: Path, bin_dir: Path) -> None:
    report = check(tmp_path, claude_agent(bin_dir, ""), sandbox_ro_binds=str(bin_dir))
    assert report["a"].problems == (
        (
            'no ANTHROPIC_API_KEY for it: add env_from = ["ANTHROPIC_API_KEY"] (and set '
            "ANTHROPIC_API_KEY on every worker) or env_files = { ANTHROPIC_API_KEY = "
            '"/path/to/key" } to its entry in TURNKEEPER_AGENTS_FILE'
        ),
    )


def test_a_worker_variable_missing_says_to_set_it(tmp_path: Path, bin_dir: Path) -> None:
    body = claude_agent(bin_dir, 'env_from = ["ANTHROPIC_API_KEY"]')
    report = check(tmp_path, body, sandbox_ro_binds=str(bin_dir))
    assert report["a"].problems == (
        (
            "ANTHROPIC_API_KEY, which env_from passes, is not in the worker's environment: "
            "set it on every worker"
        ),
    )


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda path: None, "No such file or directory"),
        (lambda path: path.mkdir(), "Is a directory"),
        (lambda path: path.write_text("\n"), "it is empty"),
    ],
)
def test_a_key_file_unreadable_names_the_file(
    tmp_path: Path, bin_dir: Path, make: object, why: str
) -> None:
    path = tmp_path / "anthropic.key"
    make(path)  # type: ignore[operator]
    body = claude_agent(bin_dir, f'env_files = {{ ANTHROPIC_API_KEY = "{path}" }}')
    report = check(tmp_path, body, sandbox_ro_binds=str(bin_dir))
    assert report["a"].problems == (
        (
            f"cannot read {path}, the file env_files names for ANTHROPIC_API_KEY: {why}; "
            "put the value there, readable by the worker's user"
        ),
    )


def test_presets_nobody_set_up_are_reported_never_failed(tmp_path: Path) -> None:
    """A fresh machine: no CLI where the jail looks, no agents file."""
    config = Settings(sandbox_provider="bwrap", data_dir=tmp_path / "data")
    reports = {r.agent: r for r in check_agents(config, {"PATH": "/nonexistent"})}
    assert sorted(reports) == ["claude-code", "codex", "scripted"]
    assert all(not r.problems for r in reports.values())
    assert reports["scripted"].configured
    for name, program in (("claude-code", "claude"), ("codex", "codex")):
        report = reports[name]
        assert not report.configured
        assert report.found.startswith(f"not set up: the jail finds no {program} on its PATH")


def test_a_bad_agents_file_is_one_problem_and_the_presets_are_still_checked(
    tmp_path: Path,
) -> None:
    agents = tmp_path / "agents.toml"
    agents.write_text("[agents.a\n")
    config = Settings(agents_file=agents, data_dir=tmp_path / "data")
    reports = check_agents(config, {"PATH": "/nonexistent"})
    assert [r.agent for r in reports] == ["catalog", "claude-code", "codex", "scripted"]
    assert reports[0].problems[0].startswith(f"TURNKEEPER_AGENTS_FILE ({agents}): not TOML")


def test_a_worker_logs_each_problem_as_a_warning(tmp_path: Path, bin_dir: Path) -> None:
    agents = tmp_path / "agents.toml"
    missing = tmp_path / "missing.key"
    agents.write_text(
        f'[agents.a]\npreset = "claude-code"\nenv_files = {{ ANTHROPIC_API_KEY = "{missing}" }}'
        f'\nenv = {{ PATH = "{bin_dir}" }}\n'
    )
    config = Settings(agents_file=agents, sandbox_egress="", data_dir=tmp_path / "data")
    with structlog.testing.capture_logs() as logs:
        log_readiness(config)
    warnings = [(e["agent"], e["problem"]) for e in logs if e["log_level"] == "warning"]
    assert [agent for agent, _ in warnings] == ["a", "a", "a"]
    assert warnings[0][1].startswith("the jail finds no claude on its PATH")
    assert warnings[1][1].startswith(f"cannot read {missing}")
    assert warnings[2][1].startswith("TURNKEEPER_SANDBOX_EGRESS does not allow")


def test_a_key_file_is_read_without_its_trailing_newline(key_file: Path) -> None:
    assert read_env_file("ANTHROPIC_API_KEY", str(key_file)) == "sk-test-key"
    spec = AgentSpec.from_payload(
        {
            "preset": "claude-code",
            "env_from": ["TK_TEST_PASSED"],
            "env_files": {"ANTHROPIC_API_KEY": str(key_file)},
        }
    )
    values = worker_values(spec, {"TK_TEST_PASSED": "v"})
    assert values == {"TK_TEST_PASSED": "v", "ANTHROPIC_API_KEY": "sk-test-key"}
    with pytest.raises(AgentError) as caught:
        worker_values(spec, {}, run_id="r")
    assert (caught.value.reason, caught.value.run_id) == ("missing-env", "r")
    key_file.chmod(0o644)
    key_file.write_bytes(b"x" * (64 * 1024 + 1))
    with pytest.raises(AgentError) as caught:
        worker_values(spec, {"TK_TEST_PASSED": "v"}, run_id="r")
    assert caught.value.reason == "env-file"
    assert caught.value.message == (
        f"cannot read {key_file}, the file env_files names for ANTHROPIC_API_KEY: "
        "longer than 64 KiB"
    )
