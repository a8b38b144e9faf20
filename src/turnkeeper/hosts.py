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

from turnkeeper.config import Settings
from turnkeeper.store.records import Run

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
