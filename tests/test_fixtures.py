"""The shared fixtures isolate tests from each other."""

from __future__ import annotations

import psycopg
import redis

from turnkeeper.store import migration


def test_database_is_fresh_and_at_head(database_url: str) -> None:
    assert migration.current_revision(database_url) == migration.head_revision()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE scratch (x int)")
        conn.execute("INSERT INTO scratch VALUES (1)")


def test_second_database_does_not_see_the_first(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass('scratch')").fetchone()
    assert row == (None,)


def test_namespaces_are_unique_and_cleaned(redis_url: str, namespace: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=f"{namespace}:*")) == []
        client.set(f"{namespace}:probe", b"1")
        assert client.get(f"{namespace}:probe") == b"1"
    finally:
        client.close()
