"""One turn's life on a worker, fresh or taken over (ARCHITECTURE §3.2, §3.3)."""

from __future__ import annotations

import structlog

from turnkeeper.driver import lifecycle
from turnkeeper.driver.attempt import Attempt
from turnkeeper.driver.output import LEASE_RENEWALS, end_log
from turnkeeper.errors import OwnershipLostError, ServiceError, TurnkeeperError
from turnkeeper.store.records import Claim, RunStatus
from turnkeeper.workers.lease import LeaseKeeper
from turnkeeper.workers.runtime import WorkerRuntime

log = structlog.get_logger(__name__)


def run_turn(runtime: WorkerRuntime, run_id: str) -> bool:
    """Claim a queued run and drive it; False when it was not ours to claim."""
    settings = runtime.settings
    claim = runtime.store.claim_run(run_id, runtime.owner, settings.lease_ttl)
    if claim is None:
        log.info("run.claim_skipped", run_id=run_id)
        return False
    _own(runtime, claim, fresh=True)
    return True


def take_over(runtime: WorkerRuntime, run_id: str, attempt_id: str, epoch: int) -> bool:
    """Drive a run handed to ``attempt_id`` by the reconciler; False when that is stale."""
    run = runtime.store.get_run(run_id)
    if run is None or run.status is not RunStatus.RUNNING or run.attempt_id != attempt_id:
        log.info("takeover.stale", run_id=run_id, attempt_id=attempt_id, epoch=epoch)
        return False
    _own(runtime, Claim(run_id, attempt_id, epoch), fresh=False)
    return True


def _own(runtime: WorkerRuntime, claim: Claim, *, fresh: bool) -> None:
    settings = runtime.settings
    bound = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)
    keeper = LeaseKeeper(
        runtime.store,
        claim,
        lease_ttl=settings.lease_ttl,
        interval=settings.heartbeat_interval,
        on_renewed=lambda: runtime.log.count(LEASE_RENEWALS),
    ).start()
    try:
        # From here on, every append of an earlier attempt is refused by Redis itself.
        stored_epoch = runtime.log.fence(claim.run_id, claim.epoch)
        if stored_epoch > claim.epoch:
            bound.info("takeover.superseded", stored_epoch=stored_epoch)
            return
        run = runtime.store.get_run(claim.run_id)
        if run is None or run.attempt_id != claim.attempt_id:
            bound.info("takeover.superseded")
            return
        Attempt(runtime, claim, run, keeper).drive(fresh=fresh)
    except OwnershipLostError as exc:
        # Expected when a successor took over: stop writing, leave the sandbox to it.
        bound.info("attempt.stopped", reason=exc.reason)
    except ServiceError:
        raise  # retries ran out: the lease will expire and a successor takes over
    except TurnkeeperError as exc:
        if keeper.lost.is_set() or not runtime.store.renew_lease(claim, settings.lease_ttl):
            bound.info("attempt.stopped", reason="lease-lost", error=str(exc))
            return
        _fail(runtime, claim, exc)
    finally:
        keeper.stop()


def _fail(runtime: WorkerRuntime, claim: Claim, exc: TurnkeeperError) -> None:
    """A failure that a successor could not fix (a diverged replay, a bad agent spec):
    end the log with the reason and settle the run failed."""
    reason = exc.reason or type(exc).__name__
    log.error(
        "run.failed",
        run_id=claim.run_id,
        attempt_id=claim.attempt_id,
        epoch=claim.epoch,
        reason=reason,
        error=str(exc),
    )
    end_log(runtime.log, claim.run_id, claim.epoch, lifecycle.run_error(exc.message, reason))
    runtime.store.settle_run(claim, RunStatus.FAILED, {"reason": reason, "message": exc.message})


__all__ = ["run_turn", "take_over"]
