"""`turnkeeper dev`: the whole stack on one machine until Ctrl-C.

Servers (embedded unless the URLs are set), workers, beat and the web app, each its
own process as in production. It prints where the dashboard is and a key to sign in
with: an admin key made for this start and revoked when it stops (or, after a dev that
was killed outright, when the next one starts in the same data directory).
"""

from __future__ import annotations

import hashlib
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from turnkeeper.cli import fleet
from turnkeeper.cli.context import (
    console,
    err_console,
    fail,
    services,
    settings_from_env,
    with_dev_secret,
)
from turnkeeper.errors import TurnkeeperError

if TYPE_CHECKING:
    from turnkeeper.store.store import Store

WEB_READY_SECONDS = 60.0
"""How long the web app may take to answer /healthz before dev gives up (a hang guard)."""

Port = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=65535,
        help="The web app's port [TURNKEEPER_WEB_PORT, 8000]; 0: any free port.",
    ),
]


def dev(
    workers: Annotated[int, typer.Option(min=0, help="Worker processes to start (each -c 2).")] = 1,
    port: Port = None,
    web: Annotated[
        bool, typer.Option("--web/--no-web", help="Start the web app and dashboard too.")
    ] = True,
) -> None:
    """The whole stack until Ctrl-C: servers (embedded unless URLs are set), workers,
    beat and the web app; prints the dashboard's address and a key to sign in with."""
    from turnkeeper import checkup
    from turnkeeper.store import migration
    from turnkeeper.store.store import Store

    settings = with_dev_secret(settings_from_env(quiet=False))
    # From here on Ctrl-C, SIGTERM and a closed terminal stop it the same way, even
    # while it starts: nothing it started is left running, its key is revoked.
    stop = fleet.stop_signals(signal.SIGHUP)
    with _one_dev_per(settings.data_dir):
        web_port = settings.web_port if port is None else port
        if web:
            web_port = _bindable(settings.web_host, web_port)
        with services(settings, start=True) as resolved:
            migration.upgrade(resolved.require_database_url())
            console.print(f"database  {checkup.redact(resolved.require_database_url())}")
            console.print(f"redis     {checkup.redact(resolved.require_redis_url())}")
            console.print(f"broker    {checkup.redact(resolved.effective_broker_url)}")
            with Store(resolved.require_database_url(), pool_size=1) as store:
                keys = DevKeys(store, resolved.data_dir)
                keys.revoke_left_over()
                procs: list[subprocess.Popen[bytes]] = []
                try:
                    # Made before the web app starts: a web app on an address other
                    # than loopback refuses to start while no key exists.
                    key = keys.create() if web else None
                    procs = fleet.start_fleet(
                        resolved, workers=workers, web_port=web_port if web else None
                    )
                    if key is not None:
                        base_url = f"http://{_url_host(resolved.web_host)}:{web_port}"
                        _wait_for_web(base_url, procs[-1], stop)
                        console.print(f"dashboard {base_url}/", highlight=False)
                        console.print(f"sign in   {base_url}/login with the admin key")
                        console.print(f"key       {key}", highlight=False)
                    parts = f"{workers} worker(s), beat" + (", web" if web else "")
                    if not stop.is_set():
                        console.print(f"turnkeeper dev is up ({parts}); Ctrl-C stops it.")
                    stop.wait()
                finally:
                    fleet.stop_fleet(procs, resolved.data_dir)
                    keys.revoke()
    console.print("stopped.")


class DevKeys:
    """The admin key a ``dev`` prints. Its name says whose data directory it serves, so
    a ``dev`` that was killed (SIGKILL, a crash: no chance to revoke) has its key
    revoked by the next one in the same directory; only one runs there at a time."""

    def __init__(self, store: Store, data_dir: Path) -> None:
        self.store = store
        digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()
        self.prefix = f"dev-{digest[:8]}-"
        self.name: str | None = None

    def create(self) -> str:
        self.name = f"{self.prefix}{secrets.token_hex(4)}"
        return self.store.create_key(self.name, admin=True)

    def revoke_left_over(self) -> None:
        for key in self.store.list_keys():
            if key.name.startswith(self.prefix) and key.revoked_at is None:
                self.store.revoke_key(key.name)

    def revoke(self) -> None:
        if self.name is None:
            return
        try:
            self.store.revoke_key(self.name)
        except TurnkeeperError as exc:  # the database went first: the next dev revokes it
            err_console.print(f"warning: key {self.name} not revoked: {exc}", markup=False)


@contextmanager
def _one_dev_per(data_dir: Path) -> Iterator[None]:
    """One ``dev`` per data directory: a second would share the first's embedded
    servers and stop them, or leave its own processes behind, when either stops."""
    from filelock import FileLock, Timeout

    data_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(data_dir / "dev.lock", mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout as exc:
        raise fail(f"another turnkeeper dev runs in {data_dir}; stop it first") from exc
    try:
        yield
    finally:
        lock.release()


def _url_host(host: str) -> str:
    """Where this machine reaches a web app listening on ``host``: a wildcard address
    is reached on loopback (and is no Host header the web app answers)."""
    if host in ("", "0.0.0.0"):  # noqa: S104 - the address it listens on, not ours
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _bindable(host: str, port: int) -> int:
    """``port`` if the web app can listen on it now (0: a free one); else a clear error,
    never a web process that dies behind a banner saying the stack is up."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise fail(
                f"cannot serve the web app on {host}:{port} ({exc.strerror}); pass --port "
                "or set TURNKEEPER_WEB_PORT, or --no-web"
            ) from exc
        bound: int = sock.getsockname()[1]
        return bound


def _wait_for_web(base_url: str, proc: subprocess.Popen[bytes], stop: threading.Event) -> None:
    import httpx

    deadline = time.monotonic() + WEB_READY_SECONDS
    while time.monotonic() < deadline and not stop.is_set():
        if proc.poll() is not None:
            raise fail(f"the web app exited with code {proc.returncode} (its log is above)")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        stop.wait(0.2)
    if not stop.is_set():
        raise fail(f"the web app did not answer at {base_url}/healthz")
