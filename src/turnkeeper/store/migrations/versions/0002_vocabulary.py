"""One word per concept: turn slots, segments keyed by journal.

``turn_journals`` becomes ``turn_slots`` (the phase of a run's current turn) and
``stream_segments`` becomes ``segments`` (journal bytes stored in Postgres),
whose key column is ``journal_key``: "journal" now only ever means the agent's
stdout file, and "stream" only the client's event stream.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

# (old, new) for tables, columns, constraints and indexes, applied in this order.
_TABLES = (("turn_journals", "turn_slots"), ("stream_segments", "segments"))
_COLUMNS = (
    ("turn_slots", "stream_key", "journal_key"),
    ("turn_slots", "stream_consumed_at", "journal_consumed_at"),
    ("segments", "stream_key", "journal_key"),
)
_CONSTRAINTS = (
    ("turn_slots", "pk_turn_journals", "pk_turn_slots"),
    ("turn_slots", "ck_turn_journals_phase", "ck_turn_slots_phase"),
    ("turn_slots", "fk_turn_journals_run_id_runs", "fk_turn_slots_run_id_runs"),
    ("segments", "pk_stream_segments", "pk_segments"),
    ("segments", "ck_stream_segments_extent", "ck_segments_extent"),
    ("segments", "fk_stream_segments_run_id_runs", "fk_segments_run_id_runs"),
)
_INDEXES = (("ix_stream_segments_run_id", "ix_segments_run_id"),)


def _rename(forward: bool) -> None:
    def pick(old: str, new: str) -> tuple[str, str]:
        return (old, new) if forward else (new, old)

    # Tables carry their new names while columns, constraints and indexes are renamed:
    # renamed first on the way up, last on the way down.
    for old, new in _TABLES if forward else ():
        op.rename_table(old, new)
    for table, old, new in _COLUMNS:
        a, b = pick(old, new)
        op.alter_column(table, a, new_column_name=b)
    for table, old, new in _CONSTRAINTS:
        a, b = pick(old, new)
        op.execute(f'ALTER TABLE {table} RENAME CONSTRAINT "{a}" TO "{b}"')
    for old, new in _INDEXES:
        a, b = pick(old, new)
        op.execute(f'ALTER INDEX "{a}" RENAME TO "{b}"')
    for old, new in () if forward else _TABLES:
        op.rename_table(new, old)


def upgrade() -> None:
    _rename(forward=True)


def downgrade() -> None:
    _rename(forward=False)
