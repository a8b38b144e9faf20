"""The ``Store``: the primitives that decide who owns a run and how far its turns got.

Every owner write is fenced by the attempt id in the statement itself; a refusal
is a ``False`` or ``None``, never an exception, because losing ownership is an
expected outcome and never transient. Database trouble becomes a
``StoreUnavailableError`` (retryable); any other driver failure a ``StoreError``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
import sqlalchemy as sa
import structlog
from psycopg.rows import dict_row

from turnkeeper.config import sqlalchemy_postgres_url
from turnkeeper.errors import (
    InvalidInputError,
    RunConflictError,
    SegmentConflictError,
    SessionBusyError,
    SessionDeletedError,
    StoreError,
    StoreUnavailableError,
    TranscriptConflictError,
    TurnkeeperError,
)
from turnkeeper.store import queries as q
from turnkeeper.store.records import (
    PHASE_PREDECESSORS,
    Claim,
    NewEntry,
    Run,
    RunStatus,
    StreamSegment,
    TranscriptEntry,
    TurnJournal,
    TurnPhase,
    check_claim,
    check_id,
    check_limit,
    check_optional_id,
    check_phase,
    check_seconds,
    check_status,
    to_json,
)

log = structlog.get_logger(__name__)

_UNAVAILABLE = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.TimeoutError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


@contextmanager
def _translated(operation: str, **fields: Any) -> Iterator[None]:
    """Turn driver exceptions into store errors, so no caller sees a psycopg type."""
    try:
        yield
    except TurnkeeperError:
        raise
    except _UNAVAILABLE as exc:
        raise StoreUnavailableError(
            f"{operation}: database unavailable: {_first_line(exc)}",
            reason="unavailable",
            **fields,
        ) from exc
    except (sa.exc.DataError, psycopg.DataError) as exc:
        raise InvalidInputError(
            f"{operation}: the database refused a value: {_first_line(exc)}",
            reason="invalid-value",
            **fields,
        ) from exc
    except (sa.exc.SQLAlchemyError, psycopg.Error) as exc:
        raise StoreError(
            f"{operation} failed: {_first_line(exc)}", reason="database-error", **fields
        ) from exc


class _EntryIdTakenError(Exception):
    """Internal: an entry id of the chain exists; the transaction must roll back."""


def _new_attempt_id() -> str:
    return uuid.uuid4().hex


def _session_lock_key(session_id: str) -> str:
    return f"turnkeeper.session:{session_id}"


class Store:
    """A pooled, thread-safe handle on the run store. Create one per process (after fork)."""

    def __init__(self, database_url: str, *, pool_size: int = 10) -> None:
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise InvalidInputError(f"pool_size must be a positive integer, got {pool_size!r}")
        url = sqlalchemy_postgres_url(database_url)
        # Single statements run in autocommit (no BEGIN/COMMIT round trips); the few
        # multi-statement primitives check connections out in READ COMMITTED.
        self._engine = sa.create_engine(
            url,
            pool_size=pool_size,
            max_overflow=0,
            pool_timeout=30,
            pool_recycle=1800,
            isolation_level="AUTOCOMMIT",
            # Connections come back idle (autocommit, or after the transaction block
            # committed or rolled back), so the reset rollback is pure overhead.
            pool_reset_on_return=None,
            connect_args={"connect_timeout": 10},
        )
        self._tx_engine = self._engine.execution_options(isolation_level="READ COMMITTED")

    def close(self) -> None:
        """Close every pooled connection; the store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------

    def _rows(
        self, operation: str, statement: sa.TextClause, params: Mapping[str, Any], **fields: Any
    ) -> list[dict[str, Any]]:
        """Run one autocommit statement on a pooled connection.

        The hot path goes straight to the pooled psycopg connection (the same SQL,
        in psycopg's parameter style) because SQLAlchemy's per-call bookkeeping
        doubled the cost of a turn under thread contention (bench/store_cycle.py).
        """
        sql = q.pyformat(statement)
        with _translated(operation, **fields):
            pooled = self._engine.raw_connection()
            try:
                connection = pooled.driver_connection
                assert isinstance(connection, psycopg.Connection)  # noqa: S101 - psycopg dialect
                with connection.cursor(row_factory=dict_row) as cursor:
                    cursor.execute(sql, params)
                    return cursor.fetchall() if cursor.description else []
            except _UNAVAILABLE:
                pooled.invalidate()  # a broken connection must not go back to the pool
                raise
            finally:
                pooled.close()

    def _one(
        self, operation: str, statement: sa.TextClause, params: Mapping[str, Any], **fields: Any
    ) -> dict[str, Any] | None:
        rows = self._rows(operation, statement, params, **fields)
        return rows[0] if rows else None

    @contextmanager
    def _transaction(self, operation: str, **fields: Any) -> Iterator[sa.Connection]:
        with _translated(operation, **fields), self._tx_engine.begin() as conn:
            yield conn

    def database_now(self) -> datetime:
        """The database clock, the only clock leases and deadlines follow."""
        row = self._one("database_now", q.NOW, {})
        assert row is not None  # noqa: S101 - SELECT now() always returns a row
        return row["now"]  # type: ignore[no-any-return]

    # --- admission --------------------------------------------------------------------

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
        with self._transaction("admit_run", run_id=run_id) as conn:
            conn.execute(q.LOCK_SESSION, params)
            receipt = conn.execute(q.FIND_RECEIPT, params).first()
            if receipt is not None:
                raise SessionDeletedError(
                    f"run {run_id!r} belonged to session {receipt[0]!r}, which was deleted; "
                    "it will not run again",
                    run_id=run_id,
                    reason="session-deleted",
                    session_id=receipt[0],
                )
            conn.execute(q.ENSURE_SESSION, params)
            inserted = conn.execute(q.INSERT_RUN, params).mappings().first()
            if inserted is not None:
                run = Run.from_row(inserted)
                log.info("run.admitted", run_id=run_id, session_id=session_id, seq=run.seq)
                return run, True
            existing = conn.execute(q.EXISTING_RUN, params).mappings().one()
        values = dict(existing)
        same_payload = values.pop("same_payload")
        if not same_payload or values["session_id"] != session_id:
            raise RunConflictError(
                f"run {run_id!r} already exists with a different payload or session",
                run_id=run_id,
                reason="payload-differs" if not same_payload else "session-differs",
            )
        return Run.from_row(values), False

    # --- ownership --------------------------------------------------------------------

    def claim_run(self, run_id: str, owner: str, lease_ttl: float) -> Claim | None:
        """Queued -> running under a new attempt, if this run is its session's head."""
        check_id(run_id, "run_id")
        check_id(owner, "owner")
        ttl = check_seconds(lease_ttl, "lease_ttl")
        params = {
            "run_id": run_id,
            "owner": owner,
            "lease_ttl": ttl,
            "attempt_id": _new_attempt_id(),
        }
        try:
            row = self._one("claim_run", q.CLAIM_RUN, params, run_id=run_id)
        except StoreError as exc:
            # The one-running-run-per-session index is a safety net; hitting it is a refusal.
            if isinstance(exc.__cause__, sa.exc.IntegrityError | psycopg.IntegrityError):
                return None
            raise
        if row is None:
            return None
        claim = Claim(row["run_id"], row["attempt_id"], row["epoch"])
        log.info("run.claimed", run_id=run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)
        return claim

    def renew_lease(self, claim: Claim, lease_ttl: float) -> bool:
        """Extend the lease from the database clock; False means ownership is lost."""
        check_claim(claim)
        ttl = check_seconds(lease_ttl, "lease_ttl")
        params = {"run_id": claim.run_id, "attempt_id": claim.attempt_id, "lease_ttl": ttl}
        row = self._one("renew_lease", q.RENEW_LEASE, params, run_id=claim.run_id)
        if row is None:
            log.warning(
                "lease.lost", run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch
            )
            return False
        return True

    def replace_turn_journal_attempt(
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
        row = self._one("replace_turn_journal_attempt", q.REPLACE_ATTEMPT, params, run_id=run_id)
        if row is None:
            return None
        claim = Claim(row["run_id"], row["attempt_id"], row["epoch"])
        log.info(
            "attempt.replaced",
            run_id=run_id,
            attempt_id=claim.attempt_id,
            epoch=claim.epoch,
            superseded=expected_attempt_id,
        )
        return claim

    def reclaim_expired(self, owner: str, lease_ttl: float, limit: int) -> list[Claim]:
        """Replace the attempts of up to ``limit`` expired running runs, in one transaction.

        Rows are locked with SKIP LOCKED, so reconcilers running at once get disjoint
        runs. Runs out of attempts, past their deadline or cancelled are left to
        ``expire_exhausted``.
        """
        check_id(owner, "owner")
        params = {
            "owner": owner,
            "lease_ttl": check_seconds(lease_ttl, "lease_ttl"),
            "limit": check_limit(limit),
        }
        rows = self._rows("reclaim_expired", q.RECLAIM_EXPIRED, params)
        claims = [Claim(r["run_id"], r["attempt_id"], r["epoch"]) for r in rows]
        for claim in claims:
            log.info(
                "attempt.replaced",
                run_id=claim.run_id,
                attempt_id=claim.attempt_id,
                epoch=claim.epoch,
            )
        return claims

    def expire_exhausted(self, limit: int) -> list[Run]:
        """Settle expired runs that may not be taken over, and queued runs past deadline.

        Out of attempts or past the deadline: ``failed``; cancelled: ``aborted``.
        The error column says why; the caller writes the error chunk to the log.
        """
        rows = self._rows("expire_exhausted", q.EXPIRE_EXHAUSTED, {"limit": check_limit(limit)})
        runs = [Run.from_row(r) for r in rows]
        for run in runs:
            log.info("run.expired", run_id=run.run_id, status=run.status, error=run.error)
        return runs

    def settle_run(self, claim: Claim, status: RunStatus | str, error: Any = None) -> bool:
        """Record a terminal status; the first one wins, a stale attempt changes nothing."""
        check_claim(claim)
        terminal = check_status(status)
        if not terminal.is_terminal:
            raise InvalidInputError(f"{terminal} is not a terminal status", reason="not-terminal")
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "status": terminal.value,
            "error": None if error is None else to_json(error, "error"),
        }
        row = self._one("settle_run", q.SETTLE_RUN, params, run_id=claim.run_id)
        if row is None:
            return False
        log.info(
            "run.settled",
            run_id=claim.run_id,
            attempt_id=claim.attempt_id,
            epoch=claim.epoch,
            status=terminal.value,
        )
        return True

    def record_sandbox(self, claim: Claim, sandbox_ref: Mapping[str, Any]) -> bool:
        """Remember where the run's sandbox lives, fenced by the attempt."""
        check_claim(claim)
        if not isinstance(sandbox_ref, Mapping):
            raise InvalidInputError("sandbox_ref must be a mapping")
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "sandbox_ref": to_json(dict(sandbox_ref), "sandbox_ref"),
        }
        return (
            self._one("record_sandbox", q.RECORD_SANDBOX, params, run_id=claim.run_id) is not None
        )

    def request_cancel(self, run_id: str) -> Run | None:
        """A queued run is aborted at once; a running one is flagged for its owner.

        Returns the run as it is now, or None for an unknown or already settled run.
        """
        check_id(run_id, "run_id")
        row = self._one("request_cancel", q.REQUEST_CANCEL, {"run_id": run_id}, run_id=run_id)
        if row is None:
            return None
        run = Run.from_row(row)
        log.info("run.cancel_requested", run_id=run_id, status=run.status)
        return run

    # --- turn journal -----------------------------------------------------------------

    def begin_turn_journal(
        self, claim: Claim, turn_index: int, turn_id: str, checkpoint_leaf_id: str | None
    ) -> bool:
        """Start a new turn in the run's slot (reset in place, revision + 1).

        Refused for a stale attempt and for a turn index that is not past the current one.
        """
        check_claim(claim)
        if isinstance(turn_index, bool) or not isinstance(turn_index, int) or turn_index < 0:
            raise InvalidInputError(f"turn_index must be a non-negative integer: {turn_index!r}")
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "turn_index": turn_index,
            "turn_id": check_id(turn_id, "turn_id"),
            "checkpoint_leaf_id": check_optional_id(checkpoint_leaf_id, "checkpoint_leaf_id"),
        }
        row = self._one("begin_turn_journal", q.BEGIN_JOURNAL, params, run_id=claim.run_id)
        return row is not None

    def update_turn_journal_phase(
        self,
        claim: Claim,
        phase: TurnPhase | str,
        *,
        stream_key: str | None = None,
        tool_request: Any = None,
        checkpoint_leaf_id: str | None = None,
    ) -> bool:
        """Move the current turn forward one phase; absent options keep stored values."""
        check_claim(claim)
        target = check_phase(phase)
        if target is TurnPhase.COMMITTED:
            raise InvalidInputError(
                "a turn is committed with commit_turn_journal", reason="use-commit"
            )
        if target is TurnPhase.BEFORE_PROVIDER:
            raise InvalidInputError(
                "before_provider starts a turn: use begin_turn_journal", reason="use-begin"
            )
        predecessors = PHASE_PREDECESSORS[target]
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "phase": target.value,
            "from_a": predecessors[0].value,
            "from_b": predecessors[-1].value,
            "stream_key": check_optional_id(stream_key, "stream_key"),
            "tool_request": None if tool_request is None else to_json(tool_request, "tool_request"),
            "checkpoint_leaf_id": check_optional_id(checkpoint_leaf_id, "checkpoint_leaf_id"),
        }
        row = self._one("update_turn_journal_phase", q.UPDATE_PHASE, params, run_id=claim.run_id)
        return row is not None

    def commit_turn_journal(self, claim: Claim, committed_leaf_id: str) -> bool:
        """Commit the current turn; afterwards every write to that turn returns False."""
        check_claim(claim)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "committed_leaf_id": check_id(committed_leaf_id, "committed_leaf_id"),
        }
        row = self._one("commit_turn_journal", q.COMMIT_JOURNAL, params, run_id=claim.run_id)
        return row is not None

    def mark_stream_consumed(self, claim: Claim, stream_key: str) -> bool:
        """Record, once, that the turn's stream was read to its end."""
        check_claim(claim)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "stream_key": check_id(stream_key, "stream_key"),
        }
        row = self._one("mark_stream_consumed", q.MARK_STREAM_CONSUMED, params, run_id=claim.run_id)
        return row is not None

    def get_turn_journal(self, run_id: str) -> TurnJournal | None:
        check_id(run_id, "run_id")
        row = self._one("get_turn_journal", q.GET_JOURNAL, {"run_id": run_id}, run_id=run_id)
        return None if row is None else TurnJournal.from_row(row)

    # --- stream segments --------------------------------------------------------------

    def append_stream_segment(
        self, claim: Claim, stream_key: str, byte_start: int, body: bytes
    ) -> bool:
        """Store journal bytes once, contiguously, fenced by the attempt.

        True: stored. False: a stale attempt, or this exact segment was already
        stored. SegmentConflictError: a different body at a stored offset, a gap,
        or a stream key that belongs to another run.
        """
        check_claim(claim)
        check_id(stream_key, "stream_key")
        if isinstance(byte_start, bool) or not isinstance(byte_start, int) or byte_start < 0:
            raise InvalidInputError(f"byte_start must be a non-negative integer: {byte_start!r}")
        if not isinstance(body, bytes | bytearray | memoryview) or len(body) == 0:
            raise InvalidInputError("body must be non-empty bytes")
        data = bytes(body)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "stream_key": stream_key,
            "byte_start": byte_start,
            "byte_end": byte_start + len(data),
            "body": data,
        }
        fields: dict[str, Any] = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "stream_key": stream_key,
        }
        with _translated("append_stream_segment", **fields), self._engine.connect() as conn:
            verdict = conn.execute(q.APPEND_SEGMENT, params).mappings().one()
            if verdict["inserted"]:
                return True
            if not verdict["owned"]:
                return False
            if verdict["other_run"]:
                raise SegmentConflictError(
                    "the stream key belongs to another run", reason="foreign-stream", **fields
                )
            stored = conn.execute(q.STORED_SEGMENT, params).scalar()
        if stored is not None:
            if bytes(stored) == data:
                return False
            raise SegmentConflictError(
                f"a different body is stored at byte {byte_start}",
                reason="body-differs",
                byte_start=byte_start,
                **fields,
            )
        raise SegmentConflictError(
            f"segment at byte {byte_start} does not continue the stream, which ends at "
            f"byte {verdict['tip']}",
            reason="not-contiguous",
            byte_start=byte_start,
            stream_end=verdict["tip"],
            **fields,
        )

    def stream_segments(self, stream_key: str, from_byte: int = 0) -> list[StreamSegment]:
        """The stored bytes from ``from_byte`` on, in order (the first segment trimmed)."""
        check_id(stream_key, "stream_key")
        if isinstance(from_byte, bool) or not isinstance(from_byte, int) or from_byte < 0:
            raise InvalidInputError(f"from_byte must be a non-negative integer: {from_byte!r}")
        rows = self._rows(
            "stream_segments", q.STREAM_SEGMENTS, {"stream_key": stream_key, "from_byte": from_byte}
        )
        segments = []
        for row in rows:
            start, body = row["byte_start"], bytes(row["body"])
            if start < from_byte:
                body, start = body[from_byte - start :], from_byte
            segments.append(StreamSegment(row["stream_key"], start, row["byte_end"], body))
        return segments

    # --- transcript -------------------------------------------------------------------

    def append_transcript(
        self,
        claim: Claim,
        session_id: str,
        entries: Sequence[NewEntry],
        expected_leaf: str | None,
    ) -> str | None:
        """Append a chain of entries under ``expected_leaf`` and move the leaf to its end.

        One transaction, fenced by the attempt and by a compare-and-set on the leaf.
        Returns the new leaf; None for a stale attempt. A replay of an append that
        already happened returns its leaf and writes nothing; a moved leaf raises
        TranscriptConflictError (re-read and retry).
        """
        check_claim(claim)
        check_id(session_id, "session_id")
        check_optional_id(expected_leaf, "expected_leaf")
        chain = self._chain(entries, expected_leaf)
        new_leaf = chain[-1]["entry_id"]
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "session_id": session_id,
            "expected_leaf": expected_leaf,
            "leaf_id": new_leaf,
            "entries": json.dumps(chain, ensure_ascii=False),
            "entry_ids": json.dumps([e["entry_id"] for e in chain], ensure_ascii=False),
        }
        fields: dict[str, Any] = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "session_id": session_id,
        }
        try:
            with self._transaction("append_transcript", **fields) as conn:
                if conn.execute(q.FENCE_WRITER, params).first() is None:
                    return None
                if conn.execute(q.MOVE_LEAF, params).first() is not None:
                    inserted = conn.execute(q.INSERT_ENTRIES, params).fetchall()
                    if len(inserted) == len(chain):
                        return str(new_leaf)
                    raise _EntryIdTakenError  # noqa: TRY301 - rolls the leaf move back
        except _EntryIdTakenError:
            pass
        with _translated("append_transcript", **fields), self._engine.connect() as conn:
            stored = {r["entry_id"]: r for r in conn.execute(q.STORED_ENTRIES, params).mappings()}
            current = conn.execute(q.CURRENT_LEAF, params).scalar()
        if all(
            (s := stored.get(e["entry_id"])) is not None
            and (s["parent_id"], s["kind"], s["body"]) == (e["parent_id"], e["kind"], e["body"])
            for e in chain
        ):
            return str(new_leaf)
        if stored:
            raise TranscriptConflictError(
                "an entry id is already used by a different entry",
                reason="entry-id-taken",
                current_leaf=current,
                **fields,
            )
        raise TranscriptConflictError(
            f"the leaf is {current!r}, not {expected_leaf!r}",
            reason="leaf-moved",
            current_leaf=current,
            **fields,
        )

    @staticmethod
    def _chain(entries: Sequence[NewEntry], expected_leaf: str | None) -> list[dict[str, Any]]:
        if isinstance(entries, NewEntry) or not entries:
            raise InvalidInputError("entries must be a non-empty sequence of NewEntry")
        chain: list[dict[str, Any]] = []
        parent = expected_leaf
        seen: set[str] = set()
        for ordinal, entry in enumerate(entries):
            if not isinstance(entry, NewEntry):
                raise InvalidInputError("entries must be NewEntry values")
            check_id(entry.entry_id, "entry_id")
            check_id(entry.kind, "kind")
            if entry.entry_id in seen or entry.entry_id == expected_leaf:
                raise InvalidInputError(f"entry id {entry.entry_id!r} repeats in the chain")
            seen.add(entry.entry_id)
            body = json.loads(to_json(entry.body, "entry body"))
            chain.append(
                {
                    "ord": ordinal,
                    "entry_id": entry.entry_id,
                    "parent_id": parent,
                    "kind": entry.kind,
                    "body": body,
                }
            )
            parent = entry.entry_id
        return chain

    def set_leaf(self, claim: Claim, session_id: str, entry_id: str) -> bool:
        """Point the session's leaf at an existing entry (a branch), fenced by the attempt."""
        check_claim(claim)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "session_id": check_id(session_id, "session_id"),
            "entry_id": check_id(entry_id, "entry_id"),
        }
        return self._one("set_leaf", q.SET_LEAF, params, run_id=claim.run_id) is not None

    def active_path(self, session_id: str) -> list[TranscriptEntry]:
        """The entries from the root to the session's leaf."""
        check_id(session_id, "session_id")
        rows = self._rows("active_path", q.ACTIVE_PATH, {"session_id": session_id})
        return [TranscriptEntry.from_row(r) for r in rows]

    # --- sessions, reads, reconciler, retention ---------------------------------------

    def delete_session(self, session_id: str) -> int:
        """Delete a settled session's runs and transcript, keeping receipts of the runs.

        Refused (SessionBusyError) while a run of it is queued or running. Returns
        the number of runs deleted. A replayed admission of one of them is refused.
        """
        check_id(session_id, "session_id")
        params = {"session_id": session_id, "lock_key": _session_lock_key(session_id)}
        with self._transaction("delete_session", session_id=session_id) as conn:
            conn.execute(q.LOCK_SESSION, params)
            busy = conn.execute(q.BUSY_RUNS, params).scalar_one()
            if busy:
                raise SessionBusyError(
                    f"session {session_id!r} has {busy} queued or running run(s)",
                    reason="session-busy",
                    session_id=session_id,
                )
            if not conn.execute(q.SESSION_EXISTS, params).scalar_one():
                return 0
            conn.execute(q.WRITE_RECEIPTS, params)
            deleted = conn.execute(q.DELETE_SESSION_RUNS, params).rowcount
            conn.execute(q.DELETE_SESSION_ROW, params)
            conn.execute(q.MARK_SESSION_DELETED, params)
        log.info("session.deleted", session_id=session_id, runs=deleted)
        return int(deleted)

    def get_run(self, run_id: str) -> Run | None:
        check_id(run_id, "run_id")
        row = self._one("get_run", q.GET_RUN, {"run_id": run_id}, run_id=run_id)
        return None if row is None else Run.from_row(row)

    def list_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """Runs, newest admission first, optionally of one status and/or session."""
        params = {
            "status": None if status is None else check_status(status).value,
            "session_id": check_optional_id(session_id, "session_id"),
            "limit": check_limit(limit),
        }
        return [Run.from_row(r) for r in self._rows("list_runs", q.LIST_RUNS, params)]

    def expired_runs(self, limit: int) -> list[Run]:
        """Running runs whose lease expired on the database clock (a read, for operators).

        To take them over, use ``reclaim_expired``, which locks with SKIP LOCKED.
        """
        rows = self._rows("expired_runs", q.EXPIRED_RUNS, {"limit": check_limit(limit)})
        return [Run.from_row(r) for r in rows]

    def stale_queued_runs(self, older_than: float, limit: int) -> list[Run]:
        """Queued runs not dispatched (or admitted) within ``older_than`` seconds."""
        params = {
            "older_than": check_seconds(older_than, "older_than", allow_zero=True),
            "limit": check_limit(limit),
        }
        return [
            Run.from_row(r) for r in self._rows("stale_queued_runs", q.STALE_QUEUED_RUNS, params)
        ]

    def mark_dispatched(self, run_id: str) -> bool:
        """Record that a task for this queued run was enqueued (now, on the DB clock)."""
        check_id(run_id, "run_id")
        return self._one("mark_dispatched", q.MARK_DISPATCHED, {"run_id": run_id}) is not None

    def runs_to_reap(self, limit: int) -> list[Run]:
        """Settled runs that still have a sandbox reference, oldest settled first."""
        rows = self._rows("runs_to_reap", q.RUNS_TO_REAP, {"limit": check_limit(limit)})
        return [Run.from_row(r) for r in rows]

    def forget_sandbox(self, run_id: str) -> bool:
        """Drop a settled run's sandbox reference once its sandbox is destroyed."""
        check_id(run_id, "run_id")
        return self._one("forget_sandbox", q.FORGET_SANDBOX, {"run_id": run_id}) is not None

    def unsettled_sandbox_refs(self) -> list[Any]:
        """The sandbox references of queued and running runs: what the reaper must keep."""
        return [r["sandbox_ref"] for r in self._rows("unsettled", q.UNSETTLED_SANDBOX_REFS, {})]

    def prune_settled(self, older_than: float, limit: int) -> int:
        """Delete stream segments and journal slots of up to ``limit`` runs settled
        more than ``older_than`` seconds ago; returns how many runs were pruned.

        Run rows (idempotency) and transcript entries (the conversation) are kept.
        """
        params = {
            "older_than": check_seconds(older_than, "older_than", allow_zero=True),
            "limit": check_limit(limit),
        }
        row = self._one("prune_settled", q.PRUNE_SETTLED, params)
        return int(row["count"]) if row is not None else 0
