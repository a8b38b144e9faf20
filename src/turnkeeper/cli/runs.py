"""Commands that drive and watch runs: submit, tail, status, cancel, runs."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
import typer
from rich.table import Table

from turnkeeper.cli.context import console, services, settings_from_env
from turnkeeper.cli.render import ConversationRenderer
from turnkeeper.client import Client
from turnkeeper.errors import ConfigError
from turnkeeper.store.records import Run


@contextmanager
def client_from_env() -> Iterator[Client]:
    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        client = Client.from_settings(resolved)
        try:
            yield client
        finally:
            client.close()


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env expects KEY=VALUE, got {pair!r}", reason="bad-env")
        env[key] = value
    return env


def submit(
    agent: Annotated[
        str | None, typer.Option("--agent", help="Preset: scripted, claude-code, codex.")
    ] = None,
    command: Annotated[
        str | None, typer.Option("--command", help="Agent command, split as a shell would.")
    ] = None,
    output_format: Annotated[
        str, typer.Option("--format", help="Output format of --command.")
    ] = "text",
    prompt: Annotated[str, typer.Option("--prompt", help="The input of the turn.")] = "",
    session: Annotated[str | None, typer.Option("--session", help="Session id.")] = None,
    from_entry: Annotated[
        str | None,
        typer.Option("--from-entry", help="Branch: the earlier transcript entry to follow."),
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Idempotency key.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE for the agent (repeatable).")
    ] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Sandbox: local, bwrap, ssh.")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Stream the run until it ends.")] = False,
    on_behalf_of: Annotated[
        str | None,
        typer.Option("--as", help="Submit on behalf of this API key (the run is its tenant's)."),
    ] = None,
) -> None:
    """Submit a run; prints its run id (or, with --follow, its conversation)."""
    if (agent is None) == (command is None):
        raise ConfigError("give exactly one of --agent PRESET or --command CMD", reason="usage")
    spec: str | dict[str, Any]
    if command is not None:
        spec = {"command": shlex.split(command), "format": output_format}
    else:
        spec = str(agent)
    with client_from_env() as client:
        run = client.submit(
            spec,
            prompt,
            session_id=session,
            run_id=run_id,
            env=parse_env(env or []),
            provider=provider,
            key_name=on_behalf_of,
            from_entry=from_entry,
        )
        if not follow:
            print(run.run_id)
            return
        console.print(f"run {run.run_id}", style="dim", highlight=False)
        _follow(client, run.run_id, after=0, as_json=False, follow=True)


def tail(
    run_id: str,
    from_seq: Annotated[int, typer.Option("--from", help="Show chunks after this seq.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line per chunk.")] = False,
    no_follow: Annotated[
        bool, typer.Option("--no-follow", help="Print what is stored and exit.")
    ] = False,
) -> None:
    """Print a run's chunks; exits when its log is closed."""
    with client_from_env() as client:
        _follow(client, run_id, after=from_seq, as_json=as_json, follow=not no_follow)


def _follow(client: Client, run_id: str, *, after: int, as_json: bool, follow: bool) -> None:
    renderer = None if as_json else ConversationRenderer(console)
    for seq, chunk in client.events(run_id, after, follow=follow):
        if renderer is None:
            sys.stdout.buffer.write(orjson.dumps({"seq": seq, "chunk": chunk}) + b"\n")
            sys.stdout.flush()
        else:
            renderer.render(chunk)
    if renderer is not None:
        renderer.close()
    run = client.get(run_id)
    if run is not None and run.status.value == "failed":
        raise typer.Exit(1)


def status(
    run_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show a run's status, phase, epoch, attempts, owner, sandbox host, lease and error;
    for a queued run, how many runs of its session it waits behind (0: it starts next)."""
    with client_from_env() as client:
        run = client.require(run_id)
        journal = client.store.get_turn_slot(run_id)
        info = describe(run, journal.phase.value if journal else None)
        info["waiting_behind"] = client.store.waiting_behind(run_id)
        info["takeovers"] = takeover_counts(client.store.takeovers_of(run_id))
    if as_json:
        print(json.dumps(info))
        return
    for key, value in info.items():
        shown = ", ".join(f"{k} {n}" for k, n in value.items()) if key == "takeovers" else value
        console.print(f"{key:<17} {shown if shown is not None else '-'}", highlight=False)


def describe(run: Run, phase: str | None) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.astimezone(UTC).isoformat() if value else None

    return {
        "run_id": run.run_id,
        "session_id": run.session_id,
        "status": run.status.value,
        "phase": phase,
        "epoch": run.epoch,
        "attempt_count": run.attempt_count,
        "max_attempts": run.max_attempts,
        "owner": run.owner,
        "host": run.sandbox_host,
        "lease_expires_at": iso(run.lease_expires_at),
        "cancel_requested_at": iso(run.cancel_requested_at),
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "error": run.error,
    }


def takeover_counts(by_cause: dict[str, int]) -> dict[str, int]:
    """How often the run was handed over, by cause: always crash and lease, forced
    when an operator forced one."""
    shown = {"crash": by_cause.get("crash", 0), "lease": by_cause.get("lease", 0)}
    if by_cause.get("forced"):
        shown["forced"] = by_cause["forced"]
    return shown


def cancel(run_id: str) -> None:
    """Cancel a run: a queued one at once, a running one within one heartbeat."""
    with client_from_env() as client:
        run = client.cancel(run_id)
    console.print(f"{run.run_id} {run.status.value}", highlight=False)


def runs(
    status_filter: Annotated[
        str | None, typer.Option("--status", help="Only runs with this status.")
    ] = None,
    session: Annotated[str | None, typer.Option("--session", help="Only this session.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
) -> None:
    """The newest runs as a table: status, phase, epoch, attempts, owner, lease age."""
    with client_from_env() as client:
        listed = client.list_runs(status=status_filter, session_id=session, limit=limit)
        now = client.store.database_now()
        table = Table("run", "status", "phase", "epoch", "attempts", "owner", "lease")
        for run in listed:
            journal = client.store.get_turn_slot(run.run_id)
            lease = "-"
            if run.lease_expires_at is not None and run.status.value == "running":
                left = (run.lease_expires_at - now).total_seconds()
                lease = f"{left:.1f}s left" if left >= 0 else f"expired {-left:.1f}s ago"
            table.add_row(
                run.run_id,
                run.status.value,
                journal.phase.value if journal else "-",
                str(run.epoch),
                f"{run.attempt_count}/{run.max_attempts}",
                run.owner or "-",
                lease,
            )
    console.print(table)
