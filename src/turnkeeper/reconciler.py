"""The beat-driven sweeps: hand expired runs over to new attempts, reap sandboxes, prune.

Reaping has two shares (docs/architecture.md, "Hosts"): the fleet's, which any host
can do (sandboxes no single host holds, open logs), and each host's own (its
settled sandboxes, its orphans, what destroyed sandboxes left in its kernel), which
beat sends to that host's queue.

Every sweep is safe to run several times at once (two beats, an operator's
``--once``): rows are taken with ``FOR UPDATE SKIP LOCKED`` in the store, log
writes are fenced, and destroying a sandbox twice is a no-op. Each records when it
finished (``Store.record_sweep``): the fleet page warns once a sweep is overdue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from turnkeeper.driver import lifecycle
from turnkeeper.driver.ending import end_unowned_log
from turnkeeper.errors import SandboxError, ServiceError, TurnkeeperError
from turnkeeper.hosts import HOST_LOCAL_PROVIDERS
from turnkeeper.sandbox import SandboxRef
from turnkeeper.store.records import Claim, Run
from turnkeeper.store.workspaces import IdleWorkspace
from turnkeeper.workers.runtime import WorkerRuntime

log = structlog.get_logger(__name__)

BATCH = 100


@dataclass(frozen=True)
class ReconcileReport:
    taken_over: int
    """Expired runs handed over to new attempts (each awaits a worker's adoption)."""
    redispatched: int
    """Takeover messages sent again for handed-over runs nobody adopted in time."""
    failed: int
    requeued: int
    rerouted: int = 0
    """Takeovers sent to a host's queue whose host has died since: sent on to any worker."""


@dataclass(frozen=True)
class ReapReport:
    destroyed: int
    orphans: int
    logs_ended: int

    def __add__(self, other: ReapReport) -> ReapReport:
        return ReapReport(
            self.destroyed + other.destroyed,
            self.orphans + other.orphans,
            self.logs_ended + other.logs_ended,
        )


def reconcile(
    rt: WorkerRuntime,
    *,
    enqueue_takeover: Callable[[str, str, int], None],
    enqueue_run: Callable[[str], None],
) -> ReconcileReport:
    """Expired leases -> handed over (takeover enqueued); exhausted runs -> failed.

    A handover fences the expired attempt at once, in the store and in the run log,
    but spends no attempt: the attempt counts, and its lease starts, when a worker
    adopts it (``driver.take_over``). A takeover message nobody acted on within
    ``requeue_after`` is sent again, for the same attempt and epoch, exactly like a
    queued run's; however often that happens, only one worker adopts the attempt.

    ``enqueue_takeover`` routes each message (``hosts.route_takeover``): to the queue
    of the host holding the run's sandbox while that host is alive, so the takeover
    waits for it without spending anything. Once the host has been unseen for
    ``host_dead_after``, its waiting takeovers are sent once more, now to any worker,
    which finds the sandbox lost (the run continues, or fails ``sandbox-lost``).
    """
    settings = rt.settings
    failed = rt.store.expire_exhausted(BATCH)
    for run in failed:
        try:
            end_run_log(rt, run)
        except TurnkeeperError as exc:  # settled already: the reaper closes its log
            log.warning("run.log_end_deferred", run_id=run.run_id, error=str(exc))
    handed = rt.store.hand_over_expired(BATCH)
    send_takeovers(rt, handed, enqueue_takeover=enqueue_takeover, cause="lease")
    redispatched = rt.store.redispatch_takeovers(
        settings.requeue_after, BATCH, just_sent=[claim.run_id for claim in handed]
    )
    for claim in redispatched:
        enqueue_takeover(claim.run_id, claim.attempt_id, claim.epoch)
        log.info("takeover.redispatched", run_id=claim.run_id, epoch=claim.epoch)
    rerouted = (
        []
        if settings.sandboxes_shared
        else rt.store.takeovers_of_dead_hosts(settings.host_dead_after, BATCH)
    )
    for claim in rerouted:
        enqueue_takeover(claim.run_id, claim.attempt_id, claim.epoch)
        log.info("takeover.host_dead", run_id=claim.run_id, epoch=claim.epoch)
    stale = rt.store.stale_queued_runs(settings.requeue_after, BATCH)
    for run in stale:
        enqueue_run(run.run_id)
        rt.store.mark_dispatched(run.run_id)
        log.info("run.requeued", run_id=run.run_id)
    report = ReconcileReport(len(handed), len(redispatched), len(failed), len(stale), len(rerouted))
    if handed or redispatched or failed or stale or rerouted:
        log.info("reconcile.done", **report.__dict__)
    rt.store.record_sweep("reconcile")
    return report


def send_takeovers(
    rt: WorkerRuntime,
    handed: list[Claim],
    *,
    enqueue_takeover: Callable[[str, str, int], None],
    cause: str,
) -> None:
    """After a handover (a lease that ran out, or an owner gone, ``turnkeeper.watcher``):
    fence each run's log at its new epoch and send its takeover message."""
    for claim in handed:
        _fence_log(rt, claim)
        enqueue_takeover(claim.run_id, claim.attempt_id, claim.epoch)
        log.info("takeover.enqueued", run_id=claim.run_id, epoch=claim.epoch, cause=cause)


def _fence_log(rt: WorkerRuntime, claim: Claim) -> None:
    """Refuse the expired attempt's appends to the run log now, not only once a worker
    adopts its successor (which fences again, at the same epoch). Best effort: a log
    that cannot be reached now is fenced by the adopter."""
    try:
        rt.log.fence(claim.run_id, claim.epoch)
    except TurnkeeperError as exc:
        log.warning("takeover.fence_deferred", run_id=claim.run_id, error=str(exc))


def end_run_log(rt: WorkerRuntime, run: Run) -> None:
    """End the log of a run settled without its owner (or whose owner died right
    after settling it): what the store holds and the log lacks, then the final chunk
    its status and error call for (``driver/ending.py``).

    The fence at ``epoch + 1`` refuses anything its last owner might still append.
    """
    end_unowned_log(rt.log, rt.store, run)
    final = lifecycle.final_chunk(run)
    log.info("run.log_ended", run_id=run.run_id, final=final["type"], reason=final.get("code"))


def reap(rt: WorkerRuntime) -> ReapReport:
    """Both shares at once, here: what one host (an operator's ``reap``) can do."""
    return reap_fleet(rt) + reap_host(rt)


def reap_fleet(rt: WorkerRuntime) -> ReapReport:
    """The fleet's share: the sandboxes of settled runs no single host holds (ssh, or
    placed before hosts were recorded), the workspaces of such idle sessions, and the
    logs a crash left open."""
    runs = rt.store.runs_to_reap(BATCH, host_local=HOST_LOCAL_PROVIDERS)
    idle = rt.store.idle_workspaces(rt.settings.session_ttl, BATCH, host_local=HOST_LOCAL_PROVIDERS)
    destroyed = _destroy_settled(rt, runs) + _retire_idle(rt, idle)
    report = ReapReport(destroyed, 0, _end_open_logs(rt))
    if report.destroyed or report.logs_ended:
        log.info("reap.done", share="fleet", **report.__dict__)
    rt.store.record_sweep("reap")
    return report


def reap_host(rt: WorkerRuntime) -> ReapReport:
    """This host's share: the sandboxes of settled runs it made, the workspaces it made
    of sessions idle for the session TTL, its orphaned sandboxes older than the orphan
    TTL, and what destroyed sandboxes left here (cgroups, uid claims)."""
    host = rt.settings.host_id
    runs = rt.store.runs_to_reap(BATCH, host=host, host_local=HOST_LOCAL_PROVIDERS)
    idle = rt.store.idle_workspaces(
        rt.settings.session_ttl, BATCH, host=host, host_local=HOST_LOCAL_PROVIDERS
    )
    destroyed = _destroy_settled(rt, runs) + _retire_idle(rt, idle)
    report = ReapReport(destroyed, _reap_orphans(rt) + _sweep(rt), 0)
    if report.destroyed or report.orphans:
        log.info("reap.done", share="host", host=rt.settings.host_id, **report.__dict__)
    return report


def _destroy_settled(rt: WorkerRuntime, runs: list[Run]) -> int:
    """Destroy settled runs' sandboxes; one that is a session's workspace outlives its
    run: the run forgets it (the session's idle reaping destroys it), and what still
    runs there is stopped unless the session has a run under way."""
    kept = rt.store.kept_workspaces() if runs else set()
    destroyed = 0
    for run in runs:
        ref = _sandbox_of(run)
        try:
            if ref is not None and ref.id not in kept:
                rt.provider(ref.provider).destroy(ref)
                destroyed += 1
            elif ref is not None:
                _stop_leftovers(rt, run, ref)
            rt.store.forget_sandbox(run.run_id)
        except TurnkeeperError as exc:
            log.warning("reap.failed", run_id=run.run_id, error=str(exc))
    return destroyed


def _stop_leftovers(rt: WorkerRuntime, run: Run, ref: SandboxRef) -> None:
    """A run settled without its owner (cancelled or given up while it awaited
    adoption, its owner frozen or dead) may have left its agent running in the
    session's workspace, where nothing else would stop it before the session's next
    run or its idle reaping. Stopped only while the session has no run queued or
    running, under its admission lock: never another run's agent. A stop that fails
    is logged and the run forgets its sandbox all the same: the session's next run
    stops what is left before it starts, and a reap that retried it would hold up the
    reaping of every run settled after it."""
    try:
        with rt.store.quiet_workspace(run.session_id, ref.id) as quiet:
            if quiet:
                rt.provider(ref.provider).stop(ref)
    except SandboxError as exc:
        log.warning("reap.stop_failed", run_id=run.run_id, sandbox=ref.id, error=str(exc))


def _retire_idle(rt: WorkerRuntime, idle: list[IdleWorkspace]) -> int:
    """Destroy the workspaces of sessions idle for ``session_ttl``: each is forgotten
    first, under the session's admission lock, so no run is handed one being destroyed;
    one whose destroy fails is an orphan from then on (the orphan reaping retries)."""
    destroyed = 0
    for workspace in idle:
        ref = SandboxRef.from_dict(workspace.sandbox)
        try:
            if not rt.store.retire_workspace(workspace.session_id, ref.id, rt.settings.session_ttl):
                continue
            rt.provider(ref.provider).destroy(ref)
            destroyed += 1
            log.info("reap.workspace", session_id=workspace.session_id, sandbox=ref.id)
        except TurnkeeperError as exc:
            log.warning("reap.workspace_failed", session_id=workspace.session_id, error=str(exc))
    return destroyed


def _end_open_logs(rt: WorkerRuntime) -> int:
    """Close the logs of recently settled runs that a crash left open (a run settled by
    the reconciler or a cancel, whose process died before it closed the log), so that
    no follower waits forever. Only runs settled well within the log's retention are
    looked at: an older log may have expired, and must not be recreated.

    Sweeps overlap: a log another sweep (or the run's owner) ends meanwhile is ended
    once all the same, and one log this sweep cannot end is left to the next sweep
    without keeping it from the others. A service that is down stops the sweep."""
    within = min(3600.0, rt.settings.log_retention / 2)
    ended = 0
    for run in rt.store.recently_settled(within, 500):
        state = rt.log.state(run.run_id)
        if state.closed:
            continue
        try:
            end_run_log(rt, run)
        except ServiceError:
            raise
        except TurnkeeperError as exc:
            log.warning("reap.log_end_failed", run_id=run.run_id, error=str(exc))
            continue
        ended += 1
    return ended


def prune(rt: WorkerRuntime) -> int:
    """Delete segments, slots and transcript rows of runs settled long ago, in batches."""
    total = 0
    while True:
        pruned = rt.store.prune_settled(rt.settings.settled_retention, BATCH)
        total += pruned
        if pruned < BATCH:
            break
    workers = rt.store.prune_workers(rt.settings.settled_retention)
    if total or workers:
        log.info("prune.done", runs=total, workers=workers)
    rt.store.record_sweep("prune")
    return total


def _sandbox_of(run: Run) -> SandboxRef | None:
    return _sandbox_ref(run.sandbox_ref)


def _sandbox_ref(placement: Any) -> SandboxRef | None:
    """The sandbox of a run's placement record (see ``driver.placement.Placement``)."""
    sandbox = placement.get("sandbox") if isinstance(placement, dict) else None
    return SandboxRef.from_dict(sandbox) if sandbox else None


def _sweep(rt: WorkerRuntime) -> int:
    """What destroyed sandboxes left on this host: cgroups, uid claims."""
    try:
        return rt.provider().sweep()
    except TurnkeeperError as exc:
        log.warning("reap.sweep_failed", error=str(exc))
        return 0


def _reap_orphans(rt: WorkerRuntime) -> int:
    """Local sandbox directories that no unsettled run references, nor any session as
    its workspace: at once when a run
    has moved on from it (``superseded_sandboxes``: a host back from a partition finds
    the agent its run left behind still working; not on a shared volume), else once
    older than the TTL.

    Fails closed: a directory whose age cannot be read, or that any unsettled run
    points at, is kept.
    """
    root = Path(rt.settings.sandboxes_dir)
    if not root.is_dir():
        return 0
    keep = {ref.id for ref in map(_sandbox_ref, rt.store.unsettled_sandbox_refs()) if ref}
    keep |= rt.store.kept_workspaces()
    # On a shared volume the dir holds every host's sandboxes, and this host cannot end
    # another's agents; there a run moves on from a sandbox only once its agent is gone.
    superseded = (
        set()
        if rt.settings.sandboxes_shared
        else rt.store.superseded_sandboxes(rt.settings.orphan_ttl) - keep
    )
    cutoff = time.time() - rt.settings.orphan_ttl
    removed = 0
    for entry in root.iterdir():
        if not entry.is_dir() or entry.name in keep:
            continue
        try:
            if entry.name not in superseded and entry.stat().st_mtime > cutoff:
                continue
        except OSError:
            continue
        if entry.name in superseded:
            log.info("reap.superseded", sandbox=entry.name, host=rt.settings.host_id)
        ref = SandboxRef(provider=rt.settings.sandbox_provider, id=entry.name, root=str(entry))
        try:
            rt.provider().destroy(ref)
            removed += 1
        except TurnkeeperError as exc:
            log.warning("reap.orphan_failed", sandbox=entry.name, error=str(exc))
    return removed
