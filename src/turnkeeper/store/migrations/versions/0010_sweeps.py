"""Beat's sweeps: when each periodic sweep (reconcile, reap, prune) last finished, so
that the fleet page can say when the reconciler last ran and warn once it is overdue.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "finished_at",
            sa.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_sweeps")),
    )


def downgrade() -> None:
    op.drop_table("sweeps")
