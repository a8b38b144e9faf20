"""JSON shapes of runs and transcript entries, as the API and the dashboard show them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from turnkeeper.store.records import AttemptRecord, Run, RunStatus, TranscriptEntry, TurnSlot

if TYPE_CHECKING:
    from turnkeeper.store.store import Store

MAX_COUNTED = 10_000
"""A list counts its matches up to this many (``total_exact`` is false past it)."""


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


PROMPT_PREVIEW_CHARS = 500
"""How much of its prompt a run shows in a list (``prompt_preview``); the whole prompt
is on ``GET /runs/{run_id}``, and a list of a hundred runs stays small."""


def run_view(
    run: Run,
    journal: TurnSlot | None,
    now: datetime,
    waiting_behind: int | None = None,
    *,
    owners: bool,
) -> dict[str, Any]:
    """A run for operators: status, phase, epoch, attempts, owner and the lease on the DB
    clock; how long it ran (``duration_seconds``: from its start to its end, or to now
    while it runs); the start of its prompt; for a queued run, how many runs of its
    session it waits behind (0: it starts next).

    Never its payload whole (the sealed env) nor its sandbox placement, which holds
    each agent process's sentinel nonce. Its ``owner`` only with ``owners`` (an admin
    key, the operator's command line): an owner id names a worker's host and process
    id, the fleet's business and no tenant's; a tenant's key gets null there."""
    lease_left = None
    if run.lease_expires_at is not None and run.status.value == "running":
        lease_left = round((run.lease_expires_at - now).total_seconds(), 3)
    ended = run.finished_at if run.finished_at is not None else now
    return {
        "run_id": run.run_id,
        "session_id": run.session_id,
        "key_name": run.key_name,
        "agent": agent_name(run.payload),
        "status": run.status.value,
        "phase": journal.phase.value if journal else None,
        "turn_index": journal.turn_index if journal else None,
        "epoch": run.epoch,
        "attempt_count": run.attempt_count,
        "max_attempts": run.max_attempts,
        "owner": run.owner if owners else None,
        "lease_expires_at": iso(run.lease_expires_at),
        "lease_seconds_left": lease_left,
        "cancel_requested_at": iso(run.cancel_requested_at),
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "duration_seconds": _seconds(run.started_at, ended),
        "prompt_preview": prompt_preview(run.payload),
        "error": run.error,
        "waiting_behind": waiting_behind,
    }


def run_listing(
    store: Store, filters: dict[str, Any], *, limit: int, offset: int, owners: bool
) -> dict[str, Any]:
    """A page of runs as ``GET /runs`` answers it (and ``turnkeeper runs --json``): the
    runs matching ``filters`` (``Store.list_runs``'s), how many match (counted up to
    ``MAX_COUNTED``), the page, and the database's clock their times are read against;
    their owners with ``owners`` (``run_view``)."""
    runs = store.list_runs(**filters, limit=limit, offset=offset)
    total = store.count_runs(**filters, most=MAX_COUNTED + 1)
    now = store.database_now()
    views = []
    for run in runs:
        behind = store.waiting_behind(run.run_id) if run.status is RunStatus.QUEUED else None
        views.append(run_view(run, store.get_turn_slot(run.run_id), now, behind, owners=owners))
    return {
        "runs": views,
        "total": min(total, MAX_COUNTED),
        "total_exact": total <= MAX_COUNTED,
        "offset": offset,
        "limit": limit,
        "now": now.isoformat(),
    }


def prompt_preview(payload: Any) -> str | None:
    """The start of a run's prompt: its first ``PROMPT_PREVIEW_CHARS`` characters."""
    prompt = payload.get("prompt") if isinstance(payload, dict) else None
    return prompt[:PROMPT_PREVIEW_CHARS] if isinstance(prompt, str) else None


def agent_name(payload: Any) -> str | None:
    """The agent a run names: its preset, or its inline command's program (what the
    runs list filters by, ``sql.statement.RUN_AGENT``)."""
    agent = payload.get("agent") if isinstance(payload, dict) else None
    if not isinstance(agent, dict):
        return None
    preset = agent.get("preset")
    if isinstance(preset, str):
        return preset
    command = agent.get("command")
    return command[0] if isinstance(command, list) and command else None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def attempt_views(attempts: list[AttemptRecord], *, owners: bool) -> list[dict[str, Any]]:
    """A run's attempts, oldest first, numbered from 1. A takeover's attempt (every one
    after the first) carries ``log_seq``, the first log seq it could append;
    ``handover_seconds``, from its predecessor's handover to its adoption; and
    ``takeover_seconds``, the pause in the run's output: from the last journal bytes
    its predecessor stored to the first it stored (None when either stored none).
    Each attempt's ``owner`` only with ``owners``, as in ``run_view``."""
    views = []
    previous: AttemptRecord | None = None
    for number, attempt in enumerate(attempts, start=1):
        wait = pause = None
        if previous is not None:
            wait = _seconds(previous.ended_at, attempt.started_at)
            pause = _seconds(previous.last_stored_at, attempt.first_stored_at)
        views.append(
            {
                "attempt": number,
                "attempt_id": attempt.attempt_id,
                "owner": attempt.owner if owners else None,
                "epoch": attempt.epoch,
                "started_at": iso(attempt.started_at),
                "ended_at": iso(attempt.ended_at),
                "outcome": attempt.outcome,
                "handover_cause": attempt.handover_cause,
                "log_seq": attempt.log_seq if previous is not None else None,
                "handover_seconds": wait,
                "takeover_seconds": pause,
            }
        )
        previous = attempt
    return views


def entry_view(entry: TranscriptEntry) -> dict[str, Any]:
    return {
        "entry_id": entry.entry_id,
        "parent_id": entry.parent_id,
        "run_id": entry.run_id,
        "kind": entry.kind,
        "body": entry.body,
        "position": entry.position,
        "created_at": iso(entry.created_at),
    }


def events_path(root_path: str, run_id: str, token: str | None) -> str:
    """The stream URL of a run, relative to the server (works behind a path prefix)."""
    path = f"{root_path}/runs/{quote(run_id, safe='')}/events"
    return path if token is None else f"{path}?token={quote(token, safe='')}"
