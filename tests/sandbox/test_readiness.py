"""A worker starts only when its provider can really run an agent, and says why not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError
from turnkeeper.sandbox.egress import stop_proxies
from turnkeeper.sandbox.readiness import NOT_ISOLATED, check_provider


@pytest.fixture(autouse=True)
def _no_proxy_left(settings: Settings) -> Iterator[None]:
    """The checks start this data dir's egress proxy, as a worker would: stop it after."""
    yield
    stop_proxies(settings.data_dir)


def test_bwrap_and_local_start_a_trivial_agent(settings: Settings) -> None:
    check_provider(settings)  # bwrap, the default
    with structlog.testing.capture_logs() as logs:
        check_provider(settings.model_copy(update={"sandbox_provider": "local"}))
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert warnings == [
        {"event": "sandbox.not_isolated", "provider": "local", "detail": NOT_ISOLATED,
         "log_level": "warning"},
    ]  # fmt: skip
    assert list(settings.sandboxes_dir.iterdir()) == []  # the trial sandboxes are gone


def test_a_jail_that_cannot_start_is_a_one_line_config_error(settings: Settings) -> None:
    broken = settings.model_copy(update={"sandbox_ro_binds": "/nonexistent-tk-path"})
    with pytest.raises(ConfigError) as caught:
        check_provider(broken)
    assert caught.value.reason == "jail-failed"
    assert caught.value.message == (
        "a trivial agent failed: bwrap: Can't find source path /nonexistent-tk-path: "
        "No such file or directory"
    )


def _worker(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    return subprocess.run(
        [sys.executable, "-m", "turnkeeper", "worker"],
        env={**base, "TURNKEEPER_DATA_DIR": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_worker_refuses_to_start_with_one_line(settings: Settings, tmp_path: Path) -> None:
    assert settings.secret is not None
    urls = {
        "TURNKEEPER_DATABASE_URL": settings.require_database_url(),
        "TURNKEEPER_REDIS_URL": settings.require_redis_url(),
        "TURNKEEPER_SECRET": settings.secret.get_secret_value(),
    }
    done = _worker({**urls, "TURNKEEPER_SANDBOX_RO_BINDS": "/nonexistent-tk-path"}, tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "error: a trivial agent failed: bwrap: Can't find source path /nonexistent-tk-path: "
        "No such file or directory"
    )
    assert "Traceback" not in done.stderr
    no_bwrap = {**urls, "PATH": "/nonexistent-bin"}  # bwrap is looked up on PATH
    done = _worker(no_bwrap, tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "error: bubblewrap is not installed: install it (Debian: apt-get install bubblewrap) "
        "or set TURNKEEPER_SANDBOX_PROVIDER=local, which is no security boundary"
    )


def test_workers_starting_together_each_pass_their_own_check(settings: Settings) -> None:
    """Workers of one host start at once (a fleet's restart, a deploy): each check has
    a sandbox of its own, so none destroys another's trial agent under it."""
    starters = 4
    together = threading.Barrier(starters)
    failures: list[str] = []

    def start() -> None:
        together.wait()
        try:
            check_provider(settings)
        except ConfigError as exc:
            failures.append(exc.message)

    threads = [threading.Thread(target=start) for _ in range(starters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert list(settings.sandboxes_dir.iterdir()) == []
