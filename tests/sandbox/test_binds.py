"""No bind of a jail shows agents the fleet's own files: every bind (the system
directories, the /etc entries, the operator's, a preset's) is checked against every
private path (the data and sandboxes directories, the secret, the catalog and its key
files, the uid claims) before a worker starts, and in the layouts that pass, a real
jailed agent finds none of them anywhere in its filesystem."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from tests.conftest import TEST_SECRET
from tests.unavailable import require_bwrap
from turnkeeper.agents.readiness import agent_paths
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError
from turnkeeper.sandbox import JournalReader, SandboxSpec, spawn_journaled
from turnkeeper.sandbox.command import AgentCommand
from turnkeeper.sandbox.egress import stop_proxies
from turnkeeper.sandbox.factory import provider_for
from turnkeeper.sandbox.readiness import check_binds, check_provider

Place = Callable[[str], Path]
VENV = sys.prefix  # the scripted preset binds the worker's interpreter


@pytest.fixture
def place() -> Iterator[Place]:
    """A fresh directory below a host directory (``/opt``, ``/usr/local``, ...), removed
    after the test."""
    made: list[Path] = []

    def make(parent: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix="tk-binds-", dir=parent))
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _shows(bind: str, origin: str, what: str, path: object) -> str:
    return f"every jail shows {bind} ({origin}) and so {what}, {path}: move it out of {bind}"


DATA = "the data directory (TURNKEEPER_DATA_DIR)"
SANDBOXES = "the sandboxes directory (TURNKEEPER_SANDBOX_ROOT)"
SECRET = "the server secret (TURNKEEPER_SECRET_FILE)"  # noqa: S105 - a description
SYSTEM = "a system directory"


def _refusal(settings: Settings) -> str:
    with pytest.raises(ConfigError) as caught:
        check_binds(settings, agent_paths(settings))
    assert caught.value.reason == "bind-exposes-fleet"
    return caught.value.message


def test_the_layouts_the_tests_use_pass(settings: Settings) -> None:
    check_binds(settings, agent_paths(settings))


def test_a_data_dir_under_a_system_directory(settings: Settings, place: Place) -> None:
    data = place("/opt") / "data"
    assert _refusal(settings.model_copy(update={"data_dir": data})) == "; ".join(
        [_shows("/opt", SYSTEM, DATA, data), _shows("/opt", SYSTEM, SANDBOXES, data / "sandboxes")]
    )


def test_a_sandbox_root_under_usr_local(settings: Settings, place: Place) -> None:
    sandboxes = place("/usr/local") / "sandboxes"
    refused = settings.model_copy(update={"sandbox_root": sandboxes})
    assert _refusal(refused) == _shows("/usr", SYSTEM, SANDBOXES, sandboxes)


def test_a_secret_file_under_an_etc_entry(settings: Settings, place: Place) -> None:
    secret = place("/etc/ssl") / "secret"
    refused = settings.model_copy(update={"secret_file": secret})
    assert _refusal(refused) == _shows("/etc/ssl", "an /etc entry", SECRET, secret)


def test_a_secret_file_in_an_operators_bind(settings: Settings, place: Place) -> None:
    shared = place("/srv")
    refused = settings.model_copy(
        update={"sandbox_ro_binds": str(shared), "secret_file": shared / "secret"}
    )
    assert _refusal(refused) == _shows(
        str(shared), "TURNKEEPER_SANDBOX_RO_BINDS", SECRET, shared / "secret"
    )


def test_a_data_dir_inside_what_the_scripted_preset_binds(settings: Settings, place: Place) -> None:
    assert VENV in AgentSpec.from_payload("scripted").read_only
    data = place(VENV) / "data"
    assert _refusal(settings.model_copy(update={"data_dir": data})) == "; ".join(
        [
            _shows(VENV, "the scripted preset", DATA, data),
            _shows(VENV, "the scripted preset", SANDBOXES, data / "sandboxes"),
        ]
    )


def test_the_catalog_and_its_key_files(settings: Settings, place: Place) -> None:
    keys = place("/opt")
    (keys / "key").write_text("sk-test\n")
    catalog = place("/usr/local") / "agents.toml"
    catalog.write_text(
        f'[agents.k]\npreset = "claude-code"\nenv_files = {{ ANTHROPIC_API_KEY = "{keys}/key" }}\n'
    )
    refused = settings.model_copy(update={"agents_file": catalog})
    assert _refusal(refused) == "; ".join(
        [
            _shows("/usr", SYSTEM, "the agent catalog (TURNKEEPER_AGENTS_FILE)", catalog),
            _shows("/opt", SYSTEM, "agent k's ANTHROPIC_API_KEY file (env_files)", keys / "key"),
        ]
    )


def test_a_data_dir_reached_through_a_link(
    settings: Settings, place: Place, tmp_path: Path
) -> None:
    real = place("/opt")
    link = tmp_path / "link"
    link.symlink_to(real)
    refused = settings.model_copy(update={"data_dir": link})
    assert _refusal(refused) == "; ".join(
        [
            _shows("/opt", SYSTEM, DATA, f"{link} (really {real})"),
            _shows("/opt", SYSTEM, SANDBOXES, f"{link}/sandboxes (really {real}/sandboxes)"),
        ]
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker claims uids")
def test_a_bind_inside_the_uid_claims(settings: Settings) -> None:
    claims = "/var/lib/turnkeeper/sandbox-uids"
    refused = settings.model_copy(update={"sandbox_ro_binds": f"{claims}/1900000001"})
    assert _refusal(refused) == (
        f"every jail shows {claims}/1900000001 (TURNKEEPER_SANDBOX_RO_BINDS), which is "
        f"inside the sandbox uid claims, {claims}: keep the two apart"
    )


def test_the_ssh_hosts_paths_as_written(settings: Settings) -> None:
    refused = settings.model_copy(
        update={"sandbox_provider": "ssh", "ssh_root": "/opt/tk/sandboxes"}
    )
    remote_root = "the remote sandboxes (TURNKEEPER_SSH_ROOT)"
    remote_data = "the remote data directory (above TURNKEEPER_SSH_ROOT)"
    assert _refusal(refused) == "; ".join(
        [
            _shows("/opt", SYSTEM, remote_root, "/opt/tk/sandboxes"),
            _shows("/opt", SYSTEM, remote_data, "/opt/tk"),
        ]
    )


def test_a_worker_of_a_weaker_provider_checks_the_jails_its_runs_may_ask_for(
    settings: Settings, place: Place
) -> None:
    """A run may ask for a stronger provider than the worker's (``local`` < ``ssh`` <
    ``bwrap``): an ssh worker that can start bwrap jails here refuses binds that show this
    host's paths too; a local worker, no boundary itself, says so in a warning."""
    data = place("/opt") / "data"
    exposed = [
        _shows("/opt", SYSTEM, DATA, data),
        _shows("/opt", SYSTEM, SANDBOXES, data / "sandboxes"),
    ]
    ssh = settings.model_copy(update={"data_dir": data, "sandbox_provider": "ssh"})
    assert _refusal(ssh) == "; ".join(exposed)
    local = settings.model_copy(update={"data_dir": data, "sandbox_provider": "local"})
    with structlog.testing.capture_logs() as logs:
        check_binds(local, agent_paths(local))
    assert logs == [
        {
            "event": "sandbox.binds_show_the_fleet",
            "detail": "; ".join(exposed),
            "provider": "local",
            "log_level": "warning",
        }
    ]


def _worker(settings: Settings, data_dir: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env = {
        "TURNKEEPER_DATABASE_URL": settings.require_database_url(),
        "TURNKEEPER_REDIS_URL": settings.require_redis_url(),
        "TURNKEEPER_SECRET": TEST_SECRET,
        "TURNKEEPER_DATA_DIR": str(data_dir),
    }
    return subprocess.run(
        [sys.executable, "-m", "turnkeeper", "worker"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("parent", "bind"), [("/opt", "/opt"), ("/usr/local", "/usr")])
def test_the_worker_refuses_to_start_with_its_data_dir_in_every_jail(
    settings: Settings, place: Place, parent: str, bind: str
) -> None:
    data = place(parent) / "data"
    done = _worker(settings, data)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "error: " + "; ".join(
        [_shows(bind, SYSTEM, DATA, data), _shows(bind, SYSTEM, SANDBOXES, data / "sandboxes")]
    )
    assert "Traceback" not in done.stderr
    assert not data.exists(), "it refused before it made anything there"


# --- what a jailed agent finds ------------------------------------------------------------


def _layout_in_tmp(tmp_path: Path, place: Place) -> dict[str, Path]:
    del place
    return {
        "data_dir": tmp_path / "data",
        "secret_file": tmp_path / "data" / "secret",
        "agents_file": tmp_path / "agents.toml",
        "key_file": tmp_path / "keys" / "key",
    }


def _layout_of_a_host(tmp_path: Path, place: Place) -> dict[str, Path]:
    del tmp_path
    etc = place("/etc")
    return {
        "data_dir": place("/var/lib") / "data",
        "sandbox_root": place("/srv") / "sandboxes",
        "secret_file": etc / "secret",
        "agents_file": etc / "agents.toml",
        "key_file": etc / "keys" / "key",
    }


def _open_to_everyone(path: Path) -> None:
    for each in [path, *path.parents]:
        mode = each.stat().st_mode
        each.chmod(mode | (0o005 if each.is_dir() else 0o004))


@pytest.mark.parametrize("layout", [_layout_in_tmp, _layout_of_a_host], ids=["tmp", "host"])
def test_a_jailed_agent_finds_nothing_of_the_fleet(
    settings: Settings,
    place: Place,
    tmp_path: Path,
    layout: Callable[[Path, Place], dict[str, Path]],
) -> None:
    """Every private path holds a file named by a marker; the agent (with the scripted
    preset's binds and the egress proxy's socket, as a run's) looks for the marker in
    its whole filesystem and finds only the one its own workspace holds, and the one
    the test put where every jail looks (``/opt``)."""
    require_bwrap()
    marker = f"tk-private-{uuid.uuid4().hex}"
    paths = layout(tmp_path, place)
    key_file = paths.pop("key_file")
    options: dict[str, object] = {**paths, "secret": None}
    paths["secret_file"] = paths["secret_file"].with_name(f"{marker}-secret")
    options["secret_file"] = paths["secret_file"]
    fleet = settings.model_copy(update=options)
    key_file = key_file.with_name(f"{marker}-key")
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text("sk-test\n")
    fleet.agents_file.write_text(  # type: ignore[union-attr]
        f'[agents.k]\npreset = "claude-code"\nenv_files = {{ ANTHROPIC_API_KEY = "{key_file}" }}\n'
    )
    fleet.secret_file.parent.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
    fleet.secret_file.write_text(TEST_SECRET)  # type: ignore[union-attr]
    check_provider(fleet, agent_paths(fleet))  # the worker's check: this layout passes
    provider = provider_for("bwrap", fleet)
    ref = provider.create("binds", SandboxSpec())
    for directory in (fleet.data_dir, fleet.sandboxes_dir, Path(ref.root)):
        (directory / f"{marker}-here").write_text("private\n")
    (Path(ref.workspace) / f"{marker}-own").write_text("the agent's\n")
    shown = place("/opt") / f"{marker}-in-opt"  # the probe's control: a bound place
    shown.write_text("every agent's\n")
    # Only the mounts may hide a marker: every file readable by all, every directory
    # above it open to all.
    for path in [shown, *paths.values(), key_file, fleet.sandboxes_dir, Path(ref.root)]:
        _open_to_everyone(path)
    try:
        sandbox = provider.resume(ref)
        assert sandbox is not None
        find = (
            f"find / -path /proc -prune -o -name {shlex.quote(marker + '*')} -print; "
            "test -S /run/turnkeeper/egress/proxy.sock && echo proxy.sock"
        )
        scripted = AgentSpec.from_payload("scripted").read_only
        command = AgentCommand(("/bin/sh", "-c", find), read_only=scripted)
        handle = spawn_journaled(sandbox, "binds", command)
        reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
        lines = [line.decode() for line, _ in reader]
    finally:
        provider.destroy(ref)
        stop_proxies(fleet.data_dir)
    assert reader.exit_code == 0
    assert sorted(lines) == [str(shown), f"/workspace/{marker}-own", "proxy.sock"]
