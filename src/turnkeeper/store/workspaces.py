"""Session workspaces: the sandbox a session's runs share, kept while it is in use.

A run records its sandbox as its session's workspace in the very write that records
its placement (``OwnershipMixin.record_sandbox``); here the worker reads it back and
the reaper retires it once the session has been idle for the TTL
(docs/architecture.md, "Session workspaces").
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from turnkeeper.logconfig import get_logger
from turnkeeper.store import sql
from turnkeeper.store.admission import session_lock_key
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import check_id, check_limit, check_seconds

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Workspace:
    """What a session holds about its workspace: the sandbox reference (None once
    gone) and the host that made it, or why it is gone."""

    sandbox: dict[str, Any] | None
    host: str | None
    gone: str | None = None

    @classmethod
    def from_row(cls, workspace: Any, host: Any) -> Workspace | None:
        if not isinstance(workspace, dict):
            return None
        sandbox = workspace.get("sandbox")
        gone = workspace.get("gone")
        return cls(
            sandbox=sandbox if isinstance(sandbox, dict) else None,
            host=str(host) if host is not None else None,
            gone=str(gone) if gone is not None else None,
        )


@dataclass(frozen=True, slots=True)
class IdleWorkspace:
    session_id: str
    sandbox: dict[str, Any]


class WorkspacesMixin(StoreBase):
    """Read and retire sessions' workspaces."""

    def session_workspace(self, session_id: str) -> Workspace | None:
        """The session's workspace as its latest run recorded it; None when it never had one."""
        params = {"session_id": check_id(session_id, "session_id")}
        row = self._db.one("session_workspace", sql.workspaces.SESSION_WORKSPACE, params)
        return None if row is None else Workspace.from_row(row["workspace"], row["workspace_host"])

    def idle_workspaces(
        self,
        ttl: float,
        limit: int,
        *,
        host: str | None = None,
        host_local: Collection[str] = (),
    ) -> list[IdleWorkspace]:
        """Workspaces of sessions idle for ``ttl`` seconds, split by host as
        ``runs_to_reap`` splits sandboxes."""
        params = {
            "ttl": check_seconds(ttl, "ttl"),
            "limit": check_limit(limit),
            "host": None if host is None else check_id(host, "host_id"),
            "host_local": sorted(host_local),
        }
        rows = self._db.rows("idle_workspaces", sql.workspaces.IDLE_WORKSPACES, params)
        return [IdleWorkspace(str(r["session_id"]), dict(r["sandbox"])) for r in rows]

    def retire_workspace(self, session_id: str, sandbox_id: str, ttl: float) -> bool:
        """Forget the session's workspace (``gone: expired``) while it is still that
        sandbox and the session still idle, under the session's admission lock; True
        when the caller may now destroy it."""
        params = {
            "session_id": check_id(session_id, "session_id"),
            "sandbox_id": check_id(sandbox_id, "sandbox_id"),
            "ttl": check_seconds(ttl, "ttl"),
            "lock_key": session_lock_key(session_id),
        }
        with self._db.transaction("retire_workspace", session_id=session_id) as tx:
            tx.rows(sql.admission.LOCK_SESSION, params)
            retired = tx.one(sql.workspaces.RETIRE_WORKSPACE, params) is not None
        if retired:
            log.info("workspace.retired", session_id=session_id, sandbox=sandbox_id)
        return retired

    @contextmanager
    def quiet_workspace(self, session_id: str, sandbox_id: str) -> Iterator[bool]:
        """Whether the session's workspace is still that sandbox and no run of the
        session is queued or running: then whatever runs there is left over from a
        settled run, and may be stopped in the block. The session's admission lock is
        held until the block ends, so no run is admitted to it meanwhile."""
        params = {
            "session_id": check_id(session_id, "session_id"),
            "sandbox_id": check_id(sandbox_id, "sandbox_id"),
            "ttl": 0.0,
            "lock_key": session_lock_key(session_id),
        }
        with self._db.transaction("quiet_workspace", session_id=session_id) as tx:
            tx.rows(sql.admission.LOCK_SESSION, params)
            yield tx.one(sql.workspaces.QUIET_WORKSPACE, params) is not None

    def kept_workspaces(self) -> set[str]:
        """The sandbox ids that are sessions' workspaces: never a settled run's to destroy,
        nor an orphan."""
        return {
            str(r["sandbox_id"]) for r in self._db.rows("kept", sql.workspaces.KEPT_WORKSPACES, {})
        }
