"""The store's tables, as one SQLAlchemy Core ``MetaData``; migrations follow it.

The statements that read and write these tables are in ``store/sql/``; this
module only says what exists, so that a migration can be checked against it.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_TS = sa.TIMESTAMP(timezone=True)
_NOW = sa.text("now()")

RUN_STATUSES = ("queued", "running", "completed", "failed", "aborted")
HANDOVER_CAUSES = ("crash", "lease", "forced")
TURN_PHASES = ("before_provider", "provider_started", "tool_request_recorded", "committed")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


# API keys: only a hash of each key is kept. A name is never reused (revoking keeps
# the row), so runs and sessions that belong to it can never pass to a new key.
api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("key_hash", sa.LargeBinary, nullable=False, unique=True),
    sa.Column("admin", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("allow_commands", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("max_running", sa.Integer, nullable=True),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("last_used_at", _TS, nullable=True),
    sa.Column("revoked_at", _TS, nullable=True),
    sa.CheckConstraint("max_running IS NULL OR max_running >= 1", name="max_running"),
)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("leaf_id", sa.Text, nullable=True),
    sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("updated_at", _TS, nullable=False, server_default=_NOW),
    # The tenant: the key whose first run opened the session (NULL: a trusted client).
    sa.Column("key_name", sa.Text, sa.ForeignKey("api_keys.name"), nullable=True),
    # The session's workspace (docs/architecture.md, "Session workspaces"): the sandbox
    # its runs share, {"sandbox": ref} as its latest run's placement names it, or
    # {"sandbox": null, "gone": reason} once the reaper destroyed it; and the host that
    # made it (where a host-local one lives).
    sa.Column("workspace", JSONB, nullable=True),
    sa.Column("workspace_host", sa.Text, nullable=True),
    sa.Index(
        "ix_sessions_workspace_host",
        "workspace_host",
        postgresql_where=sa.text("jsonb_typeof(workspace -> 'sandbox') = 'object'"),
    ),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    # Admission order; within a session it equals commit order (admission holds a
    # per-session advisory lock), so "no earlier unsettled run" is a sound head check.
    sa.Column("seq", sa.BigInteger, sa.Identity(always=True), nullable=False, unique=True),
    sa.Column("session_id", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("payload", JSONB, nullable=False),
    sa.Column("attempt_id", sa.Text, nullable=True),
    sa.Column("epoch", sa.Integer, nullable=False, server_default="0"),
    sa.Column("owner", sa.Text, nullable=True),
    sa.Column("lease_expires_at", _TS, nullable=True),
    sa.Column("attempt_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("deadline", _TS, nullable=True),
    sa.Column("cancel_requested_at", _TS, nullable=True),
    sa.Column("sandbox_ref", JSONB, nullable=True),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("started_at", _TS, nullable=True),
    sa.Column("finished_at", _TS, nullable=True),
    sa.Column("updated_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("error", JSONB, nullable=True),
    sa.Column("dispatched_at", _TS, nullable=True),
    sa.Column("pruned_at", _TS, nullable=True),
    # Set while a running run waits for a worker to adopt its new attempt (the
    # reconciler handed it over): no lease runs and no attempt is counted meanwhile.
    sa.Column("handed_over_at", _TS, nullable=True),
    # The attempt whose owner took the run's owner lock (an advisory lock its worker
    # process holds while it lives): only such a run is watched for its owner's death
    # (docs/architecture.md, "Crash detection").
    sa.Column("lock_attempt_id", sa.Text, nullable=True),
    # The tenant: the key that submitted the run (NULL: a trusted client on its own behalf).
    sa.Column("key_name", sa.Text, sa.ForeignKey("api_keys.name"), nullable=True),
    # The host whose worker started the run's current agent process (the placement
    # record's "host", copied by the statement that records it): where a host-local
    # sandbox lives, so its takeover, reap and signals go to that host.
    sa.Column("sandbox_host", sa.Text, nullable=True),
    # The agent's own conversation id (Claude Code's session id, Codex's thread id), as
    # its output reported it, recorded when the run settled: what a follow-up resumes.
    sa.Column("agent_session_id", sa.Text, nullable=True),
    sa.CheckConstraint(_one_of("status", RUN_STATUSES), name="status"),
    sa.CheckConstraint("max_attempts >= 1", name="max_attempts"),
    sa.CheckConstraint(
        "status <> 'running' OR (attempt_id IS NOT NULL "
        "AND (lease_expires_at IS NOT NULL OR handed_over_at IS NOT NULL))",
        name="owned_when_running",
    ),
    # A running run either holds a lease or awaits adoption, never both.
    sa.CheckConstraint(
        "handed_over_at IS NULL OR (status = 'running' AND lease_expires_at IS NULL)",
        name="pending_has_no_lease",
    ),
    sa.Index("ix_runs_session_id_seq", "session_id", "seq"),
    sa.Index("ix_runs_status_seq", "status", "seq"),
    # The database itself refuses a second running run of one session.
    sa.Index(
        "uq_runs_session_id_running",
        "session_id",
        unique=True,
        postgresql_where=sa.text("status = 'running'"),
    ),
    sa.Index(
        "ix_runs_lease_expires_at_running",
        "lease_expires_at",
        postgresql_where=sa.text("status = 'running'"),
    ),
    sa.Index("ix_runs_key_name_seq", "key_name", "seq"),
    sa.Index(
        "ix_runs_handed_over_at_pending",
        "handed_over_at",
        postgresql_where=sa.text("handed_over_at IS NOT NULL"),
    ),
    sa.Index(
        "ix_runs_key_name_unsettled",
        "key_name",
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    ),
    sa.Index("ix_runs_sandbox_host", "sandbox_host"),
    sa.Index(
        "ix_runs_finished_at_unpruned",
        "finished_at",
        postgresql_where=sa.text("finished_at IS NOT NULL AND pruned_at IS NULL"),
    ),
    # The fleet page counts the last minutes' starts and settles (store/fleet.py).
    sa.Index("ix_runs_started_at", "started_at"),
    sa.Index("ix_runs_finished_at", "finished_at"),
)

# Worker processes and the host each runs on, with a heartbeat on the database clock:
# a host is alive while one of its workers was seen within host_dead_after. Rows stay
# after a worker stops (a restarting host must not look dead), pruned once old.
workers = sa.Table(
    "workers",
    metadata,
    sa.Column("worker_id", sa.Text, primary_key=True),
    sa.Column("host_id", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    # The Celery main process the worker process belongs to (what a drain signals).
    sa.Column("main_pid", sa.Integer, nullable=False),
    sa.Column("started_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("last_seen", _TS, nullable=False, server_default=_NOW),
    # A drain: set when asked to stop taking runs, and the time after which the
    # worker hands over the runs it still drives.
    sa.Column("draining_at", _TS, nullable=True),
    sa.Column("hand_over_at", _TS, nullable=True),
    sa.Index("ix_workers_host_id_last_seen", "host_id", "last_seen"),
)

# When each of beat's periodic sweeps (reconcile, reap, prune) last finished: the fleet
# page warns when one is overdue (beat or its control worker stopped).
sweeps = sa.Table(
    "sweeps",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("finished_at", _TS, nullable=False, server_default=_NOW),
)

attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column(
        "run_id", sa.Text, sa.ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("attempt_id", sa.Text, primary_key=True),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("started_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("ended_at", _TS, nullable=True),
    sa.Column("outcome", sa.Text, nullable=True),
    # Why a superseded attempt was handed over: its owner died (crash), its lease ran
    # out (lease), or an operator forced it (forced).
    sa.Column("handover_cause", sa.Text, nullable=True),
    # Where a takeover's attempt began in the run log: the log's next seq once it fenced
    # the log at its epoch (NULL for a first claim, which begins at the start).
    sa.Column("log_seq", sa.BigInteger, nullable=True),
    sa.CheckConstraint(_one_of("handover_cause", HANDOVER_CAUSES), name="handover_cause"),
    # The fleet page's takeovers per minute and takeover latencies (store/fleet.py).
    sa.Index("ix_attempts_started_at", "started_at"),
    sa.Index(
        "ix_attempts_ended_at_superseded",
        "ended_at",
        postgresql_where=sa.text("outcome = 'superseded'"),
    ),
)

turn_slots = sa.Table(
    "turn_slots",
    metadata,
    sa.Column(
        "run_id", sa.Text, sa.ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("attempt_id", sa.Text, nullable=False),
    sa.Column("turn_index", sa.Integer, nullable=False),
    sa.Column("turn_id", sa.Text, nullable=False),
    sa.Column("phase", sa.Text, nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("journal_key", sa.Text, nullable=True),
    sa.Column("tool_request", JSONB, nullable=True),
    sa.Column("checkpoint_leaf_id", sa.Text, nullable=True),
    sa.Column("committed_leaf_id", sa.Text, nullable=True),
    sa.Column("journal_consumed_at", _TS, nullable=True),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("updated_at", _TS, nullable=False, server_default=_NOW),
    sa.CheckConstraint(_one_of("phase", TURN_PHASES), name="phase"),
)

segments = sa.Table(
    "segments",
    metadata,
    sa.Column("journal_key", sa.Text, primary_key=True),
    sa.Column("byte_start", sa.BigInteger, primary_key=True),
    sa.Column("byte_end", sa.BigInteger, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("run_id", sa.Text, sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.CheckConstraint("byte_end > byte_start AND byte_start >= 0", name="extent"),
    sa.Index("ix_segments_run_id", "run_id"),
)

transcript_entries = sa.Table(
    "transcript_entries",
    metadata,
    sa.Column(
        "session_id",
        sa.Text,
        sa.ForeignKey("sessions.session_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("entry_id", sa.Text, primary_key=True),
    sa.Column("parent_id", sa.Text, nullable=True),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("attempt_id", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("body", JSONB, nullable=False),
    sa.Column("position", sa.BigInteger, sa.Identity(always=True), nullable=False),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.Index("ix_transcript_entries_session_id_position", "session_id", "position"),
)

session_deletions = sa.Table(
    "session_deletions",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("deleted_at", _TS, nullable=False, server_default=_NOW),
)

run_receipts = sa.Table(
    "run_receipts",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("session_id", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("deleted_at", _TS, nullable=False, server_default=_NOW),
    # The deleted run's tenant: only its own key learns the session it belonged to.
    sa.Column("key_name", sa.Text, nullable=True),
)
