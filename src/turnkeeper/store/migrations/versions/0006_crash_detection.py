"""Crash detection: the attempt whose owner holds the run's owner lock, and why each
superseded attempt was handed over.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("lock_attempt_id", sa.Text, nullable=True))
    op.add_column("attempts", sa.Column("handover_cause", sa.Text, nullable=True))
    op.create_check_constraint(
        op.f("ck_attempts_handover_cause"),
        "attempts",
        "handover_cause IN ('crash', 'lease', 'forced')",
    )
    # Every takeover before this revision waited for the lease.
    op.execute("UPDATE attempts SET handover_cause = 'lease' WHERE outcome = 'superseded'")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_attempts_handover_cause"), "attempts", type_="check")
    op.drop_column("attempts", "handover_cause")
    op.drop_column("runs", "lock_attempt_id")
