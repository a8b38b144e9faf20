"""Alembic environment: the connection comes from ``turnkeeper.store.migration``."""

from __future__ import annotations

from alembic import context

from turnkeeper.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
