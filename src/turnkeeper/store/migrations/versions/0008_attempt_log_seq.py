"""Attempts: the run log's position where each takeover's attempt began (the first
seq it could append), which the run page marks the takeover at.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("log_seq", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("attempts", "log_seq")
