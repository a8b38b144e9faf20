"""What the fleet page shows (``GET /fleet``, an admin key's): the worker processes and
the runs they own, the queues' depths, and the fleet's last minutes.

A worker is one ``turnkeeper worker`` (a Celery main process on a host); its slots are
its pool processes, each of which owns at most the runs it drives, with its lease. The
counts per minute and the takeover latencies are read from the store on the database
clock; the open streams are this web process's own (each web process counts its own).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from turnkeeper.errors import BrokerUnavailableError
from turnkeeper.queues import control_queue, host_queue, queue_depths, turns_queue
from turnkeeper.store.records import WorkerSlot
from turnkeeper.web.views import iso

if TYPE_CHECKING:
    from turnkeeper.web.state import WebState

log = structlog.get_logger(__name__)

SHOWN_FOR = 600.0
"""Seconds a stopped worker stays on the page (as stopped) after its last heartbeat."""
OVERDUE_PERIODS = 3
"""A sweep not finished within this many of its periods is overdue."""


def fleet_page(state: WebState, minutes: int) -> dict[str, Any]:
    store = state.client.store
    settings = state.settings
    slots = store.worker_slots(settings.host_dead_after, settings.host_beacon_interval, SHOWN_FOR)
    live_hosts = sorted({slot.host_id for slot in slots if slot.alive})
    queues: list[dict[str, Any]] = [
        {"name": turns_queue(settings), "kind": "turns", "host_id": None},
        {"name": control_queue(settings), "kind": "control", "host_id": None},
        *({"name": host_queue(settings, h), "kind": "host", "host_id": h} for h in live_hosts),
    ]
    broker = "ok"
    try:
        depths = queue_depths(state.client.app, [queue["name"] for queue in queues])
    except BrokerUnavailableError as exc:
        log.warning("fleet.queues.unavailable", error=str(exc))
        broker, depths = "unavailable", {}
    counts = store.fleet_counts()
    latency = store.takeover_latency(minutes)
    activity = store.fleet_activity(minutes)
    workers = _workers(slots)
    now = store.database_now()
    started = [slot.started_at for slot in slots if slot.alive]
    up_seconds = (now - min(started)).total_seconds() if started else None
    return {
        "now": iso(now),
        "minutes": minutes,
        "host_dead_after": settings.host_dead_after,
        "lease_ttl": settings.lease_ttl,
        "beat_interval": settings.host_beacon_interval,
        "workers": workers,
        "slots": {
            "live": sum(w["slots_live"] for w in workers if w["alive"]),
            "busy": sum(w["slots_busy"] for w in workers if w["alive"]),
        },
        "sweeps": _sweeps(state, up_seconds),
        "awaiting_adoption": [
            {"run_id": run_id, "epoch": epoch, "waiting_seconds": round(waited, 3)}
            for run_id, epoch, waited in store.awaiting_adoption()
        ],
        "broker": broker,
        "queues": [{**queue, "depth": depths.get(queue["name"])} for queue in queues],
        "runs_by_status": counts.runs_by_status,
        "expired_leases": counts.expired_leases,
        "takeovers_by_cause": counts.takeovers_by_cause,
        "activity": [
            {
                "minute": iso(m.minute),
                "started": m.started,
                "settled": m.settled,
                "takeovers": m.takeovers,
            }
            for m in activity
        ],
        "takeover_latency": {
            "buckets": [
                {"le": bound, "count": count}
                for bound, count in zip((*latency.bounds, None), latency.counts, strict=True)
            ],
            "count": latency.count,
            "p50": _rounded(latency.p50),
            "p95": _rounded(latency.p95),
            "max": _rounded(latency.max),
        },
        "open_streams": {
            "now": state.metrics.streams.open,
            "per_minute": [
                {"minute": iso(datetime.fromtimestamp(start, UTC)), "peak": peak}
                for start, peak in state.metrics.streams.peaks(minutes)
            ],
        },
    }


def _sweeps(state: WebState, up_seconds: float | None) -> list[dict[str, Any]]:
    """Beat's periodic sweeps: when each last finished, and whether it is overdue (not
    within three of its periods: beat, or the control worker that runs its sweeps, has
    stopped or cannot keep up). Beat runs a sweep first one period after it starts, so
    one never recorded is overdue only once the fleet's oldest live worker process has
    been up for three of its periods (``up_seconds``; None: no live worker)."""
    settings = state.settings
    every = {
        "reconcile": settings.reconcile_interval,
        "reap": settings.reap_interval,
        "prune": settings.prune_interval,
    }
    done = {sweep.name: sweep for sweep in state.client.store.sweeps()}
    views = []
    for name, period in every.items():
        sweep = done.get(name)
        ago = None if sweep is None else round(sweep.seconds_ago, 3)
        views.append(
            {
                "name": name,
                "every_seconds": period,
                "finished_at": None if sweep is None else iso(sweep.finished_at),
                "seconds_ago": ago,
                "overdue": (ago if ago is not None else up_seconds or 0.0)
                > OVERDUE_PERIODS * period,
            }
        )
    return views


def _workers(slots: list[WorkerSlot]) -> list[dict[str, Any]]:
    """The slots grouped by their Celery worker (host and main process), in store order.
    Only live slots count (``slots_live``, ``slots_busy``): a killed pool process stays
    listed as stopped, never as a slot that could take a run."""
    grouped: dict[tuple[str, int], list[WorkerSlot]] = {}
    for slot in slots:
        grouped.setdefault((slot.host_id, slot.main_pid), []).append(slot)
    return [
        {
            "host_id": host_id,
            "main_pid": main_pid,
            "alive": any(slot.alive for slot in own),
            "slots_live": sum(1 for slot in own if slot.alive),
            "slots_busy": sum(1 for slot in own if slot.alive and slot.runs),
            "draining": any(slot.draining for slot in own),
            "started_at": iso(min(slot.started_at for slot in own)),
            "silent_seconds": round(min(slot.silent_seconds for slot in own), 3),
            "slots": [
                {
                    "worker_id": slot.worker_id,
                    "pid": slot.pid,
                    "alive": slot.alive,
                    "silent_seconds": round(slot.silent_seconds, 3),
                    "runs": [
                        {
                            "run_id": run.run_id,
                            "epoch": run.epoch,
                            "held_seconds": _rounded(run.held_seconds),
                            "lease_seconds_left": _rounded(run.lease_seconds_left),
                        }
                        for run in slot.runs
                    ],
                }
                for slot in own
            ],
        }
        for (host_id, main_pid), own in grouped.items()
    ]


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
