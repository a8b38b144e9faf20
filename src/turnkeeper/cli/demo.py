"""`turnkeeper demo`: a worker is killed mid-run and the run goes on, shown end to end.

On the embedded servers (or the configured ones) it starts two workers, beat
and the web app, submits a scripted run, streams it over SSE into the terminal,
SIGKILLs the worker that owns it, shows the takeover (crash detection hands the run
over at once at the default lease; without it, the demo shortens the lease),
and checks what the SSE client received against the stored log: every chunk
once, no gaps. Then it prints the dashboard's run and fleet pages, and the key to
sign in with, and keeps everything up until Ctrl-C (``--exit``: it stops at once).
Exit 0 only when every check passes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from turnkeeper.cli.context import console, services, settings_from_env, with_dev_secret
from turnkeeper.cli.fleet import sandbox_fallback, stop_fleet, wait_for_signal
from turnkeeper.cli.render import ConversationRenderer
from turnkeeper.cli.stack import Port

if TYPE_CHECKING:
    from rich.text import Text

    from turnkeeper.chunks import Chunk
    from turnkeeper.client import Client
    from turnkeeper.config import Settings

SHORT_LEASE = {"LEASE_TTL": "3", "HEARTBEAT_INTERVAL": "1", "RECONCILE_INTERVAL": "1"}
"""Without crash detection a takeover waits for the lease: the demo shortens it then."""
# Chunks whose id must appear once in a run: a takeover that re-appended output would repeat them.
_UNIQUE_BY = {
    "RUN_STARTED": "runId",
    "RUN_FINISHED": "runId",
    "TEXT_MESSAGE_START": "messageId",
    "TEXT_MESSAGE_END": "messageId",
    "TOOL_CALL_START": "toolCallId",
    "TOOL_CALL_END": "toolCallId",
    "TOOL_CALL_RESULT": "toolCallId",
}


@dataclass
class Takeover:
    """What the watcher saw: the kill, then the new epoch on the database."""

    lease_ttl: float
    killed_at: float | None = None
    cause: str | None = None
    old_epoch: int | None = None
    new_epoch: int | None = None
    taken_at: float | None = None
    resumed_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _start_fleet(settings: Settings, logs: Path) -> list[subprocess.Popen[bytes]]:
    """Two workers and beat, each in a session of its own, logging to files under ``logs``."""
    env = dict(os.environ)
    env.update(
        TURNKEEPER_DATABASE_URL=settings.require_database_url(),
        TURNKEEPER_REDIS_URL=settings.require_redis_url(),
        TURNKEEPER_DATA_DIR=str(settings.data_dir.resolve()),
        TURNKEEPER_NAMESPACE=settings.namespace,
        **sandbox_fallback(settings),
    )
    if settings.secret_file is not None:
        env["TURNKEEPER_SECRET_FILE"] = str(settings.secret_file.resolve())
    logs.mkdir(parents=True, exist_ok=True)
    quiet = ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    procs = []
    for name, args in (
        ("worker-1", ["worker", "-c", "2", *quiet]),
        ("worker-2", ["worker", "-c", "2", *quiet]),
        ("beat", ["beat", *quiet]),
    ):
        with (logs / f"{name}.log").open("ab") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "turnkeeper", *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return procs


def _watch_epoch(client: Client, run_id: str, takeover: Takeover) -> None:
    while not takeover.done.wait(0.05):
        if takeover.killed_at is None or takeover.taken_at is not None:
            continue
        _look_at_epoch(client, run_id, takeover)


def _look_at_epoch(client: Client, run_id: str, takeover: Takeover) -> None:
    """Note the takeover once the run's epoch moved past the killed owner's."""
    run = client.get(run_id)
    if run is not None and takeover.old_epoch is not None and run.epoch > takeover.old_epoch:
        takeover.new_epoch = run.epoch
        takeover.taken_at = time.monotonic()
        takeover.cause = ", ".join(client.store.takeovers_of(run_id)) or None


def _kill_owner(
    client: Client, run_id: str, workers: list[subprocess.Popen[bytes]], takeover: Takeover
) -> str:
    from turnkeeper.owner import owner_pid

    run = client.require(run_id)
    if run.owner is None:
        return "the run has no owner yet"
    pid = owner_pid(run.owner)
    pgid = os.getpgid(pid)
    if pgid not in {proc.pid for proc in workers}:
        return f"owner {run.owner} is not one of the demo's workers"
    takeover.old_epoch = run.epoch
    takeover.killed_at = time.monotonic()
    os.killpg(pgid, signal.SIGKILL)
    return f"SIGKILL worker process group {pgid} (owner {run.owner}, epoch {run.epoch})"


def _duplicates(chunks: list[tuple[int, Chunk]]) -> int:
    seqs = Counter(seq for seq, _ in chunks)
    ids = Counter(
        (chunk["type"], chunk.get(key))
        for _, chunk in chunks
        if (key := _UNIQUE_BY.get(str(chunk.get("type")))) is not None
    )
    return sum(n - 1 for n in seqs.values()) + sum(n - 1 for n in ids.values())


def _gaps(chunks: list[tuple[int, Chunk]]) -> int:
    seqs = {seq for seq, _ in chunks}
    return len(set(range(1, max(seqs, default=0) + 1)) - seqs)


def _stream(
    base_url: str,
    stream_url: str,
    client: Client,
    run_id: str,
    workers: list[subprocess.Popen[bytes]],
    takeover: Takeover,
) -> list[tuple[int, Chunk]]:
    import httpx
    import orjson

    from turnkeeper.web.sse import parse_stream

    renderer = ConversationRenderer(console)
    received: list[tuple[int, Chunk]] = []
    results = 0
    with (
        httpx.Client(base_url=base_url, timeout=httpx.Timeout(60.0)) as http,
        http.stream("GET", stream_url) as response,
    ):
        response.raise_for_status()
        for event_id, event, data in parse_stream(response.iter_lines()):
            if event != "message" or event_id is None:
                break
            chunk: Chunk = orjson.loads(data)
            received.append((int(event_id), chunk))
            if takeover.killed_at is not None and takeover.resumed_at is None:
                if takeover.taken_at is None:  # the epoch watcher may not have looked yet
                    _look_at_epoch(client, run_id, takeover)
                # A chunk the killed worker appended just before it died can still come
                # after the kill; the new epoch's first one comes after the takeover.
                if takeover.taken_at is not None:
                    takeover.resumed_at = time.monotonic()
                    renderer.close()
                    console.print(_takeover_line(takeover), highlight=False)
            renderer.render(chunk)
            results += chunk.get("type") == "TOOL_CALL_RESULT"
            if results == 1 and takeover.killed_at is None:
                from rich.text import Text

                renderer.close()
                console.print(
                    Text(f"✗ {_kill_owner(client, run_id, workers, takeover)}", style="bold red")
                )
    renderer.close()
    return received


def _takeover_line(takeover: Takeover) -> Text:
    from rich.text import Text

    assert takeover.killed_at is not None  # noqa: S101 - only called after the kill
    resumed = _ms((takeover.resumed_at or time.monotonic()) - takeover.killed_at)
    if takeover.taken_at is None:
        return Text(f"⟳ output resumed {resumed} after the kill", style="bold yellow")
    taken = _ms(takeover.taken_at - takeover.killed_at)
    return Text(
        f"⟳ takeover: epoch {takeover.old_epoch} → {takeover.new_epoch} {taken} after the "
        f"kill (cause {takeover.cause or '?'}, lease {takeover.lease_ttl:g}s); "
        f"output resumed after {resumed}",
        style="bold yellow",
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _report(
    client: Client, run_id: str, received: list[tuple[int, Chunk]], takeover: Takeover
) -> bool:
    deadline = time.monotonic() + 30  # a hang guard: the stream closed, the run is settled
    run = client.require(run_id)
    while not run.status.is_terminal and time.monotonic() < deadline:
        time.sleep(0.1)
        run = client.require(run_id)
    stored = client.log.snapshot(run_id)
    duplicates, gaps = _duplicates(received), _gaps(received)
    checks = [
        ("chunks delivered", f"{len(received)}", len(received) > 0),
        ("duplicates", str(duplicates), duplicates == 0),
        ("gaps", str(gaps), gaps == 0),
        ("same as the stored log", "yes" if received == stored else "no", received == stored),
        (
            "takeover",
            f"epoch {takeover.old_epoch} → {run.epoch}",
            takeover.old_epoch is not None and run.epoch > takeover.old_epoch,
        ),
        ("run status", run.status.value, run.status.value == "completed"),
    ]
    console.print()
    for name, value, ok in checks:
        mark = "[green]ok  [/green]" if ok else "[red]FAIL[/red]"
        console.print(f"{mark} {name:<24} {value}", highlight=False)
    return all(ok for _, _, ok in checks)


def demo(
    turns: Annotated[int, typer.Option(min=2, max=20, help="Turns of the scripted agent.")] = 4,
    pace: Annotated[float, typer.Option(min=0.01, max=2.0, help="Seconds per agent line.")] = 0.15,
    exit_at_once: Annotated[
        bool,
        typer.Option("--exit", help="Stop the stack once the checks ran (else: at Ctrl-C)."),
    ] = False,
    port: Port = None,
) -> None:
    """A worker dies mid-run and the run goes on: takeover, no chunk lost or doubled.
    The stack and the dashboard stay up afterwards until Ctrl-C (with --exit: stop at once)."""
    import httpx
    from uuid6 import uuid7

    from turnkeeper.client import Client
    from turnkeeper.store import migration
    from turnkeeper.web import create_app
    from turnkeeper.web.serve import BackgroundServer, free_port

    timing = {} if settings_from_env().crash_detection else SHORT_LEASE
    os.environ.update({f"TURNKEEPER_{k}": v for k, v in timing.items()})
    settings = with_dev_secret(settings_from_env())
    with services(settings, start=True) as resolved:
        migration.upgrade(resolved.require_database_url())
        logs = resolved.data_dir / "demo-logs"
        procs = _start_fleet(resolved, logs)
        # The port asked for, exactly; by default TURNKEEPER_WEB_PORT, or a free one
        # when that one is taken (a `turnkeeper web` may hold it).
        web_port = port if port is not None else free_port(resolved.web_host, resolved.web_port)
        server = BackgroundServer.start(create_app(resolved), port=web_port)
        client = Client.from_settings(resolved)
        # The demo's own key: the run belongs to it, and the API is called with it.
        key_name = f"demo-{uuid7().hex[-12:]}"
        key = client.store.create_key(key_name, admin=True)
        takeover = Takeover(lease_ttl=resolved.lease_ttl)
        ok = False
        try:
            console.print(
                f"turnkeeper demo: 2 workers, beat and the web app on {server.base_url} "
                f"(lease {resolved.lease_ttl:g}s; process logs in {logs})",
                highlight=False,
            )
            run_id = f"demo-{uuid7()}"
            agent: dict[str, Any] = {"preset": "scripted", "turns": turns, "pace": pace, "seed": 1}
            client.submit(
                agent, "Tidy the workspace and take notes", run_id=run_id, key_name=key_name
            )
            view = httpx.get(
                f"{server.base_url}/runs/{quote(run_id, safe='')}",
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            ).json()
            run_page = f"{server.base_url}/ui/runs/{quote(run_id, safe='')}"
            console.print(f"run {run_id}; watch it at {run_page}", highlight=False)
            threading.Thread(
                target=_watch_epoch, args=(client, run_id, takeover), daemon=True
            ).start()
            received = _stream(
                server.base_url, view["stream_url"], client, run_id, procs[:2], takeover
            )
            ok = _report(client, run_id, received, takeover)
            if not exit_at_once:  # the links only while something answers them
                console.print()
                for name, value in (
                    ("dashboard", f"{server.base_url}/"),
                    ("run page", run_page),
                    ("fleet page", f"{server.base_url}/ui/fleet"),
                ):
                    console.print(f"     {name:<24} {value}", highlight=False)
                sign_in = f"{server.base_url}/login?next={quote('/ui/fleet', safe='')}"
                console.print(f"     {'sign in at':<24} {sign_in}", highlight=False)
                console.print(f"     {'with the admin key':<24} {key}", highlight=False)
                console.print(
                    "The stack stays up for the dashboard; Ctrl-C stops it and revokes the key.",
                    highlight=False,
                )
                wait_for_signal()
        finally:
            takeover.done.set()
            client.store.revoke_key(key_name)
            client.close()
            server.stop()
            stop_fleet(procs, resolved.data_dir)
    if not ok:
        raise typer.Exit(1)
