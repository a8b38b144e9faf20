"""Admission and session deletion: the two writes serialized per session.

Both take the session's advisory lock, so within a session the admission
sequence equals commit order and a deletion never races an admission.
"""

from __future__ import annotations

from typing import Any

import structlog

from turnkeeper.errors import (
    InvalidInputError,
    RunConflictError,
    SessionBusyError,
    SessionDeletedError,
)
from turnkeeper.store import queries as q
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import Run, check_id, check_seconds, to_json

log = structlog.get_logger(__name__)


def _session_lock_key(session_id: str) -> str:
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
    ) -> tuple[Run, bool]:
        """Insert the run ``queued``; an identical replay returns the existing run.

        ``deadline`` is seconds after admission on the database clock (None: none).
        Returns ``(run, created)``.
        """
        check_id(run_id, "run_id")
        check_id(session_id, "session_id")
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
            "lock_key": _session_lock_key(session_id),
        }
        with self._db.transaction("admit_run", run_id=run_id) as tx:
            tx.rows(q.LOCK_SESSION, params)
            deleted_session = tx.scalar(q.FIND_RECEIPT, params)
            if deleted_session is not None:
                raise SessionDeletedError(
                    f"run {run_id!r} belonged to session {deleted_session!r}, which was "
                    "deleted; it will not run again",
                    run_id=run_id,
                    reason="session-deleted",
                    session_id=deleted_session,
                )
            tx.rows(q.ENSURE_SESSION, params)
            inserted = tx.one(q.INSERT_RUN, params)
            if inserted is not None:
                run = Run.from_row(inserted)
                log.info("run.admitted", run_id=run_id, session_id=session_id, seq=run.seq)
                return run, True
            existing = tx.one(q.EXISTING_RUN, params)
        if existing is None:  # deleted between the insert and the read: a conflict anyway
            raise RunConflictError(
                f"run {run_id!r} vanished during admission", run_id=run_id, reason="vanished"
            )
        values = dict(existing)
        same_payload = values.pop("same_payload")
        if not same_payload or values["session_id"] != session_id:
            raise RunConflictError(
                f"run {run_id!r} already exists with a different payload or session",
                run_id=run_id,
                reason="payload-differs" if not same_payload else "session-differs",
            )
        return Run.from_row(values), False

    def delete_session(self, session_id: str) -> int:
        """Delete a settled session's runs and transcript, keeping receipts of the runs.

        Refused (SessionBusyError) while a run of it is queued or running. Returns
        the number of runs deleted. A replayed admission of one of them is refused.
        """
        check_id(session_id, "session_id")
        params = {"session_id": session_id, "lock_key": _session_lock_key(session_id)}
        with self._db.transaction("delete_session", session_id=session_id) as tx:
            tx.rows(q.LOCK_SESSION, params)
            busy = tx.scalar(q.BUSY_RUNS, params)
            if busy:
                raise SessionBusyError(
                    f"session {session_id!r} has {busy} queued or running run(s)",
                    reason="session-busy",
                    session_id=session_id,
                )
            if not tx.scalar(q.SESSION_EXISTS, params):
                return 0
            tx.rows(q.WRITE_RECEIPTS, params)
            deleted = tx.rowcount(q.DELETE_SESSION_RUNS, params)
            tx.rows(q.DELETE_SESSION_ROW, params)
            tx.rows(q.MARK_SESSION_DELETED, params)
        log.info("session.deleted", session_id=session_id, runs=deleted)
        return int(deleted)
