"""Where runs stand: ``turnkeeper status RUN_ID`` (one run) and ``turnkeeper runs`` (the
runs list, filtered and paged as the HTTP API's ``GET /runs``).

Both read the store alone: no log, no broker, so a script may call them in a loop.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnkeeper.cli.context import store_from_env
from turnkeeper.cli.params import (
    Json,
    KeyFilter,
    Limit,
    Offset,
    RunId,
    RunStatusName,
    SearchFilter,
    checked_id,
    page_line,
    time_bound,
    zoned_time,
)
from turnkeeper.cli.render import columns, printable

if TYPE_CHECKING:
    from turnkeeper.store.records import Run

SETTLED = frozenset({"completed", "failed", "aborted"})
"""A settled run has no lease: its last owner's expiry says nothing any more."""


def status(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show a run's status, phase, epoch, attempts, owner, sandbox host, lease (while it
    runs) and error (its reason and message); for a queued run, how many runs of its
    session it waits behind (0: it starts next)."""
    from turnkeeper.errors import RunNotFoundError

    with store_from_env() as store:
        run = store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"no run has the id {run_id!r}", run_id=run_id)
        journal = store.get_turn_slot(run_id)
        info = describe(run, journal.phase.value if journal else None)
        info["waiting_behind"] = store.waiting_behind(run_id)
        info["takeovers"] = takeover_counts(store.takeovers_of(run_id))
    if as_json:
        print(json.dumps(info))
        return
    print("\n".join(status_lines(info)))


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


_LABEL = 20  # the longest label, cancel_requested_at, and a space


def status_lines(info: dict[str, Any]) -> list[str]:
    """``status``'s lines: one per field, labelled as in ``--json``. A settled run shows
    no lease; its error is its reason and message, then any detail it carries (the
    agent's exit code, the tail of its stderr, the limits it hit) on lines of their own."""
    lines = []
    for key, value in info.items():
        if key == "lease_expires_at" and info["status"] in SETTLED:
            continue
        if key == "error" and isinstance(value, dict):
            lines += _error_lines(value)
        elif key == "takeovers":
            lines.append(_line(key, ", ".join(f"{k} {n}" for k, n in value.items())))
        else:
            lines.append(_line(key, value))
    return lines


def _error_lines(error: dict[str, Any]) -> list[str]:
    reason, message = error.get("reason"), error.get("message")
    headline = ": ".join(str(part) for part in (reason, message) if part is not None)
    lines = [_line("error", headline or "-")]
    for key, value in error.items():
        if key not in {"reason", "message"}:
            lines.append(_line(f"  {key}", value))
    return lines


def _line(label: str, value: Any) -> str:
    if value is None or value == "":
        shown = "-"
    elif isinstance(value, dict):
        shown = printable(", ".join(f"{k} {v}" for k, v in value.items()))
    else:
        shown = printable(str(value).rstrip("\n"), lines=True)  # an agent's stderr, say
    # A value of many lines (a stderr tail) goes on under its label, not at the margin.
    return f"{label:<{_LABEL}}" + shown.replace("\n", "\n" + " " * _LABEL)


def runs(
    status_filter: Annotated[
        RunStatusName | None, typer.Option("--status", help="Only runs with this status.")
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            metavar="SESSION",
            help="Only the runs of this session.",
            callback=checked_id("session_id"),
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            metavar="AGENT",
            help="Only runs of this agent: a preset (scripted, claude-code, codex) or an "
            "inline command's program.",
            callback=checked_id("agent"),
        ),
    ] = None,
    key: KeyFilter = None,
    search: SearchFilter = None,
    created_since: Annotated[
        str | None,
        time_bound("--created-since", "Only runs created at TIME or later (ISO 8601, zoned)."),
    ] = None,
    created_until: Annotated[
        str | None, time_bound("--created-until", "Only runs created before TIME.")
    ] = None,
    finished_since: Annotated[
        str | None, time_bound("--finished-since", "Only runs that finished at TIME or later.")
    ] = None,
    finished_until: Annotated[
        str | None, time_bound("--finished-until", "Only runs that finished before TIME.")
    ] = None,
    limit: Limit = 50,
    offset: Offset = 0,
    as_json: Json = False,
) -> None:
    """The newest runs first, as a table with their ids whole, or with --json as the HTTP
    API's run listing (GET /runs). The last line says which runs of how many it showed,
    and the --offset of the next page."""
    from turnkeeper.store.records import RunWindow
    from turnkeeper.web.views import run_listing

    window = RunWindow(
        created_since=zoned_time(created_since),
        created_until=zoned_time(created_until),
        finished_since=zoned_time(finished_since),
        finished_until=zoned_time(finished_until),
    )
    filters = {
        "status": status_filter,
        "session_id": session,
        "agent": agent,
        "key_name": key,
        "search": search,
        "window": window,
    }
    with store_from_env() as store:
        listing = run_listing(store, filters, limit=limit, offset=offset, owners=True)
    if as_json:
        print(json.dumps(listing))
        return
    views: list[dict[str, Any]] = listing["runs"]
    if views:
        headers = ("run", "status", "agent", "phase", "epoch", "attempts", "owner", "lease")
        print(columns(headers, [_run_row(view) for view in views]))
    shown = len(views)
    exact = listing["total_exact"]
    print(
        page_line(
            "runs", shown=shown, offset=offset, limit=limit, total=listing["total"], exact=exact
        )
    )


def _run_row(view: dict[str, Any]) -> list[str]:
    left = view["lease_seconds_left"]
    lease = "-"
    if left is not None:
        lease = f"{left:.1f}s left" if left >= 0 else f"expired {-left:.1f}s ago"
    return [
        view["run_id"],
        view["status"],
        view["agent"] or "-",
        view["phase"] or "-",
        str(view["epoch"]),
        f"{view['attempt_count']}/{view['max_attempts']}",
        view["owner"] or "-",
        lease,
    ]
