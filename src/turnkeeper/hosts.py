"""Hosts: which host holds a run's sandbox, and which host's queue its work goes to.

A ``local`` or ``bwrap`` sandbox is a directory on one host's disk and its agent a
process of that host's kernel: only that host can resume it, spawn in it or signal
it. An ``ssh`` sandbox lives on the ssh host, which every worker reaches alike. The
placement record names the host that made the run's sandbox (``Placement.host``,
copied to ``runs.sandbox_host``); these pure functions turn that into decisions,
for the reconciler, the takeover task and the placer alike (docs/architecture.md,
"Hosts").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from turnkeeper.config import Settings
from turnkeeper.store.records import Run
from turnkeeper.store.store import Store

HOST_LOCAL_PROVIDERS = frozenset({"local", "bwrap"})
"""Providers whose sandboxes live on the disk of the host that made them."""


def provider_of(run: Run) -> str | None:
    sandbox = (run.sandbox_ref or {}).get("sandbox")
    provider = sandbox.get("provider") if isinstance(sandbox, dict) else None
    return provider if isinstance(provider, str) else None


def holding_host(run: Run) -> str | None:
    """The host that holds the run's sandbox, when only that host can act on it; None
    when any host can (ssh), the run has no sandbox, or no host was recorded (a run
    placed before hosts were)."""
    if provider_of(run) not in HOST_LOCAL_PROVIDERS:
        return None
    return run.sandbox_host


def takeover_host(run: Run, settings: Settings, alive: Callable[[str], bool]) -> str | None:
    """Whose queue a takeover of ``run`` goes to; None is the shared turns queue.

    The holding host's, as long as it is ``alive``: the agent may still be running
    there, and only that host can follow it. Once the host is dead, any worker takes
    the run over and finds the sandbox lost (``can_read``). On a shared sandboxes
    volume any host can follow the journal, so no takeover waits for a host.
    """
    host = holding_host(run)
    if host is None or settings.sandboxes_shared or not alive(host):
        return None
    return host


def can_read(provider: str, host: str | None, settings: Settings) -> bool:
    """Whether this worker can resume a sandbox made by ``host`` and follow its journal."""
    return settings.sandboxes_shared or can_spawn(provider, host, settings)


def can_spawn(provider: str, host: str | None, settings: Settings) -> bool:
    """Whether this worker can start and signal processes in a sandbox made by ``host``:
    its cgroup, its uid and its processes belong to that host's kernel."""
    return provider not in HOST_LOCAL_PROVIDERS or host is None or host == settings.host_id


def route_takeover(store: Store, settings: Settings, run_id: str) -> str | None:
    """The one routing decision of a takeover message (``takeover_host``, with the
    holding host's liveness read on the database clock): every sender and the
    takeover task itself ask here."""
    run = store.get_run(run_id)
    if run is None:
        return None
    return takeover_host(
        run, settings, lambda host: store.host_alive(host, settings.host_dead_after)
    )


def run_host(store: Store, settings: Settings, run_id: str) -> str | None:
    """Whose queue a new run goes to; None is the shared turns queue.

    The host that made its session's workspace, while that host is alive: a
    ``local`` or ``bwrap`` workspace is on its disk, and only it can start the agent
    there (``can_spawn``). Elsewhere the run would start in a fresh workspace. Once
    the host is dead any worker takes the run, and it says it started afresh."""
    run = store.get_run(run_id)
    if run is None or not run.keeps_workspace:
        return None
    workspace = store.session_workspace(run.session_id)
    if workspace is None or workspace.sandbox is None or workspace.host is None:
        return None
    if workspace.sandbox.get("provider") not in HOST_LOCAL_PROVIDERS:
        return None
    return workspace.host if store.host_alive(workspace.host, settings.host_dead_after) else None


def fleet_view(store: Store, settings: Settings) -> list[dict[str, Any]]:
    """Every host the store knows (from its workers' heartbeats and from the hosts its
    runs' placements name): alive or not, its worker processes, and the sandboxes it
    holds. What ``turnkeeper hosts`` prints and ``GET /fleet/hosts`` answers."""
    workers = store.workers(settings.host_dead_after)
    sandboxes = store.placed_sandboxes()
    names = sorted({w.host_id for w in workers} | {s.sandbox_host or "" for s in sandboxes})
    view = []
    for name in names:
        own = [w for w in workers if w.host_id == name]
        seen = max((w.last_seen for w in own), default=None)
        view.append(
            {
                "host_id": name or None,
                "alive": any(w.alive for w in own),
                "last_seen": _iso(seen),
                "workers": [
                    {
                        "worker_id": w.worker_id,
                        "pid": w.pid,
                        "main_pid": w.main_pid,
                        "alive": w.alive,
                        "started_at": _iso(w.started_at),
                        "last_seen": _iso(w.last_seen),
                        "draining": w.draining_at is not None,
                    }
                    for w in own
                ],
                "sandboxes": [
                    {
                        "run_id": s.run_id,
                        "status": s.status.value,
                        "provider": s.provider,
                        "sandbox_id": s.sandbox_id,
                        "owner": s.owner,
                        "awaiting_adoption": s.awaiting_adoption,
                    }
                    for s in sandboxes
                    if (s.sandbox_host or "") == name
                ],
            }
        )
    return view


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None
