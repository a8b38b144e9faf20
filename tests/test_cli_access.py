"""The API-access commands as an operator runs them: keys, the secret, the web app's bind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.conftest import TEST_SECRET
from tests.test_cli import TURNKEEPER, run, service_env
from turnkeeper.store.store import Store
from turnkeeper.web.serve import free_port


def test_keys_create_list_revoke(database_url: str, redis_url: str, tmp_path: Path) -> None:
    env = service_env(database_url, redis_url, tmp_path)
    created = run(["keys", "create", "alice", "--allow-commands", "--max-running", "3"], env)
    assert created.returncode == 0, created.stderr
    key = created.stdout.removesuffix("\n")
    assert created.stdout == f"{key}\n"  # alone: `KEY=$(turnkeeper keys create NAME)`
    assert key.startswith("tk_")
    assert created.stderr.splitlines()[-1] == (
        "created key 'alice' (tenant, inline commands, at most 3 running); it is shown only now:"
    )
    admin = run(["keys", "create", "ops", "--admin"], env)
    assert admin.returncode == 0, admin.stderr
    with Store(database_url, pool_size=1) as store:
        found = store.authenticate_key(key)
        assert found is not None
        assert (found.name, found.allow_commands, found.admin, found.max_running) == (
            "alice", True, False, 3,
        )  # fmt: skip
        assert store.authenticate_key(admin.stdout.splitlines()[-1]).admin  # type: ignore[union-attr]

    listed = run(["keys", "list"], {**env, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines() if line.startswith("│")}
    assert set(rows) == {"alice", "ops"}
    assert "commands" in rows["alice"]
    assert "admin" in rows["ops"]
    assert key not in listed.stdout

    revoked = run(["keys", "revoke", "alice"], env)
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.startswith("revoked alice (at ")
    with Store(database_url, pool_size=1) as store:
        assert store.authenticate_key(key) is None

    submit = ["submit", "--agent", "scripted", "--prompt", "hi"]
    for args, message in [
        (["keys", "create", "alice"], "a key named 'alice' exists or existed"),
        (["keys", "revoke", "nobody"], "no key is named 'nobody'"),
        ([*submit, "--as", "alice"], "the key 'alice' is revoked"),
        ([*submit, "--as", "nobody"], "the key 'nobody' is unknown"),
    ]:
        result = run(args, env)
        assert result.returncode == 1, (args, result.stdout)
        assert result.stderr.startswith("error: "), args
        assert message in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr
    # A name the store can never hold is a usage error (exit 2), as the API's 400.
    bad_name = run(["keys", "create", "bad name"], env)
    assert (bad_name.returncode, bad_name.stdout) == (2, "")
    assert bad_name.stderr == (
        "error: a key name is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter "
        "or digit; got 'bad name'\n"
    )


def test_keys_list_cuts_nothing_on_80_columns(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Long names, every scope and the last use, whole on a narrow terminal (folded, never
    cut with an ellipsis: a name is what `keys revoke` takes)."""
    env = service_env(database_url, redis_url, tmp_path)
    long_name = "n" * 64
    for args in (["alice", "--allow-commands", "--max-running", "3"], [long_name, "--admin",
                 "--allow-commands"]):  # fmt: skip
        created = run(["keys", "create", *args], env)
        assert created.returncode == 0, created.stderr
    with Store(database_url, pool_size=1) as store:
        assert store.authenticate_key(created.stdout.splitlines()[-1]) is not None
        used = store.list_keys()[-1].last_used_at
    assert used is not None
    listed = run(["keys", "list"], {**env, "COLUMNS": "80"})
    assert listed.returncode == 0, listed.stderr
    assert "…" not in listed.stdout
    keys: list[list[str]] = []
    for line in listed.stdout.splitlines():
        if not line.startswith("│"):
            continue
        row = [cell.strip() for cell in line.strip("│").split("│")]
        if re.match(r"\d{4}-\d\d-\d\d", row[3]):  # a key's first line: its creation date
            keys.append(row)
        else:  # a folded cell goes on: spaces where it was folded are left out below
            keys[-1] = [a + b for a, b in zip(keys[-1], row, strict=True)]
    rows = {row[0]: [cell.replace(" ", "") for cell in row] for row in keys}
    assert set(rows) == {"alice", long_name}
    assert rows[long_name][1:3] == ["admin,commands", "-"]
    assert rows[long_name][4] == used.strftime("%Y-%m-%d%H:%M:%SZ")
    assert rows["alice"][1:3] == ["commands", "3"]
    assert rows["alice"][4:] == ["-", "-"]


def test_submit_on_behalf_of_a_key(database_url: str, redis_url: str, tmp_path: Path) -> None:
    env = {**service_env(database_url, redis_url, tmp_path), "TURNKEEPER_SECRET": TEST_SECRET}
    assert run(["keys", "create", "bob"], env).returncode == 0
    submitted = run(
        [
            *("submit", "--agent", "scripted", "--prompt", "hi", "--run-id", "as-bob"),
            *("--as", "bob", "--env", "K=v"),
        ],
        env,
    )
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout == "as-bob\n"
    with Store(database_url, pool_size=1) as store:
        run_row = store.get_run("as-bob")
        assert run_row is not None
        assert run_row.key_name == "bob"
        assert set(run_row.payload["env"]) == {"digest", "sealed"}
    no_secret = run(
        ["submit", "--agent", "scripted", "--prompt", "hi", "--env", "K=v"],
        service_env(database_url, redis_url, tmp_path),
    )
    assert no_secret.returncode == 1
    assert "TURNKEEPER_SECRET" in no_secret.stderr
    assert no_secret.stderr.count("\n") == 1


def test_fleet_commands_refuse_to_start_without_a_secret(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = service_env(database_url, redis_url, tmp_path)
    for command in (["worker"], ["beat"], ["web"]):
        result = run(command, env)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert result.stderr.startswith("error: TURNKEEPER_SECRET (at least 32 bytes) or "), command
        assert result.stderr.count("\n") == 1, result.stderr
    agents = tmp_path / "agents.toml"
    agents.write_text("[agents.x]\nprovider = 'docker'\n")
    bad_catalog = run(
        ["web"], {**env, "TURNKEEPER_SECRET": TEST_SECRET, "TURNKEEPER_AGENTS_FILE": str(agents)}
    )
    assert bad_catalog.returncode == 1
    assert bad_catalog.stderr.startswith(f"error: TURNKEEPER_AGENTS_FILE ({agents}): agent 'x'")
    assert bad_catalog.stderr.count("\n") == 1
    short = run(["worker"], {**env, "TURNKEEPER_SECRET": "too short"})
    assert short.returncode == 1
    assert short.stderr == "error: TURNKEEPER_SECRET: must be at least 32 bytes\n"


def test_web_binds_loopback_and_refuses_a_public_address_without_keys(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = {**service_env(database_url, redis_url, tmp_path), "TURNKEEPER_SECRET": TEST_SECRET}
    refused = run(["web", "--host", "0.0.0.0", "--port", str(free_port())], env)  # noqa: S104
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: refusing to serve on 0.0.0.0, which is not loopback")
    assert refused.stderr.count("\n") == 1
    assert run(["keys", "create", "ops", "--admin"], env).returncode == 0
    for host, shown in ((None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")):  # noqa: S104
        port = free_port()
        args = ["web", "--port", str(port)] + ([] if host is None else ["--host", host])
        web = subprocess.Popen(
            [*TURNKEEPER, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        try:
            assert web.stdout is not None
            assert web.stdout.readline().strip() == f"dashboard http://{shown}:{port}/"
            deadline = time.monotonic() + 60  # a hang guard
            while True:
                try:
                    health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                    break
                except httpx.TransportError:
                    assert web.poll() is None
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert health.status_code == 200
            assert httpx.get(f"http://127.0.0.1:{port}/runs").status_code == 401
        finally:
            os.killpg(web.pid, signal.SIGTERM)
            web.communicate(timeout=30)
