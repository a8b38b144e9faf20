"""Ownership: claims, leases, attempt handoffs, settlement, cancellation.

Every owner write is fenced by the attempt id in the statement itself and
answers a ``Verdict``: done, or refused because another attempt owns the run, or
because the row is not in the state the write needs. A refusal is never an
exception: losing ownership is an expected outcome and never transient.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from turnkeeper.errors import InvalidInputError, StoreError
from turnkeeper.logconfig import get_logger
from turnkeeper.store import sql
from turnkeeper.store.database import Row, StoreBase
from turnkeeper.store.records import (
    BegunRun,
    Claim,
    Run,
    RunStatus,
    Verdict,
    check_claim,
    check_id,
    check_limit,
    check_optional_id,
    check_seconds,
    check_status,
    storable,
    to_json,
)

log = get_logger(__name__)


def _new_attempt_id() -> str:
    return uuid.uuid4().hex


class OwnershipMixin(StoreBase):
    """Who owns a run, and how its ownership ends."""

    def _claim(
        self, name: str, sql: sql.statement.Statement, run_id: str, owner: str, lease_ttl: float
    ) -> Row | None:
        """Run a claiming statement under a new attempt id: its row, or None when the
        run is not claimable (or its session already runs one: the one-running-run-per-
        session index is a safety net, and hitting it is a refusal)."""
        check_id(run_id, "run_id")
        check_id(owner, "owner")
        params = {
            "run_id": run_id,
            "owner": owner,
            "lease_ttl": check_seconds(lease_ttl, "lease_ttl"),
            "attempt_id": _new_attempt_id(),
        }
        try:
            return self._db.one(name, sql, params, run_id=run_id)
        except StoreError as exc:
            if isinstance(exc.__cause__, psycopg.IntegrityError):
                return None
            raise

    def claim_run(self, run_id: str, owner: str, lease_ttl: float) -> Claim | None:
        """Queued -> running under a new attempt, if this run is its session's head."""
        row = self._claim("claim_run", sql.ownership.CLAIM_RUN, run_id, owner, lease_ttl)
        if row is None:
            return None
        claim = Claim.from_row(row)
        log.info("run.claimed", run_id=run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)
        return claim

    def claim_and_begin(self, run_id: str, owner: str, lease_ttl: float) -> BegunRun | None:
        """``claim_run``, and in the same statement the run as claimed, and (unless it
        branches) its input appended under the session's leaf and turn 0 begun: the
        first writes of a fresh run, all under the attempt this statement makes."""
        row = self._claim(
            "claim_and_begin", sql.ownership.CLAIM_AND_BEGIN, run_id, owner, lease_ttl
        )
        if row is None:
            return None
        begun = BegunRun.from_row(row)
        claim = begun.claim
        log.info(
            "run.claimed",
            run_id=run_id,
            attempt_id=claim.attempt_id,
            epoch=claim.epoch,
            begun=begun.slot is not None,
        )
        return begun

    def renew_lease(self, claim: Claim, lease_ttl: float) -> Verdict:
        """Extend the lease from the database clock; NOT_OWNER means ownership is lost."""
        check_claim(claim)
        ttl = check_seconds(lease_ttl, "lease_ttl")
        params = {"run_id": claim.run_id, "attempt_id": claim.attempt_id, "lease_ttl": ttl}
        verdict = self._owner_write("renew_lease", sql.ownership.RENEW_LEASE, params, claim)
        if verdict is not Verdict.DONE:
            log.warning(
                "lease.lost", run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch
            )
        return verdict

    def release_lease(self, claim: Claim, *, give_back_attempt: bool) -> Verdict:
        """Let the lease go now: the next reconcile hands the run to a new attempt. The
        agent and its journal go on. A draining worker gives the attempt back (a drain
        never costs a run an attempt); an attempt whose retries ran out does not."""
        check_claim(claim)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "give_back": int(give_back_attempt),
        }
        verdict = self._owner_write("release_lease", sql.ownership.RELEASE_LEASE, params, claim)
        if verdict is Verdict.DONE:
            log.info(
                "lease.released",
                run_id=claim.run_id,
                attempt_id=claim.attempt_id,
                epoch=claim.epoch,
            )
        return verdict

    def replace_turn_slot_attempt(
        self,
        run_id: str,
        expected_attempt_id: str,
        owner: str,
        lease_ttl: float,
        *,
        only_if_expired: bool = True,
    ) -> Claim | None:
        """Hand a running run to a new attempt (epoch + 1) in one transaction.

        Refused (None) unless the run is running under ``expected_attempt_id`` and,
        with ``only_if_expired``, its lease has expired on the database clock.
        """
        check_id(run_id, "run_id")
        check_id(expected_attempt_id, "attempt_id")
        check_id(owner, "owner")
        ttl = check_seconds(lease_ttl, "lease_ttl")
        params = {
            "run_id": run_id,
            "expected_attempt_id": expected_attempt_id,
            "new_attempt_id": _new_attempt_id(),
            "owner": owner,
            "lease_ttl": ttl,
            "only_if_expired": bool(only_if_expired),
        }
        row = self._db.one(
            "replace_turn_slot_attempt", sql.ownership.REPLACE_ATTEMPT, params, run_id=run_id
        )
        if row is None:
            return None
        claim = Claim.from_row(row)
        log.info(
            "attempt.replaced",
            run_id=run_id,
            attempt_id=claim.attempt_id,
            epoch=claim.epoch,
            superseded=expected_attempt_id,
        )
        return claim

    def hand_over_expired(self, limit: int) -> list[Claim]:
        """Hand up to ``limit`` expired running runs to new attempts, in one transaction.

        The handover fences the expired attempt at once (a new attempt id, epoch + 1:
        its store writes are refused from here on), but the new attempt awaits
        adoption (``adopt_attempt``): it holds no lease and is not counted, so time
        spent waiting for a free worker slot costs no attempt. Rows are locked with
        SKIP LOCKED, so reconcilers running at once get disjoint runs. Runs out of
        attempts, past their deadline or cancelled are left to ``expire_exhausted``.
        """
        rows = self._db.rows(
            "hand_over_expired",
            sql.ownership.HAND_OVER_EXPIRED,
            {"limit": check_limit(limit), "cause": "lease"},
        )
        claims = [Claim.from_row(r) for r in rows]
        for claim in claims:
            log.info(
                "attempt.handed_over",
                run_id=claim.run_id,
                attempt_id=claim.attempt_id,
                epoch=claim.epoch,
            )
        return claims

    def mark_owner_locked(self, claim: Claim) -> Verdict:
        """Record that ``claim``'s owner took the run's owner lock: from now on the
        crash watcher hands the run over as soon as the lock comes free for good
        (docs/architecture.md, "Crash detection")."""
        check_claim(claim)
        params = {"run_id": claim.run_id, "attempt_id": claim.attempt_id}
        return self._owner_write(
            "mark_owner_locked", sql.owner_locks.MARK_OWNER_LOCKED, params, claim
        )

    def takeovers_of(self, run_id: str) -> dict[str, int]:
        """How many times the run was handed over, by cause (crash, lease, forced)."""
        check_id(run_id, "run_id")
        rows = self._db.rows(
            "takeovers_of", sql.owner_locks.TAKEOVERS_OF_RUN, {"run_id": run_id}, run_id=run_id
        )
        return {str(r["cause"] or "lease"): int(r["takeovers"]) for r in rows}

    def adopt_attempt(
        self, run_id: str, attempt_id: str, owner: str, lease_ttl: float
    ) -> Claim | None:
        """Adopt the attempt a run was handed to: its lease starts, and it counts.

        A compare-and-set on ``attempt_id``: refused (None) unless the run awaits
        adoption by exactly that attempt, so of several deliveries of one takeover
        message only the first adopts. A run cancelled or past its deadline meanwhile
        is refused too (``expire_exhausted`` settles it).
        """
        check_id(run_id, "run_id")
        check_id(attempt_id, "attempt_id")
        check_id(owner, "owner")
        params = {
            "run_id": run_id,
            "attempt_id": attempt_id,
            "owner": owner,
            "lease_ttl": check_seconds(lease_ttl, "lease_ttl"),
        }
        row = self._db.one("adopt_attempt", sql.owner_locks.ADOPT_ATTEMPT, params, run_id=run_id)
        if row is None:
            return None
        claim = Claim.from_row(row)
        log.info(
            "attempt.adopted",
            run_id=run_id,
            attempt_id=claim.attempt_id,
            epoch=claim.epoch,
            owner=owner,
            waited=round(float(row["waited"]), 3),
        )
        return claim

    def redispatch_takeovers(
        self, older_than: float, limit: int, *, just_sent: Sequence[str] = ()
    ) -> list[Claim]:
        """Runs awaiting adoption whose last takeover message is older than
        ``older_than`` seconds (it may be lost): marked dispatched again and returned,
        with the same attempt and epoch, for the caller to enqueue once more.

        ``just_sent`` (runs whose first message the caller sent a moment ago) are left
        out, however long sending them took."""
        params = {
            "older_than": check_seconds(older_than, "older_than", allow_zero=True),
            "limit": check_limit(limit),
            "just_sent": list(just_sent),
        }
        rows = self._db.rows("redispatch_takeovers", sql.owner_locks.REDISPATCH_TAKEOVERS, params)
        return [Claim.from_row(r) for r in rows]

    def expire_exhausted(self, limit: int, *, run_id: str | None = None) -> list[Run]:
        """Settle expired runs that may not be taken over, runs awaiting adoption that
        were cancelled or passed their deadline, and queued runs past deadline (all of
        them, or ``run_id`` alone).

        Out of attempts or past the deadline: ``failed``; cancelled: ``aborted``.
        The error column says why; the caller writes the error chunk to the log.
        """
        params = {"limit": check_limit(limit), "run_id": check_optional_id(run_id, "run_id")}
        query = (
            sql.owner_locks.EXPIRE_EXHAUSTED
            if run_id is None
            else sql.owner_locks.EXPIRE_RUN_EXHAUSTED
        )
        rows = self._db.rows("expire_exhausted", query, params)
        runs = [Run.from_row(r) for r in rows]
        for run in runs:
            log.info("run.expired", run_id=run.run_id, status=run.status, error=run.error)
        return runs

    def settle_run(
        self,
        claim: Claim,
        status: RunStatus | str,
        error: Any = None,
        *,
        agent_session_id: str | None = None,
    ) -> Verdict:
        """Record a terminal status; the first one wins, a stale attempt changes nothing.
        ``agent_session_id``: the agent's own conversation id, for a follow-up to resume.

        Refused: WRONG_STATE when this attempt already settled the run with this
        status (a retry), else NOT_OWNER.
        """
        check_claim(claim)
        terminal = check_status(status)
        if not terminal.is_terminal:
            raise InvalidInputError(f"{terminal} is not a terminal status", reason="not-terminal")
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "status": terminal.value,
            # What the agent wrote (its stderr, its own error message) is stored as it
            # can be: never refused, which would fail the run for another reason.
            "error": None if error is None else to_json(storable(error), "error"),
            "agent_session_id": check_optional_id(agent_session_id, "agent_session_id"),
        }
        if (
            self._db.one("settle_run", sql.owner_locks.SETTLE_RUN, params, run_id=claim.run_id)
            is None
        ):
            # A settled run is nobody's, except to the retry of the very settle that
            # ended it (its reply lost), for which it is already made.
            retried = self._db.one(
                "settle_run", sql.owner_locks.SETTLED_BY, params, run_id=claim.run_id
            )
            return Verdict.WRONG_STATE if retried is not None else self._refusal(claim)
        log.info(
            "run.settled",
            run_id=claim.run_id,
            attempt_id=claim.attempt_id,
            epoch=claim.epoch,
            status=terminal.value,
        )
        return Verdict.DONE

    def record_sandbox(
        self, claim: Claim, sandbox_ref: Mapping[str, Any], *, keeps_workspace: bool = False
    ) -> Verdict:
        """Remember where the run's sandbox lives, fenced by the attempt; with
        ``keeps_workspace``, in the same write, as its session's workspace."""
        check_claim(claim)
        if not isinstance(sandbox_ref, Mapping):
            raise InvalidInputError("sandbox_ref must be a mapping")
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "sandbox_ref": to_json(dict(sandbox_ref), "sandbox_ref"),
            "keeps_workspace": bool(keeps_workspace),
        }
        return self._owner_write("record_sandbox", sql.owner_locks.RECORD_SANDBOX, params, claim)

    def request_cancel(self, run_id: str) -> Run | None:
        """A queued run is aborted at once; a running one is flagged for its owner.

        Returns the run as it is now, or None for an unknown or already settled run.
        """
        check_id(run_id, "run_id")
        row = self._db.one(
            "request_cancel", sql.owner_locks.REQUEST_CANCEL, {"run_id": run_id}, run_id=run_id
        )
        if row is None:
            return None
        run = Run.from_row(row)
        log.info("run.cancel_requested", run_id=run_id, status=run.status)
        return run
