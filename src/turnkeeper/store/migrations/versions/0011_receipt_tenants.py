"""Run receipts: the tenant (API key) of each deleted run, so that only that key is
told the session its run id belonged to; every other key learns only that the id is
taken. Receipts written before have none, as the trusted caller's do.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("run_receipts", sa.Column("key_name", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("run_receipts", "key_name")
