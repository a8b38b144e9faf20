"""The `turnkeeper` command as a user runs it: a real process, its output and exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from turnkeeper.store import migration

TURNKEEPER = [sys.executable, "-m", "turnkeeper"]


def run(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TURNKEEPER, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def service_lines(stdout: str) -> list[list[str]]:
    """The mark and name of each of doctor's lines about a service (not an agent)."""
    lines = [line.split()[:2] for line in stdout.splitlines()]
    return [line for line in lines if line[1] != "agent"]


def service_env(database_url: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(
        TURNKEEPER_DATABASE_URL=database_url,
        TURNKEEPER_REDIS_URL=redis_url,
        TURNKEEPER_DATA_DIR=str(tmp_path / "data"),
    )
    return env


@pytest.fixture
def empty_database_url(admin_database_url: str) -> Iterator[str]:
    name = f"tk_empty_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_help_lists_the_commands(tmp_path: Path) -> None:
    result = run(["--help"], service_env("postgresql://x@h/d", "redis://h", tmp_path))
    assert result.returncode == 0
    for command in ("doctor", "dev", "demo", "db"):
        assert command in result.stdout


def test_doctor_passes_on_a_migrated_database(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    result = run(["doctor"], service_env(database_url, redis_url, tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert service_lines(result.stdout) == [
        ["ok", "database"],
        ["ok", "redis"],
        ["ok", "broker"],
    ]
    assert f"schema at head ({migration.head_revision()})" in lines[0]


def test_doctor_fails_on_an_unmigrated_database_and_db_upgrade_fixes_it(
    empty_database_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = service_env(empty_database_url, redis_url, tmp_path)
    before = run(["doctor"], env)
    assert before.returncode == 1
    assert before.stdout.splitlines()[0].split()[:2] == ["FAIL", "database"]
    assert "turnkeeper db upgrade" in before.stdout

    current = run(["db", "current"], env)
    assert current.returncode == 0
    assert current.stdout.startswith("current none")

    upgraded = run(["db", "upgrade"], env)
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.strip() == f"database at revision {migration.head_revision()}"
    assert run(["doctor"], env).returncode == 0


def test_doctor_reports_unreachable_servers_one_line_each(tmp_path: Path) -> None:
    env = service_env("postgresql://postgres@127.0.0.1:1/x", "redis://127.0.0.1:1/0", tmp_path)
    result = run(["doctor"], env)
    assert result.returncode == 1
    assert service_lines(result.stdout) == [
        ["FAIL", "database"],
        ["FAIL", "redis"],
        ["FAIL", "broker"],
    ]
    assert "Traceback" not in result.stderr


def test_doctor_checks_each_agent_one_line_per_problem(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """A fake ``claude`` the jail finds through the agent's PATH, a key file; then what
    an operator gets wrong: a host the egress does not allow, a key file not there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    claude = bin_dir / "claude"
    claude.write_text("#!/bin/sh\nexit 0\n")
    claude.chmod(0o755)
    key = tmp_path / "anthropic.key"
    key.write_text("sk-test-not-a-key\n")
    missing = tmp_path / "missing.key"
    path = f'PATH = "{bin_dir}:/usr/bin:/bin"'
    agents = tmp_path / "agents.toml"
    agents.write_text(
        f"""
[agents.ready]
preset = "claude-code"
env = {{ {path} }}
env_files = {{ ANTHROPIC_API_KEY = "{key}" }}

[agents.broken]
preset = "claude-code"
env = {{ {path}, ANTHROPIC_BASE_URL = "https://llm.example.com" }}
env_files = {{ ANTHROPIC_API_KEY = "{missing}" }}
"""
    )
    env = service_env(database_url, redis_url, tmp_path)
    env.update(
        TURNKEEPER_AGENTS_FILE=str(agents),
        TURNKEEPER_SANDBOX_RO_BINDS=str(bin_dir),
        TURNKEEPER_SANDBOX_PROVIDER="bwrap",
    )
    result = run(["doctor"], env)
    assert result.returncode == 1, result.stdout
    lines = result.stdout.splitlines()
    found = f"{claude}; api.anthropic.com:443 allowed; ANTHROPIC_API_KEY from {key}"
    assert f"ok   agent     ready  {found}" in lines
    assert [line for line in lines if " broken " in line] == [
        (
            f"FAIL agent     broken  cannot read {missing}, the file env_files names for "
            "ANTHROPIC_API_KEY: No such file or directory; put the value there, readable by the "
            "worker's user"
        ),
        (
            "FAIL agent     broken  TURNKEEPER_SANDBOX_EGRESS does not allow llm.example.com:443, "
            "the model API's host (ANTHROPIC_BASE_URL): add it"
        ),
    ]
    assert "sk-test-not-a-key" not in result.stdout + result.stderr
    assert service_lines(result.stdout) == [["ok", "database"], ["ok", "redis"], ["ok", "broker"]]
    # What the container images wait for: the services, whatever the agents' state.
    only = run(["doctor", "--services"], env)
    assert only.returncode == 0, only.stdout
    assert [line.split()[:2] for line in only.stdout.splitlines()] == [
        ["ok", "database"],
        ["ok", "redis"],
        ["ok", "broker"],
    ]

    agents.write_text(agents.read_text().split("[agents.broken]")[0])
    assert run(["doctor"], env).returncode == 0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TURNKEEPER_DATABASE_URL", "mysql://root@h/d"),
        ("TURNKEEPER_REDIS_URL", "http://h"),
        ("TURNKEEPER_LEASE_TTL", "soon"),
    ],
)
def test_bad_settings_are_one_line_errors(variable: str, value: str, tmp_path: Path) -> None:
    env = service_env("postgresql://x@h/d", "redis://h", tmp_path)
    env[variable] = value
    result = run(["doctor"], env)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {variable}: ")


def test_unwritable_data_dir_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env["TURNKEEPER_DATA_DIR"] = str(blocker / "data")
    result = run(["db", "upgrade"], env)
    assert result.returncode == 1
    assert result.stderr.startswith("error: TURNKEEPER_DATA_DIR: ")
    assert result.stderr.count("\n") == 1


def test_dev_on_the_embedded_default(tmp_path: Path) -> None:
    """With no URLs set, `dev` brings up servers, worker and beat, and stops them on Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env["TURNKEEPER_DATA_DIR"] = str(tmp_path / "data")
    no_servers = run(["doctor"], env)
    assert no_servers.returncode == 1
    assert "turnkeeper dev" in no_servers.stderr, "doctor says how to start the stack"

    dev = subprocess.Popen(
        [*TURNKEEPER, "dev", "--no-web"],  # with the web app: tests/test_dev.py
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert dev.stdout is not None
        seen = [dev.stdout.readline() for _ in range(4)]
        assert [line.split()[0] for line in seen[:3]] == ["database", "redis", "broker"]
        assert seen[3] == "turnkeeper dev is up (1 worker(s), beat); Ctrl-C stops it.\n"
        doctor = run(["doctor"], env)
        assert doctor.returncode == 0, "doctor finds the running dev stack"
        assert service_lines(doctor.stdout) == [
            ["ok", "database"],
            ["ok", "redis"],
            ["ok", "broker"],
        ]
    finally:
        dev.send_signal(signal.SIGINT)
        out, err = dev.communicate(timeout=120)
    assert dev.returncode == 0, err
    assert out.strip().splitlines()[-1] == "stopped."
    assert run(["doctor"], env).returncode == 1, "dev stopped the servers it started"
