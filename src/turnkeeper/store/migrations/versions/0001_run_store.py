"""The run store: runs, attempts, turn journal slots, stream segments, transcript tree.

Revision ID: 0001
Revises:
Create Date: 2026-08-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

_TS = sa.TIMESTAMP(timezone=True)


def _now() -> sa.TextClause:
    return sa.text("now()")


def _cascade_to(table: str, column: str, owner: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column],
        [f"{table}.{column}"],
        name=op.f(f"fk_{owner}_{column}_{table}"),
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("leaf_id", sa.Text(), nullable=True),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", _TS, server_default=_now(), nullable=False),
        sa.Column("updated_at", _TS, server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_sessions")),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("payload", JSONB(), nullable=False),
        sa.Column("attempt_id", sa.Text(), nullable=True),
        sa.Column("epoch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", _TS, nullable=True),
        sa.Column("attempt_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("deadline", _TS, nullable=True),
        sa.Column("cancel_requested_at", _TS, nullable=True),
        sa.Column("sandbox_ref", JSONB(), nullable=True),
        sa.Column("created_at", _TS, server_default=_now(), nullable=False),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("finished_at", _TS, nullable=True),
        sa.Column("updated_at", _TS, server_default=_now(), nullable=False),
        sa.Column("error", JSONB(), nullable=True),
        sa.Column("dispatched_at", _TS, nullable=True),
        sa.Column("pruned_at", _TS, nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'completed', 'failed', 'aborted')",
            name=op.f("ck_runs_status"),
        ),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_runs_max_attempts")),
        sa.CheckConstraint(
            "status <> 'running' OR (attempt_id IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name=op.f("ck_runs_owned_when_running"),
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
        sa.UniqueConstraint("seq", name=op.f("uq_runs_seq")),
    )
    op.create_index("ix_runs_session_id_seq", "runs", ["session_id", "seq"])
    op.create_index("ix_runs_status_seq", "runs", ["status", "seq"])
    op.create_index(
        "uq_runs_session_id_running",
        "runs",
        ["session_id"],
        unique=True,
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "ix_runs_lease_expires_at_running",
        "runs",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "ix_runs_finished_at_unpruned",
        "runs",
        ["finished_at"],
        postgresql_where=sa.text("finished_at IS NOT NULL AND pruned_at IS NULL"),
    )
    op.create_table(
        "attempts",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("started_at", _TS, server_default=_now(), nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        _cascade_to("runs", "run_id", "attempts"),
        sa.PrimaryKeyConstraint("run_id", "attempt_id", name=op.f("pk_attempts")),
    )
    op.create_table(
        "turn_journals",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.Text(), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("stream_key", sa.Text(), nullable=True),
        sa.Column("tool_request", JSONB(), nullable=True),
        sa.Column("checkpoint_leaf_id", sa.Text(), nullable=True),
        sa.Column("committed_leaf_id", sa.Text(), nullable=True),
        sa.Column("stream_consumed_at", _TS, nullable=True),
        sa.Column("created_at", _TS, server_default=_now(), nullable=False),
        sa.Column("updated_at", _TS, server_default=_now(), nullable=False),
        sa.CheckConstraint(
            "phase IN ('before_provider', 'provider_started', 'tool_request_recorded', "
            "'committed')",
            name=op.f("ck_turn_journals_phase"),
        ),
        _cascade_to("runs", "run_id", "turn_journals"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_turn_journals")),
    )
    op.create_table(
        "stream_segments",
        sa.Column("stream_key", sa.Text(), nullable=False),
        sa.Column("byte_start", sa.BigInteger(), nullable=False),
        sa.Column("byte_end", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, server_default=_now(), nullable=False),
        sa.CheckConstraint(
            "byte_end > byte_start AND byte_start >= 0", name=op.f("ck_stream_segments_extent")
        ),
        _cascade_to("runs", "run_id", "stream_segments"),
        sa.PrimaryKeyConstraint("stream_key", "byte_start", name=op.f("pk_stream_segments")),
    )
    op.create_index("ix_stream_segments_run_id", "stream_segments", ["run_id"])
    op.create_table(
        "transcript_entries",
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("entry_id", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.Text(), nullable=True),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("body", JSONB(), nullable=False),
        sa.Column("position", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("created_at", _TS, server_default=_now(), nullable=False),
        _cascade_to("sessions", "session_id", "transcript_entries"),
        sa.PrimaryKeyConstraint("session_id", "entry_id", name=op.f("pk_transcript_entries")),
    )
    op.create_index(
        "ix_transcript_entries_session_id_position",
        "transcript_entries",
        ["session_id", "position"],
    )
    op.create_table(
        "session_deletions",
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("deleted_at", _TS, server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_session_deletions")),
    )
    op.create_table(
        "run_receipts",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("deleted_at", _TS, server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_receipts")),
    )


def downgrade() -> None:
    for table in (
        "run_receipts",
        "session_deletions",
        "transcript_entries",
        "stream_segments",
        "turn_journals",
        "attempts",
        "runs",
        "sessions",
    ):
        op.drop_table(table)
