"""API keys and tenants in the store: hashes only, revoke for good, quotas under races."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from turnkeeper.config import plain_postgres_url
from turnkeeper.errors import ApiKeyError, InvalidInputError, QuotaExceededError, RunConflictError
from turnkeeper.store import Store
from turnkeeper.store.keys import hash_key

SEALED: dict[str, Any] = {"prompt": "p", "env": {"digest": "d1", "sealed": "v1.AAAA"}}


def test_a_key_is_shown_once_and_stored_as_its_hash(store: Store, database_url: str) -> None:
    key = store.create_key("alice", allow_commands=True, max_running=2)
    assert key.startswith("tk_")
    assert len(key) == 3 + 43  # 256 random bits, base64url
    with psycopg.connect(plain_postgres_url(database_url)) as conn:
        rows = conn.execute("SELECT name, key_hash FROM api_keys").fetchall()
    assert rows == [("alice", hash_key(key))]
    found = store.authenticate_key(key)
    assert found is not None
    assert (found.name, found.admin, found.allow_commands, found.max_running) == (
        "alice", False, True, 2,
    )  # fmt: skip
    assert found.last_used_at is None  # the row as it was read; the use is recorded
    assert store.list_keys()[0].last_used_at is not None
    for wrong in ("", "tk_", key[:-1], key + "x", key.upper(), "x" * 10_000):
        assert store.authenticate_key(wrong) is None


def test_names_are_checked_and_never_reused(store: Store) -> None:
    store.create_key("alice")
    with pytest.raises(ApiKeyError) as taken:
        store.create_key("alice")
    assert taken.value.reason == "key-name-taken"
    store.revoke_key("alice")
    with pytest.raises(ApiKeyError):
        store.create_key("alice")  # not even after a revoke: its runs stay its own
    for bad in ("", "-x", "a b", "a/b", "x" * 65, "é"):
        with pytest.raises(InvalidInputError):
            store.create_key(bad)
    with pytest.raises(InvalidInputError):
        store.create_key("b", max_running=0)


def test_a_revoked_key_is_refused_at_once(store: Store) -> None:
    key = store.create_key("alice")
    assert store.authenticate_key(key) is not None
    assert store.active_key_count() == 1
    revoked = store.revoke_key("alice")
    assert revoked.revoked_at is not None
    assert store.authenticate_key(key) is None
    assert store.active_key_count() == 0
    assert store.revoke_key("alice").revoked_at == revoked.revoked_at  # idempotent
    with pytest.raises(ApiKeyError) as unknown:
        store.revoke_key("nobody")
    assert unknown.value.reason == "unknown-key"
    with pytest.raises(ApiKeyError) as refused:
        store.admit_run("r1", "s1", {}, max_attempts=1, deadline=None, key_name="alice")
    assert refused.value.reason == "revoked-key"
    assert store.get_run("r1") is None


def test_runs_and_sessions_belong_to_their_key(store: Store) -> None:
    store.create_key("alice")
    store.create_key("bob")
    run, _ = store.admit_run("r1", "s1", {"p": 1}, max_attempts=1, deadline=None, key_name="alice")
    assert run.key_name == "alice"
    assert store.session_tenant("s1") == (True, "alice")
    assert store.session_tenant("nope") == (False, None)
    store.admit_run(
        "order-42", "order-42", {"p": 1}, max_attempts=1, deadline=None, key_name="alice"
    )
    store.admit_run("b1", "sb", {"p": 1}, max_attempts=1, deadline=None, key_name="bob")
    # A run id that exists is what is taken, also where the session is another
    # tenant's: the run's own session, named after it, or one the request names.
    cases = [
        ("order-42", "order-42", "bob", "run-id-taken"),
        ("order-42", "order-42", None, "run-id-taken"),
        ("r1", "s1", "bob", "run-id-taken"),
        ("r1", "s2", "bob", "run-id-taken"),
        ("r1", "sb", "alice", "session-differs"),
        ("r1", "order-42", "alice", "session-differs"),
        ("r2", "s1", "bob", "session-taken"),
        ("r2", "s1", None, "session-taken"),  # a trusted client too must say whose it is
        ("r1", "s9", None, "run-id-taken"),
    ]
    for run_id, session_id, key_name, reason in cases:
        with pytest.raises(RunConflictError) as caught:
            store.admit_run(
                run_id, session_id, {"p": 1}, max_attempts=1, deadline=None, key_name=key_name
            )
        assert caught.value.reason == reason, (run_id, session_id, key_name)
    assert [r.run_id for r in store.list_runs(key_name="alice")] == ["order-42", "r1"]
    assert [r.run_id for r in store.list_runs(key_name="bob")] == ["b1"]
    assert [r.run_id for r in store.list_runs()] == ["b1", "order-42", "r1"]
    with pytest.raises(ApiKeyError):
        store.admit_run("c1", "sc", {}, max_attempts=1, deadline=None, key_name="carol")


def test_a_replay_matches_on_the_env_digest_not_on_the_ciphertext(store: Store) -> None:
    store.admit_run("r1", "s1", SEALED, max_attempts=1, deadline=None)
    resealed = {"prompt": "p", "env": {"digest": "d1", "sealed": "v1.BBBB"}}
    again, created = store.admit_run("r1", "s1", resealed, max_attempts=1, deadline=None)
    assert not created
    assert again.payload == SEALED  # the first sealing stays
    other = {"prompt": "p", "env": {"digest": "d2", "sealed": "v1.CCCC"}}
    with pytest.raises(RunConflictError):
        store.admit_run("r1", "s1", other, max_attempts=1, deadline=None)


def test_the_sealed_env_is_deleted_when_the_run_settles(store: Store) -> None:
    for run_id in ("done", "cancelled"):
        store.admit_run(run_id, run_id, SEALED, max_attempts=1, deadline=None)
    claim = store.claim_run("done", "w", 30)
    assert claim is not None
    assert store.get_run("done").payload["env"]["sealed"] == "v1.AAAA"  # type: ignore[union-attr]
    assert store.settle_run(claim, "completed")
    store.request_cancel("cancelled")
    for run_id in ("done", "cancelled"):
        run = store.get_run(run_id)
        assert run is not None
        assert run.payload == {"prompt": "p", "env": {"digest": "d1"}}, run_id


def test_max_running_holds_under_racing_admissions(store: Store) -> None:
    store.create_key("carol", max_running=3)
    outcomes: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def submit(n: int) -> None:
        start.wait()
        try:
            store.admit_run(
                f"r{n}", f"s{n}", {"n": n}, max_attempts=1, deadline=None, key_name="carol"
            )
            outcome = "admitted"
        except QuotaExceededError as exc:
            outcome = f"refused after {exc.fields['retry_after']}s"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["admitted"] * 3 + ["refused after 10s"] * 5
    admitted = store.list_runs(key_name="carol")
    assert len(admitted) == 3
    # A replay of an admitted run is not a new one; a settled run frees its place.
    replayed = admitted[0]
    store.admit_run(
        replayed.run_id, replayed.session_id, replayed.payload,
        max_attempts=1, deadline=None, key_name="carol",
    )  # fmt: skip
    store.request_cancel(replayed.run_id)
    store.admit_run("late", "late", {}, max_attempts=1, deadline=None, key_name="carol")
