"""The hand-written migration creates exactly what schema.py describes."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from turnkeeper.config import sqlalchemy_postgres_url
from turnkeeper.store import migration
from turnkeeper.store.schema import metadata


def test_the_migrated_database_matches_the_schema(database_url: str) -> None:
    assert migration.current_revision(database_url) == migration.head_revision() == "0011"
    engine = sa.create_engine(sqlalchemy_postgres_url(database_url), poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_downgrade_and_upgrade_again(database_url: str) -> None:
    engine = sa.create_engine(sqlalchemy_postgres_url(database_url), poolclass=sa.NullPool)
    try:
        config = migration._alembic_config()
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "base")
            conn.commit()
            assert sa.inspect(conn).get_table_names() == ["alembic_version"]
        assert migration.upgrade(database_url) == "0011"
    finally:
        engine.dispose()
