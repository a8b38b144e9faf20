"""The fleet page's activity reads: runs by when they started and settled, attempts by
when they started, and superseded attempts by when they were handed over, so that
counting the last minutes reads an index range instead of every row.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_runs_started_at"), "runs", ["started_at"])
    op.create_index(op.f("ix_runs_finished_at"), "runs", ["finished_at"])
    op.create_index(op.f("ix_attempts_started_at"), "attempts", ["started_at"])
    op.create_index(
        op.f("ix_attempts_ended_at_superseded"),
        "attempts",
        ["ended_at"],
        postgresql_where=sa.text("outcome = 'superseded'"),
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_attempts_ended_at_superseded"), table_name="attempts")
    op.drop_index(op.f("ix_attempts_started_at"), table_name="attempts")
    op.drop_index(op.f("ix_runs_finished_at"), table_name="runs")
    op.drop_index(op.f("ix_runs_started_at"), table_name="runs")
