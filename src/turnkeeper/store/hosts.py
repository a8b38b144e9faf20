"""Hosts: worker processes' heartbeats, drains, and which host holds which sandbox.

A host is alive while one of its worker processes was seen within ``dead_after``
seconds, on the database clock like every lease (docs/architecture.md, "Hosts").
"""

from __future__ import annotations

from turnkeeper.errors import InvalidInputError
from turnkeeper.store import sql
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import (
    Claim,
    PlacedSandbox,
    Worker,
    WorkerOrders,
    check_id,
    check_limit,
    check_seconds,
)


def _check_pid(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{what} must be a positive integer, got {value!r}")
    return value


class HostsMixin(StoreBase):
    """Worker heartbeats and the hosts they make alive."""

    def start_worker(self, worker_id: str, host_id: str, pid: int, main_pid: int) -> None:
        """A worker process starts: its row anew, without an earlier process's drain."""
        params = self._worker_params(worker_id, host_id, pid, main_pid)
        self._db.one("start_worker", sql.hosts.START_WORKER, params)

    def beat_worker(self, worker_id: str, host_id: str, pid: int, main_pid: int) -> WorkerOrders:
        """A worker process's heartbeat; answers whether it is draining, and whether the
        time to hand over its runs has come."""
        params = self._worker_params(worker_id, host_id, pid, main_pid)
        row = self._db.one("beat_worker", sql.hosts.BEAT_WORKER, params)
        assert row is not None  # noqa: S101 - an upsert always returns its row
        return WorkerOrders(
            draining=bool(row["draining"]), hand_over_due=bool(row["hand_over_due"])
        )

    def host_alive(self, host_id: str, dead_after: float) -> bool:
        """Whether a worker of ``host_id`` was seen within ``dead_after`` seconds."""
        params = {"host_id": check_id(host_id, "host_id"), "dead_after": _dead(dead_after)}
        row = self._db.one("host_alive", sql.hosts.HOST_ALIVE, params)
        return bool(row and row["alive"])

    def live_hosts(self, dead_after: float) -> list[str]:
        rows = self._db.rows("live_hosts", sql.hosts.LIVE_HOSTS, {"dead_after": _dead(dead_after)})
        return [str(r["host_id"]) for r in rows]

    def dead_hosts(self, dead_after: float, limit: int) -> list[str]:
        """Hosts the store knows, none of whose workers was seen within ``dead_after``
        seconds; those that died last first."""
        params = {"dead_after": _dead(dead_after), "limit": check_limit(limit)}
        return [
            str(r["host_id"]) for r in self._db.rows("dead_hosts", sql.hosts.DEAD_HOSTS, params)
        ]

    def drain_workers(
        self, host_id: str, dead_after: float, hand_over_after: float
    ) -> list[Worker]:
        """Mark the live workers of ``host_id`` draining; each hands over the runs it still
        drives ``hand_over_after`` seconds from now, or sooner if an earlier drain said
        so (a second drain never puts a hand-over off). Returns the workers marked."""
        params = {
            "host_id": check_id(host_id, "host_id"),
            "dead_after": _dead(dead_after),
            "hand_over_after": check_seconds(hand_over_after, "hand_over_after", allow_zero=True),
        }
        marked = {
            r["worker_id"] for r in self._db.rows("drain_workers", sql.hosts.DRAIN_WORKERS, params)
        }
        return [w for w in self.workers(dead_after) if w.worker_id in marked]

    def workers(self, dead_after: float) -> list[Worker]:
        """Every worker process known, by host, with whether it is alive."""
        rows = self._db.rows("workers", sql.hosts.WORKERS, {"dead_after": _dead(dead_after)})
        return [Worker.from_row(r) for r in rows]

    def placed_sandboxes(self, limit: int = 1000) -> list[PlacedSandbox]:
        """The sandboxes runs' placements still name (reaped ones are forgotten)."""
        rows = self._db.rows(
            "placed_sandboxes", sql.hosts.PLACED_SANDBOXES, {"limit": check_limit(limit)}
        )
        return [PlacedSandbox.from_row(r) for r in rows]

    def takeovers_of_dead_hosts(self, dead_after: float, limit: int) -> list[Claim]:
        """Runs awaiting adoption whose takeover went to a host that has died since:
        marked dispatched again, once, and returned for the caller to send on."""
        params = {"dead_after": _dead(dead_after), "limit": check_limit(limit)}
        rows = self._db.rows("takeovers_of_dead_hosts", sql.hosts.DEAD_HOST_TAKEOVERS, params)
        return [Claim(r["run_id"], r["attempt_id"], r["epoch"]) for r in rows]

    def prune_workers(self, older_than: float) -> int:
        """Forget worker processes unseen for ``older_than`` seconds."""
        params = {"older_than": check_seconds(older_than, "older_than")}
        row = self._db.one("prune_workers", sql.hosts.PRUNE_WORKERS, params)
        return int(row["count"]) if row is not None else 0

    @staticmethod
    def _worker_params(worker_id: str, host_id: str, pid: int, main_pid: int) -> dict[str, object]:
        return {
            "worker_id": check_id(worker_id, "worker_id"),
            "host_id": check_id(host_id, "host_id"),
            "pid": _check_pid(pid, "pid"),
            "main_pid": _check_pid(main_pid, "main_pid"),
        }


def _dead(dead_after: float) -> float:
    return check_seconds(dead_after, "dead_after")
