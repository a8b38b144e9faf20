"""Reads and the reconciler's and reaper's primitives: listing, dispatch, retention."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from turnkeeper.errors import InvalidInputError
from turnkeeper.store import sql
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import (
    AttemptRecord,
    Claim,
    FleetCounts,
    Run,
    RunStatus,
    RunWindow,
    SessionSummary,
    check_claim,
    check_id,
    check_key_name,
    check_limit,
    check_optional_id,
    check_seconds,
    check_status,
)


class MaintenanceMixin(StoreBase):
    """Reads for operators and the periodic jobs that keep the store tidy."""

    def database_now(self) -> datetime:
        """The database clock, the only clock leases and deadlines follow."""
        row = self._db.one("database_now", sql.hosts.NOW, {})
        assert row is not None  # noqa: S101 - SELECT now() always returns a row
        return row["now"]  # type: ignore[no-any-return]

    def fleet_counts(self) -> FleetCounts:
        """Runs by status, attempts by outcome, takeovers by cause, expired leases and
        the highest unsettled epoch: what a metrics scrape reads."""
        row = self._db.one("fleet_counts", sql.hosts.FLEET_COUNTS, {})
        assert row is not None  # noqa: S101 - a SELECT of aggregates always returns a row
        return FleetCounts.from_row(row)

    def get_run(self, run_id: str) -> Run | None:
        check_id(run_id, "run_id")
        row = self._db.one("get_run", sql.reads.GET_RUN, {"run_id": run_id}, run_id=run_id)
        return None if row is None else Run.from_row(row)

    def list_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        session_id: str | None = None,
        key_name: str | None = None,
        agent: str | None = None,
        search: str | None = None,
        window: RunWindow | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Run]:
        """Runs, newest admission first, optionally of one status, session, key and/or
        agent (its preset, or its inline command's program), whose id holds ``search``
        (any case), and/or created or finished within ``window``; ``offset`` runs
        skipped first."""
        params = self._run_filter(
            status=status,
            session_id=session_id,
            key_name=key_name,
            agent=agent,
            search=search,
            window=window,
        )
        params["limit"] = check_limit(limit)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset must be a non-negative integer, got {offset!r}")
        params["offset"] = offset
        return [Run.from_row(r) for r in self._db.rows("list_runs", sql.reads.LIST_RUNS, params)]

    def count_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        session_id: str | None = None,
        key_name: str | None = None,
        agent: str | None = None,
        search: str | None = None,
        window: RunWindow | None = None,
        most: int = 10_000,
    ) -> int:
        """How many runs ``list_runs`` would list with the same filters and no limit,
        counted up to ``most``."""
        params = self._run_filter(
            status=status,
            session_id=session_id,
            key_name=key_name,
            agent=agent,
            search=search,
            window=window,
        )
        params["most"] = check_limit(most)
        row = self._db.one("count_runs", sql.reads.COUNT_RUNS, params)
        assert row is not None  # noqa: S101 - a count always returns a row
        return int(row["n"])

    def list_sessions(
        self,
        *,
        key_name: str | None = None,
        search: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[SessionSummary]:
        """Sessions, the one whose latest run was admitted last first, optionally of one
        key's tenant and/or whose id holds ``search`` (any case); ``offset`` skipped first."""
        params = self._session_filter(key_name, search)
        params["limit"] = check_limit(limit)
        params["offset"] = _check_offset(offset)
        rows = self._db.rows("list_sessions", sql.reads.LIST_SESSIONS, params)
        return [SessionSummary.from_row(r) for r in rows]

    def count_sessions(
        self, *, key_name: str | None = None, search: str | None = None, most: int = 10_000
    ) -> int:
        """How many sessions ``list_sessions`` would list with the same filters and no
        limit, counted up to ``most``."""
        params = self._session_filter(key_name, search)
        params["most"] = check_limit(most)
        row = self._db.one("count_sessions", sql.reads.COUNT_SESSIONS, params)
        assert row is not None  # noqa: S101 - a count always returns a row
        return int(row["n"])

    @staticmethod
    def _session_filter(key_name: str | None, search: str | None) -> dict[str, Any]:
        return {
            "key_name": None if key_name is None else check_key_name(key_name),
            "search": check_optional_id(search, "search"),
        }

    @staticmethod
    def _run_filter(
        *,
        status: RunStatus | str | None,
        session_id: str | None,
        key_name: str | None,
        agent: str | None,
        search: str | None,
        window: RunWindow | None,
    ) -> dict[str, Any]:
        return {
            **(window or RunWindow()).params(),
            "status": None if status is None else check_status(status).value,
            "session_id": check_optional_id(session_id, "session_id"),
            "key_name": None if key_name is None else check_key_name(key_name),
            "agent": check_optional_id(agent, "agent"),
            "search": check_optional_id(search, "search"),
        }

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """The run's attempts, oldest first (a handed-over attempt awaiting adoption has
        no row yet)."""
        params = {"run_id": check_id(run_id, "run_id")}
        rows = self._db.rows("attempts", sql.reads.RUN_ATTEMPTS, params, run_id=run_id)
        return [AttemptRecord.from_row(r) for r in rows]

    def record_attempt_log_seq(self, claim: Claim, log_seq: int) -> None:
        """Remember where a takeover's attempt began in the run log (its first seq),
        once, while the attempt owns the run (a superseded one records nothing): the
        run page marks the takeover there."""
        check_claim(claim)
        if isinstance(log_seq, bool) or not isinstance(log_seq, int) or log_seq < 1:
            raise InvalidInputError(f"log_seq must be a positive integer, got {log_seq!r}")
        params = {"run_id": claim.run_id, "attempt_id": claim.attempt_id, "log_seq": log_seq}
        self._db.rows(
            "record_attempt_log_seq", sql.reads.RECORD_ATTEMPT_LOG_SEQ, params, run_id=claim.run_id
        )

    def stale_queued_runs(self, older_than: float, limit: int) -> list[Run]:
        """Queued runs that lead their session (no earlier run of it unsettled), not
        dispatched (or admitted) within ``older_than`` seconds."""
        params = {
            "older_than": check_seconds(older_than, "older_than", allow_zero=True),
            "limit": check_limit(limit),
        }
        return [
            Run.from_row(r)
            for r in self._db.rows("stale_queued_runs", sql.reads.STALE_QUEUED_RUNS, params)
        ]

    def waiting_behind(self, run_id: str) -> int | None:
        """How many unsettled runs of its session a queued run waits behind (0: it
        starts next); None for a run that is not queued."""
        params = {"run_id": check_id(run_id, "run_id")}
        row = self._db.one("waiting_behind", sql.reads.WAITING_BEHIND, params)
        return None if row is None else int(row["waiting_behind"])

    def next_in_session(self, run_id: str) -> str | None:
        """Once ``run_id`` is settled, the queued run of its session that leads now."""
        params = {"run_id": check_id(run_id, "run_id")}
        row = self._db.one("next_in_session", sql.reads.NEXT_IN_SESSION, params)
        return None if row is None else str(row["run_id"])

    def mark_dispatched(self, run_id: str) -> bool:
        """Record that a task for this queued run was enqueued (now, on the DB clock)."""
        check_id(run_id, "run_id")
        return (
            self._db.one("mark_dispatched", sql.reads.MARK_DISPATCHED, {"run_id": run_id})
            is not None
        )

    def recently_settled(self, within: float, limit: int) -> list[Run]:
        """Runs settled in the last ``within`` seconds (database clock), oldest first."""
        params = {"within": check_seconds(within, "within"), "limit": check_limit(limit)}
        return [
            Run.from_row(r)
            for r in self._db.rows("recently_settled", sql.reaping.RECENTLY_SETTLED, params)
        ]

    def runs_to_reap(
        self, limit: int, *, host: str | None = None, host_local: Collection[str] = ()
    ) -> list[Run]:
        """Settled runs that still have a sandbox reference, oldest settled first.

        Without ``host``: those any host can destroy (a provider not in ``host_local``,
        or no host recorded); with it: the ``host_local`` sandboxes ``host`` made.
        """
        params = {
            "limit": check_limit(limit),
            "host": None if host is None else check_id(host, "host_id"),
            "host_local": sorted(host_local),
        }
        rows = self._db.rows("runs_to_reap", sql.reaping.RUNS_TO_REAP, params)
        return [Run.from_row(r) for r in rows]

    def forget_sandbox(self, run_id: str) -> bool:
        """Drop a settled run's sandbox reference once its sandbox is destroyed."""
        check_id(run_id, "run_id")
        return (
            self._db.one("forget_sandbox", sql.reaping.FORGET_SANDBOX, {"run_id": run_id})
            is not None
        )

    def unsettled_sandbox_refs(self) -> list[Any]:
        """The sandbox references of queued and running runs: what the reaper must keep."""
        return [
            r["sandbox_ref"]
            for r in self._db.rows("unsettled", sql.reaping.UNSETTLED_SANDBOX_REFS, {})
        ]

    def superseded_sandboxes(self, within: float) -> set[str]:
        """The ids of sandboxes that runs (unsettled, or settled within ``within``
        seconds) ran an agent process in and have moved on from: nothing will read
        them again, and an agent still running there does the run's work twice."""
        params = {"within": check_seconds(within, "within")}
        rows = self._db.rows("superseded_sandboxes", sql.reaping.SUPERSEDED_SANDBOXES, params)
        return {str(r["sandbox_id"]) for r in rows}

    def prune_settled(self, older_than: float, limit: int) -> int:
        """Delete segments and turn slots of up to ``limit`` runs settled
        more than ``older_than`` seconds ago; returns how many runs were pruned.

        Run rows (idempotency) and transcript entries (the conversation) are kept.
        """
        params = {
            "older_than": check_seconds(older_than, "older_than", allow_zero=True),
            "limit": check_limit(limit),
        }
        row = self._db.one("prune_settled", sql.reaping.PRUNE_SETTLED, params)
        return int(row["count"]) if row is not None else 0


def _check_offset(offset: object) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidInputError(f"offset must be a non-negative integer, got {offset!r}")
    return offset
