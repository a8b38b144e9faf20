"""Admission and session deletion: the two writes serialized per session.

Both take the session's advisory lock, so within a session the admission
sequence equals commit order and a deletion never races an admission.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.errors import (
    ApiKeyError,
    InvalidInputError,
    QuotaExceededError,
    RunConflictError,
    SessionBusyError,
    SessionDeletedError,
)
from turnkeeper.logconfig import get_logger
from turnkeeper.store import sql
from turnkeeper.store.database import StoreBase, Transaction
from turnkeeper.store.records import Run, check_id, check_key_name, check_seconds, to_json

log = get_logger(__name__)

# How long a client told "too many running runs" should wait: runs take minutes, and
# a quick retry would only be refused again.
MAX_RUNNING_RETRY_AFTER = 10


def session_lock_key(session_id: str) -> str:
    return f"turnkeeper.session:{session_id}"


class AdmissionMixin(StoreBase):
    """Admit runs and delete sessions."""

    def admit_run(
        self,
        run_id: str,
        session_id: str,
        payload: Any,
        *,
        max_attempts: int,
        deadline: float | None,
        key_name: str | None = None,
    ) -> tuple[Run, bool]:
        """Insert the run ``queued``; an identical replay returns the existing run.

        ``deadline`` is seconds after admission on the database clock (None: none).
        ``key_name`` is the API key the run belongs to (None: the trusted caller's
        own): the key must be live, under its ``max_running``, and the session, when
        it exists, must belong to the same key. Returns ``(run, created)``.
        """
        check_id(run_id, "run_id")
        check_id(session_id, "session_id")
        if key_name is not None:
            check_key_name(key_name)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInputError(f"max_attempts must be a positive integer: {max_attempts!r}")
        seconds = None if deadline is None else check_seconds(deadline, "deadline")
        document = to_json(payload, "payload")
        params = {
            "run_id": run_id,
            "session_id": session_id,
            "payload": document,
            "max_attempts": max_attempts,
            "deadline": seconds,
            "lock_key": session_lock_key(session_id),
            "key_name": key_name,
        }
        with self._db.transaction("admit_run", run_id=run_id) as tx:
            tx.rows(sql.admission.LOCK_SESSION, params)
            if key_name is not None:
                _check_key_quota(tx, params)
            receipt = tx.one(sql.admission.FIND_RECEIPT, params)
            if receipt is not None:
                if receipt["key_name"] != key_name:
                    # Another tenant's deleted run: the id is taken, and that is all
                    # this caller learns, as of a live run of another tenant.
                    raise _run_id_taken(run_id)
                deleted_session = receipt["session_id"]
                raise SessionDeletedError(
                    f"run {run_id!r} belonged to session {deleted_session!r}, which was "
                    "deleted; it will not run again",
                    run_id=run_id,
                    reason="session-deleted",
                    session_id=deleted_session,
                )
            tenant = tx.rows(sql.admission.ENSURE_SESSION, params)[0]["key_name"]
            if tenant != key_name:
                # A run id that exists is what is taken, even where its session (by
                # default named after it) is another tenant's too.
                existing = tx.one(sql.admission.EXISTING_RUN, params)
                if existing is not None:
                    _replayed(existing, run_id, session_id, key_name)
                # Ids are global: all another tenant learns is that the id is taken.
                raise RunConflictError(
                    f"session {session_id!r} is taken; choose another session id",
                    run_id=run_id,
                    reason="session-taken",
                )
            inserted = tx.one(sql.admission.INSERT_RUN, params)
            if inserted is not None:
                run = Run.from_row(inserted)
                log.info("run.admitted", run_id=run_id, session_id=session_id, seq=run.seq)
                return run, True
            # Refused inside the transaction, so a refused replay leaves nothing behind
            # (not even the session row ENSURE_SESSION may have just inserted).
            return _replayed(
                tx.one(sql.admission.EXISTING_RUN, params), run_id, session_id, key_name
            ), False

    def delete_session(self, session_id: str) -> int:
        """Delete a settled session's runs and transcript, keeping receipts of the runs.

        Refused (SessionBusyError) while a run of it is queued or running. Returns
        the number of runs deleted. A replayed admission of one of them is refused.
        """
        check_id(session_id, "session_id")
        params = {"session_id": session_id, "lock_key": session_lock_key(session_id)}
        with self._db.transaction("delete_session", session_id=session_id) as tx:
            tx.rows(sql.admission.LOCK_SESSION, params)
            busy = tx.scalar(sql.sessions.BUSY_RUNS, params)
            if busy:
                raise SessionBusyError(
                    f"session {session_id!r} has {busy} queued or running run(s)",
                    reason="session-busy",
                    session_id=session_id,
                )
            if not tx.scalar(sql.sessions.SESSION_EXISTS, params):
                return 0
            tx.rows(sql.sessions.WRITE_RECEIPTS, params)
            deleted = tx.rowcount(sql.sessions.DELETE_SESSION_RUNS, params)
            tx.rows(sql.sessions.DELETE_SESSION_ROW, params)
            tx.rows(sql.sessions.MARK_SESSION_DELETED, params)
        log.info("session.deleted", session_id=session_id, runs=deleted)
        return int(deleted)


def _check_key_quota(tx: Transaction, params: dict[str, Any]) -> None:
    """Lock the key (serializing its admissions), refuse a revoked one, and refuse a new
    run past its ``max_running`` (an identical replay of an existing run still passes)."""
    key_name = params["key_name"]
    key = tx.one(sql.admission.LOCK_KEY, params)
    if key is None or key["revoked_at"] is not None:
        raise ApiKeyError(
            f"the key {key_name!r} is {'revoked' if key else 'unknown'}",
            reason="revoked-key" if key else "unknown-key",
        )
    limit = key["max_running"]
    if limit is None or tx.scalar(sql.admission.UNSETTLED_RUNS_OF_KEY, params) < limit:
        return
    if tx.scalar(sql.admission.RUN_EXISTS, params):
        return  # a replay: the caller below returns it or refuses it as a conflict
    raise QuotaExceededError(
        f"the key {key_name!r} has {limit} queued or running run(s), its limit; "
        "retry when one has settled",
        run_id=params["run_id"],
        reason="max-running",
        retry_after=MAX_RUNNING_RETRY_AFTER,
    )


def _replayed(existing: Any, run_id: str, session_id: str, key_name: str | None) -> Run:
    """The existing run when the admission replays it exactly; else a conflict."""
    if existing is None:  # deleted between the insert and the read: a conflict anyway
        raise RunConflictError(
            f"run {run_id!r} vanished during admission", run_id=run_id, reason="vanished"
        )
    values = dict(existing)
    same_payload = values.pop("same_payload")
    if values["key_name"] != key_name:
        raise _run_id_taken(run_id)
    if not same_payload:
        raise RunConflictError(
            f"run id {run_id!r} is taken by a run of another request (its agent, prompt "
            "or options differ); choose another run id, or send that request again",
            run_id=run_id,
            reason="payload-differs",
        )
    if values["session_id"] != session_id:
        raise RunConflictError(
            f"run id {run_id!r} is taken by a run of another session; choose another run id",
            run_id=run_id,
            reason="session-differs",
        )
    return Run.from_row(values)


def _run_id_taken(run_id: str) -> RunConflictError:
    """Another tenant's run (live, or of a deleted session) holds ``run_id``: ids are
    global, and the caller learns that it is taken, nothing of that run."""
    return RunConflictError(
        f"run id {run_id!r} is taken; choose another run id",
        run_id=run_id,
        reason="run-id-taken",
    )
