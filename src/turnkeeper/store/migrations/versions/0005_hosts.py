"""Hosts: the host of each run's sandbox, and the worker processes' heartbeats.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

_TS = sa.TIMESTAMP(timezone=True)
_NOW = sa.text("now()")


def upgrade() -> None:
    op.add_column("runs", sa.Column("sandbox_host", sa.Text(), nullable=True))
    op.create_index("ix_runs_sandbox_host", "runs", ["sandbox_host"])
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("host_id", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("main_pid", sa.Integer(), nullable=False),
        sa.Column("started_at", _TS, server_default=_NOW, nullable=False),
        sa.Column("last_seen", _TS, server_default=_NOW, nullable=False),
        sa.Column("draining_at", _TS, nullable=True),
        sa.Column("hand_over_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
    )
    op.create_index("ix_workers_host_id_last_seen", "workers", ["host_id", "last_seen"])


def downgrade() -> None:
    op.drop_index("ix_workers_host_id_last_seen", table_name="workers")
    op.drop_table("workers")
    op.drop_index("ix_runs_sandbox_host", table_name="runs")
    op.drop_column("runs", "sandbox_host")
