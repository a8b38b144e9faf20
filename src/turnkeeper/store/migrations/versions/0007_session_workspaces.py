"""Sessions: the workspace a session's runs share (and the host that made it), and the
agent's own conversation id each run reported, which a follow-up resumes.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("agent_session_id", sa.Text, nullable=True))
    op.add_column("sessions", sa.Column("workspace", JSONB, nullable=True))
    op.add_column("sessions", sa.Column("workspace_host", sa.Text, nullable=True))
    op.create_index(
        op.f("ix_sessions_workspace_host"),
        "sessions",
        ["workspace_host"],
        postgresql_where=sa.text("jsonb_typeof(workspace -> 'sandbox') = 'object'"),
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_workspace_host"), table_name="sessions")
    op.drop_column("sessions", "workspace_host")
    op.drop_column("sessions", "workspace")
    op.drop_column("runs", "agent_session_id")
