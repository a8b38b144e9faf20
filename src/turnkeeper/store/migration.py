"""Schema migrations: upgrade a database to the head revision and tell where it stands.

Alembic is driven from code (no ``alembic.ini``): the script location is this
package's ``migrations`` folder and the connection is handed to ``env.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from turnkeeper.config import sqlalchemy_postgres_url
from turnkeeper.errors import StoreUnavailableError

# Serializes concurrent upgrades (two workers starting at once) on one database.
_UPGRADE_LOCK_KEY = 0x7475726E6B6565  # "turnkee"


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("turnkeeper.store") / "migrations"))
    return config


def head_revision() -> str | None:
    """The newest revision this code knows."""
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


@contextmanager
def _connect(database_url: str) -> Iterator[sa.Connection]:
    engine = sa.create_engine(sqlalchemy_postgres_url(database_url), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            yield connection
    except sa.exc.OperationalError as exc:
        raise StoreUnavailableError(
            f"cannot reach the database: {str(exc.orig).strip().splitlines()[0]}",
            reason="unreachable",
        ) from exc
    finally:
        engine.dispose()


def upgrade(database_url: str, revision: str = "head") -> str | None:
    """Upgrade the schema (under an advisory lock) and return the revision it is at."""
    with _connect(database_url) as connection:
        connection.execute(sa.select(sa.func.pg_advisory_lock(_UPGRADE_LOCK_KEY)))
        try:
            config = _alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
            connection.commit()
        finally:
            connection.execute(sa.select(sa.func.pg_advisory_unlock(_UPGRADE_LOCK_KEY)))
            connection.commit()
        return MigrationContext.configure(connection).get_current_revision()


def current_revision(database_url: str) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with _connect(database_url) as connection:
        return MigrationContext.configure(connection).get_current_revision()
