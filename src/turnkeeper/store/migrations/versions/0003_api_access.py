"""API access: keys (stored as hashes) and the key each run and session belongs to.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_TS = sa.TIMESTAMP(timezone=True)
_UNSETTLED = sa.text("status IN ('queued', 'running')")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("key_hash", sa.LargeBinary(), nullable=False),
        sa.Column("admin", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("allow_commands", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("created_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("last_used_at", _TS, nullable=True),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.CheckConstraint(
            "max_running IS NULL OR max_running >= 1", name=op.f("ck_api_keys_max_running")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    for table in ("runs", "sessions"):
        op.add_column(table, sa.Column("key_name", sa.Text(), nullable=True))
        op.create_foreign_key(
            op.f(f"fk_{table}_key_name_api_keys"), table, "api_keys", ["key_name"], ["name"]
        )
    op.create_index("ix_runs_key_name_seq", "runs", ["key_name", "seq"])
    op.create_index("ix_runs_key_name_unsettled", "runs", ["key_name"], postgresql_where=_UNSETTLED)


def downgrade() -> None:
    op.drop_index("ix_runs_key_name_unsettled", table_name="runs")
    op.drop_index("ix_runs_key_name_seq", table_name="runs")
    for table in ("sessions", "runs"):
        op.drop_constraint(op.f(f"fk_{table}_key_name_api_keys"), table, type_="foreignkey")
        op.drop_column(table, "key_name")
    op.drop_table("api_keys")
