"""Contract tests: a session's workspace recorded with its run's placement, read back,
and retired once the session has been idle for the TTL (docs/architecture.md,
"Session workspaces")."""

from __future__ import annotations

import threading
import time

import psycopg

from tests.store.conftest import admit, claimed
from turnkeeper.store import Store, Verdict
from turnkeeper.store.admission import session_lock_key
from turnkeeper.store.workspaces import IdleWorkspace, Workspace

HOST_LOCAL = ("local", "bwrap")


def _sandbox(name: str, provider: str = "bwrap") -> dict[str, object]:
    return {"provider": provider, "id": name, "root": f"/sandboxes/{name}"}


def _placement(name: str, host: str | None = "h1", provider: str = "bwrap") -> dict[str, object]:
    return {"sandbox": _sandbox(name, provider), "journals": [], "host": host}


def test_a_kept_placement_is_the_sessions_workspace_in_the_same_write(store: Store) -> None:
    claim = claimed(store, "r1", "s1")
    assert store.session_workspace("s1") is None
    assert store.record_sandbox(claim, _placement("w1")) is Verdict.DONE
    assert store.session_workspace("s1") is None, "a run's own sandbox is not the session's"
    assert store.record_sandbox(claim, _placement("w1"), keeps_workspace=True) is Verdict.DONE
    assert store.session_workspace("s1") == Workspace(_sandbox("w1"), "h1")
    assert store.kept_workspaces() == {"w1"}
    assert store.session_workspace("unknown") is None


def test_a_stale_attempt_records_no_workspace(store: Store) -> None:
    claim = claimed(store, "r1", "s1")
    assert store.record_sandbox(claim, _placement("w1"), keeps_workspace=True) is Verdict.DONE
    assert store.settle_run(claim, "completed") is Verdict.DONE
    refused = store.record_sandbox(claim, _placement("w2"), keeps_workspace=True)
    assert refused is Verdict.NOT_OWNER
    assert store.session_workspace("s1") == Workspace(_sandbox("w1"), "h1")


def test_idle_workspaces_wait_for_the_ttl_and_split_by_host(store: Store) -> None:
    local = claimed(store, "r1", "s1")
    remote = claimed(store, "r2", "s2")
    store.record_sandbox(local, _placement("w1"), keeps_workspace=True)
    store.record_sandbox(remote, _placement("w2", host="h1", provider="ssh"), keeps_workspace=True)
    # Running: not idle, whatever the TTL.
    assert store.idle_workspaces(0.001, 10, host="h1", host_local=HOST_LOCAL) == []
    assert store.settle_run(local, "completed") is Verdict.DONE
    assert store.settle_run(remote, "completed") is Verdict.DONE
    assert store.idle_workspaces(3600, 10, host="h1", host_local=HOST_LOCAL) == []
    time.sleep(0.01)
    assert store.idle_workspaces(0.001, 10, host="h1", host_local=HOST_LOCAL) == [
        IdleWorkspace("s1", _sandbox("w1"))
    ]
    assert store.idle_workspaces(0.001, 10, host="h2", host_local=HOST_LOCAL) == []
    assert store.idle_workspaces(0.001, 10, host_local=HOST_LOCAL) == [
        IdleWorkspace("s2", _sandbox("w2", "ssh"))
    ]
    # A queued follow-up makes the session busy again.
    admit(store, "r3", "s1")
    assert store.idle_workspaces(0.001, 10, host="h1", host_local=HOST_LOCAL) == []
    assert not store.retire_workspace("s1", "w1", 0.001)


def test_retiring_a_workspace_leaves_why_it_is_gone(store: Store) -> None:
    claim = claimed(store, "r1", "s1")
    store.record_sandbox(claim, _placement("w1"), keeps_workspace=True)
    store.settle_run(claim, "completed")
    time.sleep(0.01)
    assert not store.retire_workspace("s1", "other", 0.001), "only the sandbox it still names"
    assert store.retire_workspace("s1", "w1", 0.001)
    assert store.session_workspace("s1") == Workspace(None, None, "expired")
    assert not store.retire_workspace("s1", "w1", 0.001)
    assert store.kept_workspaces() == set()
    assert store.idle_workspaces(0.001, 10, host="h1", host_local=HOST_LOCAL) == []


def test_an_admission_holding_the_session_lock_keeps_the_workspace(
    store: Store, database_url: str
) -> None:
    """The retire waits for an admission in flight (the session's advisory lock) and then
    sees its run: the session is busy, the workspace stays."""
    claim = claimed(store, "r1", "s1")
    store.record_sandbox(claim, _placement("w1"), keeps_workspace=True)
    store.settle_run(claim, "completed")
    time.sleep(0.01)
    retired: list[bool] = []
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (session_lock_key("s1"),)
        )
        conn.execute(
            "INSERT INTO runs (run_id, session_id, status, payload, max_attempts) "
            "VALUES ('r2', 's1', 'queued', '{}', 1)"
        )
        retire = threading.Thread(
            target=lambda: retired.append(store.retire_workspace("s1", "w1", 0.001))
        )
        retire.start()
        retire.join(0.5)
        assert retire.is_alive(), "the retire waits for the session's lock"
        conn.commit()
    retire.join()
    assert retired == [False]
    assert store.session_workspace("s1") == Workspace(_sandbox("w1"), "h1")
