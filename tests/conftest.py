"""Real services for every test: the configured servers in CI, the embedded ones elsewhere.

The controller process resolves the servers once (starting the embedded stack
when TURNKEEPER_DATABASE_URL / TURNKEEPER_REDIS_URL are unset) and exports the
URLs, so xdist workers inherit them. Each test gets a database cloned from a
template migrated to head, and a Redis key namespace of its own.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import psycopg
import pytest
import redis
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from tests.sandboxes import release_sandboxes
from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.embedded import EmbeddedStack
from turnkeeper.store import migration

pytest_plugins = ["tests.tiers"]

_STARTED_KEY = "_turnkeeper_started_servers"
TEST_SECRET = "turnkeeper-test-secret-" + "0123456789abcdef" * 2
_TEMPLATE_LOCK = 0x746B746D706C  # "tktmpl"


def _test_data_dir() -> Path:
    return Path(os.environ.get("TURNKEEPER_DATA_DIR", ".turnkeeper")).resolve()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller has exported the URLs
    if os.environ.get("TURNKEEPER_DATABASE_URL") and os.environ.get("TURNKEEPER_REDIS_URL"):
        return
    stack = EmbeddedStack(_test_data_dir())
    urls = stack.start()
    os.environ.setdefault("TURNKEEPER_DATABASE_URL", urls.database_url)
    os.environ.setdefault("TURNKEEPER_REDIS_URL", urls.redis_url)
    setattr(config, _STARTED_KEY, (stack, urls.started))


def pytest_unconfigure(config: pytest.Config) -> None:
    started = getattr(config, _STARTED_KEY, None)
    if started:
        stack, servers = started
        if servers:
            stack.stop(only=servers)


def pytest_report_header(config: pytest.Config) -> str:
    db = make_url(plain_postgres_url(os.environ["TURNKEEPER_DATABASE_URL"]))
    redis_url = os.environ["TURNKEEPER_REDIS_URL"]
    return f"turnkeeper services: postgres {db.host}:{db.port}, redis {redis_url}"


# --- Postgres --------------------------------------------------------------------------


def _schema_fingerprint() -> str:
    """Changes whenever a migration or the schema changes, so templates never go stale."""
    digest = hashlib.sha256()
    root = files("turnkeeper.store")
    for path in sorted(Path(str(root / "migrations" / "versions")).glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(Path(str(root / "schema.py")).read_bytes())
    return digest.hexdigest()[:12]


def _url_for(base_url: str, database: str) -> str:
    return (
        make_url(plain_postgres_url(base_url))
        .set(database=database)
        .render_as_string(hide_password=False)
    )


@pytest.fixture(scope="session")
def admin_database_url() -> str:
    """The configured (or embedded) database, used only to create and drop test databases."""
    return plain_postgres_url(os.environ["TURNKEEPER_DATABASE_URL"])


@pytest.fixture(scope="session")
def template_database(admin_database_url: str) -> str:
    """A database migrated to head, built once per schema version for all workers."""
    name = f"tk_tpl_{_schema_fingerprint()}"
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
        try:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                building = f"{name}_building"
                conn.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{building}"')
                migration.upgrade(_url_for(admin_database_url, building))
                conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))
    return name


@pytest.fixture
def database_url(admin_database_url: str, template_database: str) -> Iterator[str]:
    """A fresh database of this test's own, cloned from the migrated template.

    Copied as files (``FILE_COPY``), not block by block through the WAL (the default
    since PostgreSQL 15): the template's 8 MB, written to the WAL for each of a
    thousand tests, cost more than the checkpoint a file copy takes."""
    name = f"tk_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}" STRATEGY FILE_COPY')
    try:
        yield _url_for(admin_database_url, name)
    finally:
        with psycopg.connect(admin_database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- Redis -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["TURNKEEPER_REDIS_URL"]


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    value = f"tktest-{uuid.uuid4().hex[:12]}"
    yield value
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{value}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


@pytest.fixture
def settings(
    database_url: str, redis_url: str, namespace: str, tmp_path: Path
) -> Iterator[Settings]:
    """Settings pointing at this test's database, Redis namespace and data directory.

    Afterwards, whatever the test's workers left on this host outside its directory is
    released: its sandboxes' cgroups and uids, and the egress proxies they started.
    """
    settings = Settings(
        database_url=database_url,
        redis_url=redis_url,
        namespace=namespace,
        data_dir=tmp_path / "data",
        secret=SecretStr(TEST_SECRET),
    )
    yield settings
    release_sandboxes(settings)
