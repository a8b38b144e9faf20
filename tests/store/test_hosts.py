"""Contract tests: worker heartbeats, host liveness and drains (store/hosts.py), on the
database clock."""

from __future__ import annotations

import time

import psycopg

from turnkeeper.store import Store

DEAD_AFTER = 0.5


def _age(database_url: str, worker_id: str, seconds: float) -> None:
    """As if ``worker_id`` had not beaten for ``seconds``."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE workers SET last_seen = now() - make_interval(secs => %s) WHERE worker_id = %s",
            (seconds, worker_id),
        )


def _hand_over_at(database_url: str, worker_id: str) -> float:
    """Seconds from now to the worker's hand-over time."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT EXTRACT(EPOCH FROM hand_over_at - now()) FROM workers WHERE worker_id = %s",
            (worker_id,),
        ).fetchone()
    assert row is not None
    return float(row[0])


def test_a_host_is_alive_while_any_of_its_workers_beats(store: Store, database_url: str) -> None:
    """One process of host A dead, one alive: A is alive, whichever row is older. Both
    gone: dead, and listed among the dead hosts, the one that died last first."""
    store.start_worker("a:1", "host-a", 1, 1)
    store.start_worker("a:2", "host-a", 2, 2)
    store.start_worker("b:1", "host-b", 1, 1)
    _age(database_url, "a:1", 3600)
    assert store.host_alive("host-a", DEAD_AFTER)
    assert store.live_hosts(DEAD_AFTER) == ["host-a", "host-b"]
    assert store.dead_hosts(DEAD_AFTER, 10) == []
    _age(database_url, "a:2", 60)
    _age(database_url, "b:1", 30)
    assert not store.host_alive("host-a", DEAD_AFTER)
    assert store.dead_hosts(DEAD_AFTER, 10) == ["host-b", "host-a"]
    assert store.dead_hosts(DEAD_AFTER, 1) == ["host-b"]
    store.beat_worker("a:1", "host-a", 1, 1)  # the dead process's row beats again
    assert store.host_alive("host-a", DEAD_AFTER)
    assert store.dead_hosts(DEAD_AFTER, 10) == ["host-b"]


def test_a_second_drain_never_puts_off_a_hand_over_already_ordered(
    store: Store, database_url: str
) -> None:
    """Two operators drain one host: the earlier hand-over time holds. The second drain
    marks no worker anew and moves no deadline later; one that is sooner wins."""
    store.start_worker("a:1", "host-a", 1, 1)
    marked = store.drain_workers("host-a", 60, 5)
    assert [w.worker_id for w in marked] == ["a:1"]
    assert _hand_over_at(database_url, "a:1") < 5
    again = store.drain_workers("host-a", 60, 600)
    assert [w.worker_id for w in again] == ["a:1"]
    assert _hand_over_at(database_url, "a:1") < 5, "the first deadline holds"
    store.drain_workers("host-a", 60, 0)
    assert _hand_over_at(database_url, "a:1") <= 0
    time.sleep(0.01)
    orders = store.beat_worker("a:1", "host-a", 1, 1)
    assert orders.draining
    assert orders.hand_over_due
