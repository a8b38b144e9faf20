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
from turnkeeper.store.records import WorkerSlot
from turnkeeper.tasks import control_queue, host_queue, queue_depths, turns_queue
from turnkeeper.web.views import iso

if TYPE_CHECKING:
    from turnkeeper.web.app import WebState

log = structlog.get_logger(__name__)

SHOWN_FOR = 600.0
"""Seconds a stopped worker stays on the page (as stopped) after its last heartbeat."""


def fleet_page(state: WebState, minutes: int) -> dict[str, Any]:
    store = state.client.store
    settings = state.settings
    slots = store.worker_slots(settings.host_dead_after, SHOWN_FOR)
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
    return {
        "now": iso(store.database_now()),
        "minutes": minutes,
        "host_dead_after": settings.host_dead_after,
        "lease_ttl": settings.lease_ttl,
        "beat_interval": settings.host_beacon_interval,
        "workers": _workers(slots),
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
            "p50": latency.p50,
            "p95": latency.p95,
            "max": latency.max,
        },
        "open_streams": {
            "now": state.metrics.streams.open,
            "per_minute": [
                {"minute": iso(datetime.fromtimestamp(start, UTC)), "peak": peak}
                for start, peak in state.metrics.streams.peaks(minutes)
            ],
        },
    }


def _workers(slots: list[WorkerSlot]) -> list[dict[str, Any]]:
    """The slots grouped by their Celery worker (host and main process), in store order."""
    grouped: dict[tuple[str, int], list[WorkerSlot]] = {}
    for slot in slots:
        grouped.setdefault((slot.host_id, slot.main_pid), []).append(slot)
    return [
        {
            "host_id": host_id,
            "main_pid": main_pid,
            "alive": any(slot.alive for slot in own),
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
