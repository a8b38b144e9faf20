"""Adoption: a handed-over run waits, without a lease, for a worker to adopt it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

_TS = sa.TIMESTAMP(timezone=True)
_PENDING = sa.text("handed_over_at IS NOT NULL")


def upgrade() -> None:
    op.add_column("runs", sa.Column("handed_over_at", _TS, nullable=True))
    op.drop_constraint(op.f("ck_runs_owned_when_running"), "runs", type_="check")
    op.create_check_constraint(
        op.f("ck_runs_owned_when_running"),
        "runs",
        "status <> 'running' OR (attempt_id IS NOT NULL "
        "AND (lease_expires_at IS NOT NULL OR handed_over_at IS NOT NULL))",
    )
    op.create_check_constraint(
        op.f("ck_runs_pending_has_no_lease"),
        "runs",
        "handed_over_at IS NULL OR (status = 'running' AND lease_expires_at IS NULL)",
    )
    op.create_index(
        "ix_runs_handed_over_at_pending", "runs", ["handed_over_at"], postgresql_where=_PENDING
    )


def downgrade() -> None:
    op.drop_index("ix_runs_handed_over_at_pending", table_name="runs")
    op.drop_constraint(op.f("ck_runs_pending_has_no_lease"), "runs", type_="check")
    op.drop_constraint(op.f("ck_runs_owned_when_running"), "runs", type_="check")
    # A run still awaiting adoption gets an expired lease, so a reconciler takes it over.
    op.execute("UPDATE runs SET lease_expires_at = handed_over_at WHERE handed_over_at IS NOT NULL")
    op.create_check_constraint(
        op.f("ck_runs_owned_when_running"),
        "runs",
        "status <> 'running' OR (attempt_id IS NOT NULL AND lease_expires_at IS NOT NULL)",
    )
    op.drop_column("runs", "handed_over_at")
