"""Every SQL statement of the store, named.

A statement is a ``Statement`` of our own holding its text in SQLAlchemy's ``:name``
parameter style, turned into psycopg's ``%(name)s`` once, on first use (``pyformat``).
Not SQLAlchemy's ``text()``: the store runs every statement on psycopg and never had
SQLAlchemy compile one, and importing SQLAlchemy only to hold strings cost every
``turnkeeper status`` a script calls in a loop about 100 ms (bench/cli_start.py).
SQLAlchemy stays for the schema and its migrations (``schema``, ``migration``).

Each conditional write is one statement whose WHERE clause is the guard and
whose RETURNING row is the verdict, so no read-then-write race exists between
Python and the database. Times are always ``now()`` on the database clock; no
statement takes a time from the client, only durations in seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from string import Template


@dataclass(frozen=True, eq=False, slots=True)
class Statement:
    """One SQL statement, its bound values written ``:name`` (``::`` is a cast).

    Compared and hashed by identity, as each is one constant of this module: its name
    is the constant's (``database._statement_name``) and its psycopg form is cached per
    statement (``pyformat``)."""

    text: str


RUN_COLUMNS = (
    "run_id, seq, session_id, status, payload, attempt_id, epoch, owner, lease_expires_at, "
    "attempt_count, max_attempts, deadline, cancel_requested_at, sandbox_ref, created_at, "
    "started_at, finished_at, updated_at, error, dispatched_at, pruned_at, key_name, "
    "handed_over_at, sandbox_host, agent_session_id"
)
SLOT_COLUMNS = (
    "run_id, attempt_id, turn_index, turn_id, phase, revision, journal_key, tool_request, "
    "checkpoint_leaf_id, committed_leaf_id, journal_consumed_at, created_at, updated_at"
)
KEY_COLUMNS = "name, admin, allow_commands, max_running, created_at, last_used_at, revoked_at"
ENTRY_COLUMNS = (
    "session_id, entry_id, parent_id, run_id, attempt_id, kind, body, position, created_at"
)


# The owner lock of a run is a session-level advisory lock in the two-int key space
# (which never overlaps the one-bigint space of LOCK_SESSION and the migration lock):
# this first key, and the 32-bit hashtext of the run id. Two running runs may share a
# key; only one owner then takes it, and the other run's attempt is never marked as
# locked, so it is never watched and is left to its lease.
OWNER_LOCK_SPACE = 1953198444  # "tkol"
# The crash watcher's leader lock, in the same two-int space (no run's: its first key
# differs): one watcher sweeps per database, whatever the number of beats.
WATCHER_LOCK_SPACE = 1953199969

# How a worker process names its sessions on the server (``application_name``), each
# followed by its owner (``runs.owner``): its owner lock session and its store's pool.
# The crash watcher reads a session so named as a sign that the owner is alive.
LOCKS_SESSION_PREFIX = "turnkeeper-locks "
STORE_SESSION_PREFIX = "turnkeeper-store "


def _q(prefix: str, columns: str) -> str:
    return ", ".join(f"{prefix}.{c.strip()}" for c in columns.split(","))


_OWNED_SLOT = """
FROM runs r
WHERE j.run_id = :run_id AND j.attempt_id = :attempt_id
  AND r.run_id = j.run_id AND r.attempt_id = :attempt_id AND r.status = 'running'
"""

# The handover of the runs a statement picked in its CTE ``candidates`` (run_id,
# attempt_id), as the CTEs that follow it: a new attempt id and epoch + 1 fence the old
# owner at once; the slot follows; the old attempt ends as superseded, for :cause. The
# lease starts only at adoption. The statement's own SELECT reads ``handed``.
_HAND_OVER_CANDIDATES = """handed AS (
    UPDATE runs r SET attempt_id = replace(CAST(gen_random_uuid() AS text), '-', ''),
        epoch = r.epoch + 1, owner = NULL, lease_expires_at = NULL,
        handed_over_at = now(), dispatched_at = now(), updated_at = now()
    FROM candidates c WHERE r.run_id = c.run_id
    RETURNING r.run_id, r.attempt_id, r.epoch, c.attempt_id AS old_attempt_id
), slot AS (
    UPDATE turn_slots j SET attempt_id = handed.attempt_id,
        revision = j.revision + 1, updated_at = now()
    FROM handed WHERE j.run_id = handed.run_id
), ended AS (
    UPDATE attempts a SET ended_at = now(), outcome = 'superseded', handover_cause = :cause
    FROM handed
    WHERE a.run_id = handed.run_id AND a.attempt_id = handed.old_attempt_id
      AND a.ended_at IS NULL
)"""


_SESSION_OF = Template("""EXISTS (
    SELECT 1 FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
      AND a.application_name IN (
          left('$locks' || $key, 63), left('$store' || $key, 63)))""")


def _has_session(owner: str) -> str:
    """The process named by the owner id in column ``owner`` has a session on this
    database besides ours. Its sessions are named (``owner.session_name``) by a prefix,
    the owner's token, then the owner, cut to the 63 bytes the server keeps."""
    key = Template("""CASE WHEN split_part($owner, ':', 3) = '' THEN $owner
    ELSE split_part($owner, ':', 3) || ' ' || $owner END""").substitute(owner=owner)
    return _SESSION_OF.substitute(locks=LOCKS_SESSION_PREFIX, store=STORE_SESSION_PREFIX, key=key)


# Run r's owner process has a session on this database besides ours.
_OWNER_ALIVE = _has_session("r.owner")

# Fixed fragments shared by several statements. They are constants of this module,
# never input: every value reaches the database as a bound parameter.
# A session is idle once none of its runs is unsettled or settled within the TTL.
SESSION_IDLE = """NOT EXISTS (
    SELECT 1 FROM runs r WHERE r.session_id = s.session_id
      AND (r.status IN ('queued', 'running')
           OR r.finished_at > now() - make_interval(secs => CAST(:ttl AS double precision))))"""

# The agent a run names: its preset, or its inline command's program.
RUN_AGENT = "COALESCE(payload -> 'agent' ->> 'preset', payload -> 'agent' -> 'command' ->> 0)"
# The runs a list shows, by its optional filters.
RUNS_MATCHING = f"""WHERE (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:session_id AS text) IS NULL OR session_id = :session_id)
  AND (CAST(:key_name AS text) IS NULL OR key_name = :key_name)
  AND (CAST(:agent AS text) IS NULL OR {RUN_AGENT} = :agent)
  AND (CAST(:search AS text) IS NULL OR strpos(lower(run_id), lower(:search)) > 0)
  AND (CAST(:created_since AS timestamptz) IS NULL OR created_at >= :created_since)
  AND (CAST(:created_until AS timestamptz) IS NULL OR created_at < :created_until)
  AND (CAST(:finished_since AS timestamptz) IS NULL OR finished_at >= :finished_since)
  AND (CAST(:finished_until AS timestamptz) IS NULL OR finished_at < :finished_until)"""

_FRAGMENTS = {
    "runs_matching": RUNS_MATCHING,
    "session_idle": SESSION_IDLE,
    "run_columns": RUN_COLUMNS,
    "slot_columns": SLOT_COLUMNS,
    "entry_columns": ENTRY_COLUMNS,
    "r_run_columns": _q("r", RUN_COLUMNS),
    "e_entry_columns": _q("e", ENTRY_COLUMNS),
    "lease": "now() + make_interval(secs => CAST(:lease_ttl AS double precision))",
    # A worker seen after this is alive, and so is its host.
    "seen_since": "now() - make_interval(secs => CAST(:dead_after AS double precision))",
    "owned_slot": _OWNED_SLOT,
    "slot_returning": ", ".join(
        f"{c.strip()} AS slot_{c.strip()}" for c in SLOT_COLUMNS.split(",")
    ),
    "hand_over_to_new_attempt": _HAND_OVER_CANDIDATES,
    "key_columns": KEY_COLUMNS,
    "lock_space": str(OWNER_LOCK_SPACE),
    "owner_alive": _OWNER_ALIVE,
    "worker_connected": _has_session("w.worker_id"),
    # A run's payload without its sealed env: what idempotency compares, and what a
    # settled run keeps (turnkeeper.envelope).
    "unsealed": "#- '{env,sealed}'",
}


def _sql(template: str) -> Statement:
    return Statement(Template(template).substitute(_FRAGMENTS))


# --- admission -------------------------------------------------------------------------

# Serializes admission and deletion within one session, so that within a session
# the admission sequence equals commit order (a zero-row FOR UPDATE locks nothing).
LOCK_SESSION = Statement("SELECT pg_advisory_xact_lock(hashtextextended(:lock_key, 0))")

FIND_RECEIPT = Statement("SELECT session_id, key_name FROM run_receipts WHERE run_id = :run_id")

# The session's tenant: the one just inserted, or the one it already had.
ENSURE_SESSION = Statement("""
WITH inserted AS (
    INSERT INTO sessions (session_id, key_name) VALUES (:session_id, :key_name)
    ON CONFLICT (session_id) DO NOTHING
    RETURNING key_name
)
SELECT key_name FROM inserted
UNION ALL
SELECT key_name FROM sessions WHERE session_id = :session_id
""")

# The key a run is admitted under, locked: admissions of one key are serialized, so
# counting its unsettled runs and inserting one cannot race, and a revoke waits.
LOCK_KEY = Statement(
    "SELECT max_running, revoked_at FROM api_keys WHERE name = :key_name FOR UPDATE"
)

UNSETTLED_RUNS_OF_KEY = Statement("""
SELECT count(*) FROM runs WHERE key_name = :key_name AND status IN ('queued', 'running')
""")

RUN_EXISTS = Statement("SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = :run_id)")

INSERT_RUN = _sql("""
INSERT INTO runs (run_id, session_id, status, payload, max_attempts, deadline, key_name)
VALUES (
    :run_id, :session_id, 'queued', CAST(:payload AS jsonb), :max_attempts,
    now() + make_interval(secs => CAST(:deadline AS double precision)), :key_name
)
ON CONFLICT (run_id) DO NOTHING
RETURNING $run_columns
""")

EXISTING_RUN = _sql("""
SELECT $run_columns,
    (payload $unsealed) = (CAST(:payload AS jsonb) $unsealed) AS same_payload
FROM runs WHERE run_id = :run_id
""")

# --- ownership -------------------------------------------------------------------------

CLAIM_RUN = _sql("""
WITH candidate AS (
    SELECT r.run_id FROM runs r
    WHERE r.run_id = :run_id AND r.status = 'queued'
      AND r.attempt_count < r.max_attempts
      AND (r.deadline IS NULL OR r.deadline > now())
      AND NOT EXISTS (
          SELECT 1 FROM runs e
          WHERE e.session_id = r.session_id AND e.seq < r.seq
            AND e.status IN ('queued', 'running'))
), claimed AS (
    UPDATE runs SET status = 'running', attempt_id = :attempt_id, epoch = runs.epoch + 1,
        attempt_count = runs.attempt_count + 1, owner = :owner,
        lease_expires_at = $lease, started_at = now(), updated_at = now()
    FROM candidate
    WHERE runs.run_id = candidate.run_id AND runs.status = 'queued'
    RETURNING runs.run_id, runs.attempt_id, runs.epoch
), recorded AS (
    INSERT INTO attempts (run_id, attempt_id, epoch, owner)
    SELECT run_id, attempt_id, epoch, :owner FROM claimed
)
SELECT run_id, attempt_id, epoch FROM claimed
""")

# The claim of a fresh run and its first steps, in one statement: the claim (as
# CLAIM_RUN), the run as claimed, and, for a run that is no branch, its input appended
# under the session's leaf (the leaf moved by compare-and-set) and turn 0 begun in its
# slot, both under the new attempt, which no one can have fenced yet. A run that
# branches (``from_entry``) has its branch checked first, by the driver: for it, as for
# an input or slot that is somehow stored already, only the claim is made here.
CLAIM_AND_BEGIN = _sql("""
WITH candidate AS (
    SELECT r.run_id FROM runs r
    WHERE r.run_id = :run_id AND r.status = 'queued'
      AND r.attempt_count < r.max_attempts
      AND (r.deadline IS NULL OR r.deadline > now())
      AND NOT EXISTS (
          SELECT 1 FROM runs e
          WHERE e.session_id = r.session_id AND e.seq < r.seq
            AND e.status IN ('queued', 'running'))
), claimed AS (
    UPDATE runs r SET status = 'running', attempt_id = :attempt_id, epoch = r.epoch + 1,
        attempt_count = r.attempt_count + 1, owner = :owner,
        lease_expires_at = $lease, started_at = now(), updated_at = now()
    FROM candidate
    WHERE r.run_id = candidate.run_id AND r.status = 'queued'
    RETURNING $r_run_columns
), recorded AS (
    INSERT INTO attempts (run_id, attempt_id, epoch, owner)
    SELECT run_id, attempt_id, epoch, :owner FROM claimed
), input AS (
    SELECT c.run_id, c.session_id, c.run_id || '/input' AS entry_id, s.leaf_id AS parent_id,
        jsonb_build_object('prompt', c.payload -> 'prompt') AS body
    FROM claimed c JOIN sessions s ON s.session_id = c.session_id
    WHERE jsonb_typeof(c.payload -> 'prompt') = 'string' AND NOT (c.payload ? 'from_entry')
      AND NOT EXISTS (
          SELECT 1 FROM transcript_entries t
          WHERE t.session_id = c.session_id AND t.entry_id = c.run_id || '/input')
      AND NOT EXISTS (SELECT 1 FROM turn_slots j WHERE j.run_id = c.run_id)
), moved AS (
    UPDATE sessions s SET leaf_id = i.entry_id, version = s.version + 1, updated_at = now()
    FROM input i
    WHERE s.session_id = i.session_id AND s.leaf_id IS NOT DISTINCT FROM i.parent_id
    RETURNING s.session_id
), entry AS (
    INSERT INTO transcript_entries
        (session_id, entry_id, parent_id, run_id, attempt_id, kind, body)
    SELECT i.session_id, i.entry_id, i.parent_id, i.run_id, :attempt_id, 'user', i.body
    FROM input i JOIN moved m ON m.session_id = i.session_id
    ON CONFLICT (session_id, entry_id) DO NOTHING
    RETURNING entry_id, parent_id
), slot AS (
    INSERT INTO turn_slots
        (run_id, attempt_id, turn_index, turn_id, phase, revision, checkpoint_leaf_id)
    SELECT c.run_id, c.attempt_id, 0, c.run_id || '/turn-0', 'before_provider', 1, e.entry_id
    FROM claimed c, entry e
    ON CONFLICT (run_id) DO NOTHING
    RETURNING $slot_returning
)
SELECT c.*, (SELECT parent_id FROM entry) AS input_parent, slot.*
FROM claimed c LEFT JOIN slot ON true
""")

OWNS_RUN = Statement("""
SELECT 1 FROM runs WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
""")

RENEW_LEASE = _sql("""
UPDATE runs SET lease_expires_at = $lease, updated_at = now()
WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
RETURNING lease_expires_at
""")

# An owner letting its lease go (a drained worker, an attempt whose service retries ran
# out): expired now, so the next reconcile hands the run over, instead of one lease_ttl
# later. A drain is the operator's choice, not the run's failure, so it gives the attempt
# back (:give_back): the adoption counts it again, and a run on its last attempt is
# handed over (HAND_OVER_EXPIRED) rather than failed attempts-exhausted (EXPIRE_EXHAUSTED).
RELEASE_LEASE = Statement("""
UPDATE runs SET lease_expires_at = now() - interval '1 millisecond',
    attempt_count = greatest(attempt_count - CAST(:give_back AS integer), 0),
    updated_at = now()
WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
  AND handed_over_at IS NULL
RETURNING run_id
""")

# The forced handoff (an operator's, a test's): the new attempt owns the run and
# counts at once. The lease expiry is checked on the database clock in the same
# statement that moves ownership, so a lease renewed a moment ago cannot be stolen;
# a run awaiting adoption has no lease, so only a forced handoff takes it.
REPLACE_ATTEMPT = _sql("""
WITH replaced AS (
    UPDATE runs SET attempt_id = :new_attempt_id, epoch = epoch + 1,
        attempt_count = attempt_count + 1, owner = :owner,
        lease_expires_at = $lease, handed_over_at = NULL, updated_at = now()
    WHERE run_id = :run_id AND status = 'running' AND attempt_id = :expected_attempt_id
      AND (NOT CAST(:only_if_expired AS boolean) OR lease_expires_at < now())
    RETURNING run_id, attempt_id, epoch
), slot AS (
    UPDATE turn_slots j SET attempt_id = replaced.attempt_id,
        revision = j.revision + 1, updated_at = now()
    FROM replaced WHERE j.run_id = replaced.run_id
), ended AS (
    UPDATE attempts a SET ended_at = now(), outcome = 'superseded', handover_cause = 'forced'
    FROM replaced
    WHERE a.run_id = replaced.run_id AND a.attempt_id = :expected_attempt_id
      AND a.ended_at IS NULL
), started AS (
    INSERT INTO attempts (run_id, attempt_id, epoch, owner)
    SELECT run_id, attempt_id, epoch, :owner FROM replaced
)
SELECT run_id, attempt_id, epoch FROM replaced
""")

# The handover: the expired attempt is fenced at once (a new attempt id, epoch + 1),
# but the new attempt holds no lease and is not counted until a worker adopts it.
# Several reconcilers at once each lock a disjoint set of runs (SKIP LOCKED).
HAND_OVER_EXPIRED = _sql("""
WITH candidates AS (
    SELECT run_id, attempt_id FROM runs
    WHERE status = 'running' AND lease_expires_at < now()
      AND attempt_count < max_attempts AND (deadline IS NULL OR deadline > now())
      AND cancel_requested_at IS NULL
    ORDER BY lease_expires_at, seq
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), $hand_over_to_new_attempt
SELECT run_id, attempt_id, epoch FROM handed ORDER BY run_id
""")

# --- owner locks (docs/architecture.md, "Crash detection") --------------------------------

# The owner locks of the runs a worker process drives that it still owns, taken on its
# lock session; the ones taken come back. CASE keeps a lock from being tried for a run
# that moved on.
TAKE_OWNER_LOCKS = _sql("""
SELECT t.run_id FROM unnest(CAST(:run_ids AS text[]), CAST(:attempt_ids AS text[]))
    AS t(run_id, attempt_id)
WHERE CASE WHEN EXISTS (
        SELECT 1 FROM runs r
        WHERE r.run_id = t.run_id AND r.attempt_id = t.attempt_id AND r.status = 'running')
    THEN pg_try_advisory_lock($lock_space, hashtext(t.run_id)) ELSE false END
""")

RELEASE_OWNER_LOCK = _sql("SELECT pg_advisory_unlock($lock_space, hashtext(:run_id)) AS released")

# This attempt's owner holds the run's owner lock: from now on, the lock coming free
# means the owner is gone.
MARK_OWNER_LOCKED = Statement("""
UPDATE runs SET lock_attempt_id = :attempt_id
WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
RETURNING run_id
""")

# The watcher's leader lock, held by its session for as long as it lives: the one
# watcher that sweeps. A second beat's watcher stands by until that session ends.
LEAD_WATCHERS = Statement(f"SELECT pg_try_advisory_lock({WATCHER_LOCK_SPACE}, 0) AS leading")

# One page of the watched runs (running, their attempt's owner took the lock), each with
# whether its owner lock is held now. The watcher's session takes a free lock and gives
# it back within the same row, so it holds none of them after the statement.
WATCHED_OWNERS = _sql("""
WITH watched AS MATERIALIZED (
    SELECT run_id, attempt_id, seq FROM runs
    WHERE status = 'running' AND lock_attempt_id = attempt_id AND seq > :after_seq
    ORDER BY seq
    LIMIT :limit
)
SELECT run_id, attempt_id, seq,
    CASE WHEN pg_try_advisory_lock($lock_space, hashtext(run_id))
         THEN NOT pg_advisory_unlock($lock_space, hashtext(run_id))
         ELSE true END AS held
FROM watched
ORDER BY seq
""")

# Of the given attempts, the runs whose owner process still has a session on this
# database (its lock session, connected again, or one of its store's): a sign of life,
# since a process's death ends all of its sessions at once. The names are
# ``owner.session_name``'s: the owner's token, then the owner, cut to the 63 bytes the
# server keeps, hence left().
LIVE_OWNERS = _sql("""
SELECT r.run_id FROM runs r
JOIN unnest(CAST(:run_ids AS text[]), CAST(:attempt_ids AS text[])) AS t(run_id, attempt_id)
    ON r.run_id = t.run_id AND r.attempt_id = t.attempt_id
WHERE r.owner IS NOT NULL AND $owner_alive
ORDER BY r.run_id
""")

# The crash handover: like HAND_OVER_EXPIRED, but for the given attempts whose owner
# lock is free, checked again here under a transaction lock held until the handover
# commits, so an owner that takes its lock back meanwhile is never handed over; and
# whose owner process has no session now, looked at again here (not only in the
# watcher's LIVE_OWNERS a statement earlier), so an owner whose sessions came back in
# between keeps its run.
HAND_OVER_ABSENT = _sql("""
WITH free AS MATERIALIZED (
    SELECT t.run_id, t.attempt_id
    FROM unnest(CAST(:run_ids AS text[]), CAST(:attempt_ids AS text[])) AS t(run_id, attempt_id)
    WHERE pg_try_advisory_xact_lock($lock_space, hashtext(t.run_id))
), candidates AS (
    SELECT r.run_id, r.attempt_id FROM runs r
    JOIN free f ON r.run_id = f.run_id AND r.attempt_id = f.attempt_id
    WHERE r.status = 'running' AND r.lock_attempt_id = r.attempt_id
      AND r.lease_expires_at IS NOT NULL
      AND r.attempt_count < r.max_attempts AND (r.deadline IS NULL OR r.deadline > now())
      AND r.cancel_requested_at IS NULL
      AND (r.owner IS NULL OR NOT $owner_alive)
    ORDER BY r.seq
    FOR UPDATE OF r SKIP LOCKED
), $hand_over_to_new_attempt
SELECT run_id, attempt_id, epoch FROM handed ORDER BY run_id
""")

# How often a run was handed over, by cause.
TAKEOVERS_OF_RUN = Statement("""
SELECT handover_cause AS cause, count(*) AS takeovers FROM attempts
WHERE run_id = :run_id AND outcome = 'superseded'
GROUP BY handover_cause
""")

# The adoption: a compare-and-set on the attempt the run was handed to. Only one
# worker's adoption matches (a second one waits on the row lock, then finds it
# adopted); the lease starts and the attempt counts here. A run cancelled or past
# its deadline meanwhile is left to EXPIRE_EXHAUSTED.
ADOPT_ATTEMPT = _sql("""
WITH pending AS (
    SELECT run_id, handed_over_at FROM runs
    WHERE run_id = :run_id AND status = 'running' AND attempt_id = :attempt_id
      AND handed_over_at IS NOT NULL AND attempt_count < max_attempts
      AND cancel_requested_at IS NULL AND (deadline IS NULL OR deadline > now())
    FOR UPDATE
), adopted AS (
    UPDATE runs r SET owner = :owner, lease_expires_at = $lease, handed_over_at = NULL,
        attempt_count = r.attempt_count + 1, updated_at = now()
    FROM pending p
    WHERE r.run_id = p.run_id AND r.attempt_id = :attempt_id AND r.handed_over_at IS NOT NULL
    RETURNING r.run_id, r.attempt_id, r.epoch,
        CAST(EXTRACT(EPOCH FROM now() - p.handed_over_at) AS double precision) AS waited
), started AS (
    INSERT INTO attempts (run_id, attempt_id, epoch, owner)
    SELECT run_id, attempt_id, epoch, :owner FROM adopted
)
SELECT run_id, attempt_id, epoch, waited FROM adopted
""")

# Handed-over runs whose takeover message seems lost (nobody adopted them within
# ``older_than`` of its last dispatch): dispatched again, same attempt, same epoch.
# ``:just_sent`` are the runs this reconcile pass handed over and sent already.
REDISPATCH_TAKEOVERS = _sql("""
WITH stale AS (
    SELECT run_id FROM runs
    WHERE status = 'running' AND handed_over_at IS NOT NULL
      AND NOT run_id = ANY(CAST(:just_sent AS text[]))
      AND cancel_requested_at IS NULL AND (deadline IS NULL OR deadline > now())
      AND COALESCE(dispatched_at, handed_over_at)
          < now() - make_interval(secs => CAST(:older_than AS double precision))
    ORDER BY handed_over_at, seq
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE runs r SET dispatched_at = now(), updated_at = now()
FROM stale s WHERE r.run_id = s.run_id
RETURNING r.run_id, r.attempt_id, r.epoch
""")

_EXPIRE_EXHAUSTED = """
WITH doomed AS (
    SELECT run_id, attempt_id,
        CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
             WHEN deadline IS NOT NULL AND deadline <= now() THEN 'deadline-exceeded'
             ELSE 'attempts-exhausted' END AS reason
    FROM runs
    WHERE ((status = 'running' AND lease_expires_at < now()
            AND (attempt_count >= max_attempts OR deadline <= now()
                 OR cancel_requested_at IS NOT NULL))
        OR (status = 'running' AND handed_over_at IS NOT NULL
            AND (deadline <= now() OR cancel_requested_at IS NOT NULL))
        OR (status = 'queued' AND deadline <= now()))
      AND (CAST(:run_id AS text) IS NULL OR run_id = :run_id)
    ORDER BY seq
    LIMIT :limit
    FOR UPDATE $skip_locked
), settled AS (
    UPDATE runs r
    SET status = CASE WHEN d.reason = 'cancelled' THEN 'aborted' ELSE 'failed' END,
        error = jsonb_build_object('reason', d.reason, 'message',
            CASE d.reason
                WHEN 'cancelled' THEN 'the run was cancelled and its owner is gone'
                WHEN 'deadline-exceeded' THEN 'the run passed its deadline'
                ELSE 'the run used all of its attempts' END),
        payload = r.payload $unsealed, handed_over_at = NULL,
        finished_at = now(), updated_at = now()
    FROM doomed d WHERE r.run_id = d.run_id
    RETURNING $r_run_columns
), ended AS (
    UPDATE attempts a SET ended_at = now(), outcome = 'expired'
    FROM doomed d
    WHERE a.run_id = d.run_id AND a.attempt_id = d.attempt_id AND a.ended_at IS NULL
)
SELECT $run_columns FROM settled ORDER BY seq
"""
EXPIRE_EXHAUSTED = _sql(_EXPIRE_EXHAUSTED.replace("$skip_locked", "SKIP LOCKED"))
# One run's (a cancel's): its row lock is waited for, not skipped. The lock may be an
# adoption's that the cancel just refused: skipped, the run would await adoption,
# cancelled, until the next reconcile.
EXPIRE_RUN_EXHAUSTED = _sql(_EXPIRE_EXHAUSTED.replace("$skip_locked", ""))

SETTLE_RUN = _sql("""
WITH settled AS (
    UPDATE runs SET status = :status, error = CAST(:error AS jsonb),
        payload = payload $unsealed, finished_at = now(), updated_at = now(),
        agent_session_id = COALESCE(CAST(:agent_session_id AS text), agent_session_id)
    WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
    RETURNING run_id
), ended AS (
    UPDATE attempts a SET ended_at = now(), outcome = :status
    FROM settled
    WHERE a.run_id = settled.run_id AND a.attempt_id = :attempt_id AND a.ended_at IS NULL
)
SELECT run_id FROM settled
""")

SETTLED_BY = Statement("""
SELECT 1 FROM runs r JOIN attempts a ON a.run_id = r.run_id AND a.attempt_id = r.attempt_id
WHERE r.run_id = :run_id AND r.attempt_id = :attempt_id AND r.status = :status
  AND a.outcome = :status
""")

# The placement record's host is copied to a column, so per-host reads are indexed.
# With ``:keeps_workspace`` the run's sandbox is its session's workspace too, in the same
# write: the session names the sandbox its latest run's placement names, so a successor
# finds the placement and the workspace decided together, or neither.
RECORD_SANDBOX = Statement("""
WITH recorded AS (
    UPDATE runs SET sandbox_ref = CAST(:sandbox_ref AS jsonb),
        sandbox_host = CAST(:sandbox_ref AS jsonb) ->> 'host', updated_at = now()
    WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
    RETURNING run_id, session_id
), workspace AS (
    UPDATE sessions s SET
        workspace = jsonb_build_object('sandbox', CAST(:sandbox_ref AS jsonb) -> 'sandbox'),
        workspace_host = CAST(:sandbox_ref AS jsonb) ->> 'host'
    FROM recorded
    WHERE s.session_id = recorded.session_id AND CAST(:keeps_workspace AS boolean)
      AND jsonb_typeof(CAST(:sandbox_ref AS jsonb) -> 'sandbox') = 'object'
      AND s.workspace IS DISTINCT FROM
          jsonb_build_object('sandbox', CAST(:sandbox_ref AS jsonb) -> 'sandbox')
)
SELECT run_id FROM recorded
""")

CANCEL_CHANNEL = "turnkeeper_cancel"
"""Where a cancel of a running run is announced, its run id the payload, on commit: the
owner's worker process listens (``workers/cancel_listener.py``) and hears it at once."""

REQUEST_CANCEL = _sql("""
WITH cancelled AS (
    UPDATE runs SET
        cancel_requested_at = COALESCE(cancel_requested_at, now()),
        status = CASE WHEN status = 'queued' THEN 'aborted' ELSE status END,
        finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END,
        error = CASE WHEN status = 'queued'
            THEN jsonb_build_object('reason', 'cancelled', 'message', 'cancelled before it started')
            ELSE error END,
        payload = CASE WHEN status = 'queued' THEN payload $unsealed ELSE payload END,
        updated_at = now()
    WHERE run_id = :run_id AND status IN ('queued', 'running')
    RETURNING $run_columns
)
SELECT cancelled.* FROM cancelled
LEFT JOIN LATERAL (
    SELECT pg_notify('turnkeeper_cancel', cancelled.run_id) WHERE cancelled.status = 'running'
) announced ON true
""")

# --- turn slot --------------------------------------------------------------------------

# Guarded by the attempt (the run row is share-locked, so a concurrent handoff
# serializes with it) and by turns only moving forward.
BEGIN_TURN_SLOT = Statement("""
INSERT INTO turn_slots AS j
    (run_id, attempt_id, turn_index, turn_id, phase, revision, checkpoint_leaf_id)
SELECT r.run_id, r.attempt_id, :turn_index, :turn_id, 'before_provider', 1, :checkpoint_leaf_id
FROM runs r
WHERE r.run_id = :run_id AND r.attempt_id = :attempt_id AND r.status = 'running'
FOR SHARE
ON CONFLICT (run_id) DO UPDATE SET
    turn_index = excluded.turn_index, turn_id = excluded.turn_id,
    phase = 'before_provider', revision = j.revision + 1,
    journal_key = NULL, tool_request = NULL, checkpoint_leaf_id = excluded.checkpoint_leaf_id,
    committed_leaf_id = NULL, journal_consumed_at = NULL, updated_at = now()
WHERE j.attempt_id = excluded.attempt_id AND excluded.turn_index > j.turn_index
RETURNING j.revision
""")

UPDATE_PHASE = _sql("""
UPDATE turn_slots j SET phase = :phase, revision = j.revision + 1, updated_at = now(),
    journal_key = COALESCE(:journal_key, j.journal_key),
    tool_request = COALESCE(CAST(:tool_request AS jsonb), j.tool_request),
    checkpoint_leaf_id = COALESCE(:checkpoint_leaf_id, j.checkpoint_leaf_id)
$owned_slot
  AND j.phase IN (:from_a, :from_b)
  AND (CAST(:turn_index AS integer) IS NULL OR j.turn_index = :turn_index)
RETURNING j.revision
""")

COMMIT_TURN_SLOT = _sql("""
UPDATE turn_slots j SET phase = 'committed', committed_leaf_id = :committed_leaf_id,
    revision = j.revision + 1, updated_at = now()
$owned_slot
  AND j.phase IN ('provider_started', 'tool_request_recorded')
  AND (CAST(:turn_index AS integer) IS NULL OR j.turn_index = :turn_index)
RETURNING j.revision
""")

MARK_JOURNAL_CONSUMED = _sql("""
UPDATE turn_slots j SET journal_consumed_at = now(), revision = j.revision + 1,
    updated_at = now()
$owned_slot
  AND j.phase <> 'committed' AND j.journal_key = :journal_key AND j.journal_consumed_at IS NULL
RETURNING j.revision
""")

# The end of a turn in one statement, fenced by the attempt: its entries appended (as
# APPEND_TRANSCRIPT), the slot committed at the new leaf (as COMMIT_TURN_SLOT) and, with
# :next_index, the next turn begun (as BEGIN_TURN_SLOT) and, with :next_journal_key, its
# provider started (as UPDATE_PHASE): the slot moves once to where those writes would
# leave it, its revision up by :writes, one per write. With :tool_request, the turn's
# tool request (as UPDATE_PHASE to tool_request_recorded) goes first, at
# :tool_checkpoint. All of it or nothing: a replayed
# append, a moved leaf or a slot not where the writer left it change nothing here, and
# the caller makes the writes one by one, which tell why.
COMMIT_TURN = Statement("""
WITH writer AS (
    SELECT 1 FROM runs
    WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
      AND session_id = :session_id
    FOR SHARE
), open_turn AS (
    SELECT 1 FROM turn_slots j
    WHERE j.run_id = :run_id AND j.attempt_id = :attempt_id
      AND j.phase IN ('provider_started', 'tool_request_recorded')
      AND (CAST(:next_index AS integer) IS NULL OR CAST(:next_index AS integer) > j.turn_index)
      AND (CAST(:tool_request AS jsonb) IS NULL OR j.phase = 'provider_started')
), chain AS (
    SELECT e.ord, e.entry_id, e.parent_id, e.kind, e.body
    FROM jsonb_to_recordset(CAST(:entries AS jsonb))
        AS e(ord int, entry_id text, parent_id text, kind text, body jsonb)
), moved AS (
    UPDATE sessions s SET leaf_id = :leaf_id, version = s.version + 1, updated_at = now()
    WHERE s.session_id = :session_id AND s.leaf_id IS NOT DISTINCT FROM :expected_leaf
      AND EXISTS (SELECT 1 FROM chain)
      AND EXISTS (SELECT 1 FROM writer) AND EXISTS (SELECT 1 FROM open_turn)
      AND NOT EXISTS (
          SELECT 1 FROM transcript_entries t JOIN chain c ON t.entry_id = c.entry_id
          WHERE t.session_id = :session_id)
    RETURNING s.version
), inserted AS (
    INSERT INTO transcript_entries
        (session_id, entry_id, parent_id, run_id, attempt_id, kind, body)
    SELECT :session_id, c.entry_id, c.parent_id, :run_id, :attempt_id, c.kind, c.body
    FROM chain c WHERE EXISTS (SELECT 1 FROM moved)
    ORDER BY c.ord
    ON CONFLICT (session_id, entry_id) DO NOTHING
    RETURNING entry_id
), slot AS (
    UPDATE turn_slots j SET
        turn_index = COALESCE(CAST(:next_index AS integer), j.turn_index),
        turn_id = COALESCE(CAST(:next_turn_id AS text), j.turn_id),
        phase = CASE WHEN CAST(:next_index AS integer) IS NULL THEN 'committed'
                     WHEN CAST(:next_journal_key AS text) IS NULL THEN 'before_provider'
                     ELSE 'provider_started' END,
        journal_key = CASE WHEN CAST(:next_index AS integer) IS NULL THEN j.journal_key
                           ELSE CAST(:next_journal_key AS text) END,
        tool_request = CASE WHEN CAST(:next_index AS integer) IS NULL
                            THEN COALESCE(CAST(:tool_request AS jsonb), j.tool_request) END,
        checkpoint_leaf_id = CASE
            WHEN CAST(:next_index AS integer) IS NOT NULL THEN :leaf_id
            WHEN CAST(:tool_request AS jsonb) IS NOT NULL
                THEN COALESCE(:tool_checkpoint, j.checkpoint_leaf_id)
            ELSE j.checkpoint_leaf_id END,
        committed_leaf_id = CASE WHEN CAST(:next_index AS integer) IS NULL THEN :leaf_id END,
        journal_consumed_at = CASE WHEN CAST(:next_index AS integer) IS NULL
                                   THEN j.journal_consumed_at END,
        revision = j.revision + :writes, updated_at = now()
    WHERE j.run_id = :run_id AND j.attempt_id = :attempt_id
      AND j.phase IN ('provider_started', 'tool_request_recorded')
      AND (CAST(:next_index AS integer) IS NULL OR CAST(:next_index AS integer) > j.turn_index)
      AND (CAST(:tool_request AS jsonb) IS NULL OR j.phase = 'provider_started')
      AND EXISTS (SELECT 1 FROM writer)
      AND (NOT EXISTS (SELECT 1 FROM chain) OR EXISTS (SELECT 1 FROM moved))
    RETURNING j.revision
)
SELECT EXISTS (SELECT 1 FROM writer) AS owned,
       EXISTS (SELECT 1 FROM slot) AS done,
       (SELECT count(*) FROM inserted) AS inserted,
       (SELECT count(*) FROM chain) AS entries
""")

GET_TURN_SLOT = _sql("SELECT $slot_columns FROM turn_slots WHERE run_id = :run_id")

# --- segments --------------------------------------------------------------------------

# Once the segment is stored, in the same write: with :mark_consumed (the segment that
# ends the journal, its sentinel) the slot's journal is marked consumed (as
# MARK_JOURNAL_CONSUMED); with :tool_request, the tool request its turn recorded in
# the bytes before is (as UPDATE_PHASE to tool_request_recorded).
APPEND_SEGMENT = Statement("""
WITH owner AS (
    SELECT run_id FROM runs
    WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
    FOR SHARE
), tip AS (
    SELECT COALESCE((SELECT byte_end FROM segments WHERE journal_key = :journal_key
                     ORDER BY byte_start DESC LIMIT 1), 0) AS byte_end
), foreign_key AS (
    SELECT 1 FROM segments WHERE journal_key = :journal_key AND run_id <> :run_id LIMIT 1
), inserted AS (
    INSERT INTO segments (journal_key, byte_start, byte_end, body, run_id)
    SELECT :journal_key, :byte_start, :byte_end, :body, owner.run_id FROM owner, tip
    WHERE tip.byte_end = :byte_start AND NOT EXISTS (SELECT 1 FROM foreign_key)
    ON CONFLICT (journal_key, byte_start) DO NOTHING
    RETURNING 1
), marked AS (
    UPDATE turn_slots j SET
        journal_consumed_at = CASE WHEN CAST(:mark_consumed AS boolean) THEN now()
                                   ELSE j.journal_consumed_at END,
        phase = CASE WHEN CAST(:tool_request AS jsonb) IS NULL THEN j.phase
                     ELSE 'tool_request_recorded' END,
        tool_request = COALESCE(CAST(:tool_request AS jsonb), j.tool_request),
        checkpoint_leaf_id = CASE WHEN CAST(:tool_request AS jsonb) IS NULL
                                  THEN j.checkpoint_leaf_id
                                  ELSE COALESCE(:checkpoint_leaf_id, j.checkpoint_leaf_id) END,
        revision = j.revision + 1, updated_at = now()
    WHERE EXISTS (SELECT 1 FROM inserted)
      AND j.run_id = :run_id AND j.attempt_id = :attempt_id
      AND (CAST(:mark_consumed AS boolean) AND j.phase <> 'committed'
               AND j.journal_key = :journal_key AND j.journal_consumed_at IS NULL
           OR CAST(:tool_request AS jsonb) IS NOT NULL AND j.phase = 'provider_started')
)
SELECT (SELECT count(*) FROM inserted) AS inserted,
       (SELECT count(*) FROM owner) AS owned,
       (SELECT count(*) FROM foreign_key) AS other_run,
       (SELECT byte_end FROM tip) AS tip
""")

STORED_SEGMENT = Statement(
    "SELECT body FROM segments WHERE journal_key = :journal_key AND byte_start = :byte_start"
)

SEGMENTS = Statement("""
SELECT journal_key, byte_start, byte_end, body FROM segments
WHERE journal_key = :journal_key AND byte_end > :from_byte
ORDER BY byte_start
LIMIT :limit
""")

# A page of at most :max_bytes of bodies (and always its first segment), so a replay
# never holds more than about that much of a journal at once.
SEGMENTS_BOUNDED = Statement("""
SELECT journal_key, byte_start, byte_end, body FROM (
    SELECT journal_key, byte_start, byte_end,
           sum(byte_end - byte_start) OVER (ORDER BY byte_start)
               - (byte_end - byte_start) AS bytes_before
    FROM segments
    WHERE journal_key = :journal_key AND byte_end > :from_byte
    ORDER BY byte_start
    LIMIT :limit
) page
JOIN segments USING (journal_key, byte_start, byte_end)
WHERE page.bytes_before < :max_bytes
ORDER BY byte_start
""")

LAST_SEGMENT = Statement("""
SELECT journal_key, byte_start, byte_end, body FROM segments
WHERE journal_key = :journal_key
ORDER BY byte_start DESC
LIMIT 1
""")

# --- transcript ------------------------------------------------------------------------

STORED_ENTRIES = Statement("""
SELECT e.entry_id, e.parent_id, e.kind, e.body
FROM transcript_entries e
WHERE e.session_id = :session_id AND e.entry_id IN (
    SELECT value FROM jsonb_array_elements_text(CAST(:entry_ids AS jsonb)))
""")

CURRENT_LEAF = Statement("SELECT leaf_id FROM sessions WHERE session_id = :session_id")

# An append in one statement: fenced by the attempt (the run row share-locked, so a
# handover waits for it), the leaf moved by compare-and-set, and the chain inserted only
# once the leaf moved and none of its entry ids was stored: all of it or nothing. Only
# the run's owner writes its entries (one run of a session runs at a time), so no entry
# id is taken between the check and the insert. Nothing written: the caller reads why.
APPEND_TRANSCRIPT = Statement("""
WITH writer AS (
    SELECT 1 FROM runs
    WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
      AND session_id = :session_id
    FOR SHARE
), chain AS (
    SELECT e.ord, e.entry_id, e.parent_id, e.kind, e.body
    FROM jsonb_to_recordset(CAST(:entries AS jsonb))
        AS e(ord int, entry_id text, parent_id text, kind text, body jsonb)
), moved AS (
    UPDATE sessions s SET leaf_id = :leaf_id, version = s.version + 1, updated_at = now()
    WHERE s.session_id = :session_id AND s.leaf_id IS NOT DISTINCT FROM :expected_leaf
      AND EXISTS (SELECT 1 FROM writer)
      AND NOT EXISTS (
          SELECT 1 FROM transcript_entries t JOIN chain c ON t.entry_id = c.entry_id
          WHERE t.session_id = :session_id)
    RETURNING s.version
), inserted AS (
    INSERT INTO transcript_entries
        (session_id, entry_id, parent_id, run_id, attempt_id, kind, body)
    SELECT :session_id, c.entry_id, c.parent_id, :run_id, :attempt_id, c.kind, c.body
    FROM chain c WHERE EXISTS (SELECT 1 FROM moved)
    ORDER BY c.ord
    ON CONFLICT (session_id, entry_id) DO NOTHING
    RETURNING entry_id
)
SELECT EXISTS (SELECT 1 FROM writer) AS owned,
       EXISTS (SELECT 1 FROM moved) AS moved,
       (SELECT count(*) FROM inserted) AS inserted
""")

SET_LEAF = Statement("""
WITH writer AS (
    SELECT 1 FROM runs
    WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
      AND session_id = :session_id
    FOR SHARE
)
UPDATE sessions s SET leaf_id = :entry_id, version = s.version + 1, updated_at = now()
WHERE s.session_id = :session_id AND EXISTS (SELECT 1 FROM writer)
  AND EXISTS (SELECT 1 FROM transcript_entries e
              WHERE e.session_id = :session_id AND e.entry_id = :entry_id)
RETURNING s.version
""")

ACTIVE_PATH = _sql("""
WITH RECURSIVE path AS (
    SELECT $e_entry_columns, 0 AS depth
    FROM sessions s JOIN transcript_entries e
        ON e.session_id = s.session_id AND e.entry_id = s.leaf_id
    WHERE s.session_id = :session_id
    UNION ALL
    SELECT $e_entry_columns, p.depth + 1
    FROM transcript_entries e JOIN path p
        ON e.session_id = p.session_id AND e.entry_id = p.parent_id
)
SELECT $entry_columns FROM path ORDER BY depth DESC
""")

SESSION_ENTRIES = _sql("""
SELECT $entry_columns FROM transcript_entries WHERE session_id = :session_id ORDER BY position
""")

# The entries from the root to one entry of the session (what a follow-up from it saw).
PATH_TO_ENTRY = _sql("""
WITH RECURSIVE path AS (
    SELECT $e_entry_columns, 0 AS depth
    FROM transcript_entries e
    WHERE e.session_id = :session_id AND e.entry_id = :entry_id
    UNION ALL
    SELECT $e_entry_columns, p.depth + 1
    FROM transcript_entries e JOIN path p
        ON e.session_id = p.session_id AND e.entry_id = p.parent_id
)
SELECT $entry_columns FROM path ORDER BY depth DESC
""")

# --- sessions --------------------------------------------------------------------------

BUSY_RUNS = Statement("""
SELECT count(*) FROM runs WHERE session_id = :session_id AND status IN ('queued', 'running')
""")

SESSION_EXISTS = Statement("""
SELECT EXISTS (SELECT 1 FROM sessions WHERE session_id = :session_id)
    OR EXISTS (SELECT 1 FROM runs WHERE session_id = :session_id)
""")

WRITE_RECEIPTS = Statement("""
INSERT INTO run_receipts (run_id, session_id, status, key_name)
SELECT run_id, session_id, status, key_name FROM runs
WHERE session_id = :session_id AND status NOT IN ('queued', 'running')
ON CONFLICT (run_id) DO NOTHING
""")

DELETE_SESSION_RUNS = Statement("""
DELETE FROM runs WHERE session_id = :session_id AND status NOT IN ('queued', 'running')
""")

DELETE_SESSION_ROW = Statement("DELETE FROM sessions WHERE session_id = :session_id")

MARK_SESSION_DELETED = Statement("""
INSERT INTO session_deletions (session_id) VALUES (:session_id)
ON CONFLICT (session_id) DO UPDATE SET deleted_at = now()
""")

SESSION_TENANT = Statement("SELECT key_name FROM sessions WHERE session_id = :session_id")

# --- session workspaces (docs/architecture.md, "Session workspaces") -------------------

SESSION_WORKSPACE = Statement("""
SELECT workspace, workspace_host FROM sessions WHERE session_id = :session_id
""")

# The workspaces of idle sessions, on the host's share as RUNS_TO_REAP splits it.
IDLE_WORKSPACES = _sql("""
SELECT s.session_id, s.workspace -> 'sandbox' AS sandbox FROM sessions s
WHERE jsonb_typeof(s.workspace -> 'sandbox') = 'object'
  AND CASE WHEN CAST(:host AS text) IS NULL
      THEN s.workspace_host IS NULL
           OR NOT (s.workspace -> 'sandbox' ->> 'provider') = ANY(CAST(:host_local AS text[]))
      ELSE s.workspace_host = :host
           AND (s.workspace -> 'sandbox' ->> 'provider') = ANY(CAST(:host_local AS text[]))
      END
  AND $session_idle
ORDER BY s.updated_at
LIMIT :limit
""")

# Run under the session's advisory lock (LOCK_SESSION), which admission takes too: a
# run admitted after this commits finds the workspace gone, one admitted before keeps
# the session busy, so no run is ever handed a workspace the reaper is destroying.
RETIRE_WORKSPACE = _sql("""
UPDATE sessions s SET workspace = jsonb_build_object('sandbox', NULL, 'gone', 'expired'),
    workspace_host = NULL
WHERE s.session_id = :session_id AND s.workspace -> 'sandbox' ->> 'id' = :sandbox_id
  AND $session_idle
RETURNING s.session_id
""")

KEPT_WORKSPACES = Statement("""
SELECT workspace -> 'sandbox' ->> 'id' AS sandbox_id FROM sessions
WHERE jsonb_typeof(workspace -> 'sandbox') = 'object'
""")

# --- API keys --------------------------------------------------------------------------

INSERT_KEY = Statement("""
INSERT INTO api_keys (name, key_hash, admin, allow_commands, max_running)
VALUES (:name, :key_hash, :admin, :allow_commands, :max_running)
ON CONFLICT (name) DO NOTHING
RETURNING name
""")

# One round trip per request, and a write at most once per ``touch_every`` seconds.
AUTHENTICATE_KEY = _sql("""
WITH found AS (
    SELECT $key_columns FROM api_keys WHERE key_hash = :key_hash AND revoked_at IS NULL
), touched AS (
    UPDATE api_keys k SET last_used_at = now() FROM found
    WHERE k.name = found.name AND (found.last_used_at IS NULL OR found.last_used_at
        < now() - make_interval(secs => CAST(:touch_every AS double precision)))
)
SELECT $key_columns FROM found
""")

LIST_KEYS = _sql("SELECT $key_columns FROM api_keys ORDER BY created_at, name")

REVOKE_KEY = _sql("""
UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE name = :name
RETURNING $key_columns
""")

ACTIVE_KEYS = Statement("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL")

KEY_IS_LIVE = Statement(
    "SELECT EXISTS (SELECT 1 FROM api_keys WHERE name = :name AND revoked_at IS NULL)"
)

REVOKED_AMONG = Statement(
    "SELECT name FROM api_keys WHERE name = ANY(:names) AND revoked_at IS NOT NULL"
)

# --- reads and the reconciler ----------------------------------------------------------

GET_RUN = _sql("SELECT $run_columns FROM runs WHERE run_id = :run_id")

LIST_RUNS = _sql("""
SELECT $run_columns FROM runs
$runs_matching
ORDER BY seq DESC
LIMIT :limit OFFSET :offset
""")

# Counted up to :most only: a dashboard refreshes this every few seconds.
COUNT_RUNS = _sql(
    "SELECT count(*) AS n FROM (SELECT 1 FROM runs $runs_matching LIMIT :most) AS counted"
)

# The sessions a list shows, by its optional filters: a key's tenant, an id holding
# :search (any case).
SESSIONS_MATCHING = """WHERE (CAST(:key_name AS text) IS NULL OR s.key_name = :key_name)
  AND (CAST(:search AS text) IS NULL OR strpos(lower(s.session_id), lower(:search)) > 0)"""

# Sessions, the one whose latest run was admitted last first, each with that run and
# how many runs it has (counted for the page only).
LIST_SESSIONS = Statement(
    Template("""
SELECT page.session_id, page.key_name, page.leaf_id, page.created_at, page.updated_at,
       page.last_run_id, page.last_status, page.last_run_at,
       (SELECT count(*) FROM runs r WHERE r.session_id = page.session_id) AS run_count
FROM (
    SELECT s.session_id, s.key_name, s.leaf_id, s.created_at, s.updated_at,
           latest.run_id AS last_run_id, latest.status AS last_status,
           latest.created_at AS last_run_at, latest.seq AS last_seq
    FROM sessions s
    LEFT JOIN LATERAL (
        SELECT r.run_id, r.status, r.created_at, r.seq FROM runs r
        WHERE r.session_id = s.session_id ORDER BY r.seq DESC LIMIT 1
    ) latest ON true
    $matching
    ORDER BY latest.seq DESC NULLS LAST, s.session_id
    LIMIT :limit OFFSET :offset
) page
ORDER BY page.last_seq DESC NULLS LAST, page.session_id
""").substitute(matching=SESSIONS_MATCHING)
)

COUNT_SESSIONS = Statement(
    Template(
        "SELECT count(*) AS n FROM (SELECT 1 FROM sessions s $matching LIMIT :most) AS counted"
    ).substitute(matching=SESSIONS_MATCHING)
)

# A run's attempts, oldest first, each with when it first and last stored journal
# bytes (segments are fenced by the attempt, so those within its time are its own).
RUN_ATTEMPTS = Statement("""
SELECT a.attempt_id, a.epoch, a.owner, a.started_at, a.ended_at, a.outcome,
       a.handover_cause, a.log_seq, stored.first_stored_at, stored.last_stored_at
FROM attempts a
CROSS JOIN LATERAL (
    SELECT min(s.created_at) AS first_stored_at, max(s.created_at) AS last_stored_at
    FROM segments s
    WHERE s.run_id = a.run_id AND s.created_at >= a.started_at
      AND (a.ended_at IS NULL OR s.created_at <= a.ended_at)
) stored
WHERE a.run_id = :run_id
ORDER BY a.epoch, a.started_at
""")

# Where a takeover's attempt began in the run log, recorded once, by the attempt.
# Fenced like every owner write: a superseded attempt (a zombie stopped between its log
# fence and this write) would mark a position its successor's chunks already passed.
RECORD_ATTEMPT_LOG_SEQ = Statement("""
UPDATE attempts SET log_seq = :log_seq
WHERE run_id = :run_id AND attempt_id = :attempt_id AND log_seq IS NULL
  AND EXISTS (SELECT 1 FROM runs
              WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
              FOR SHARE)
""")

EXPIRED_RUNS = _sql("""
SELECT $run_columns FROM runs
WHERE status = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at, seq
LIMIT :limit
""")

# A run queued behind an earlier unsettled run of its session is waiting, not stale:
# the settle of the run ahead starts it (NEXT_IN_SESSION), or this sweep once it leads.
STALE_QUEUED_RUNS = _sql("""
SELECT $run_columns FROM runs r
WHERE r.status = 'queued'
  AND COALESCE(r.dispatched_at, r.created_at)
      < now() - make_interval(secs => CAST(:older_than AS double precision))
  AND NOT EXISTS (
      SELECT 1 FROM runs e
      WHERE e.session_id = r.session_id AND e.seq < r.seq
        AND e.status IN ('queued', 'running'))
ORDER BY r.seq
LIMIT :limit
""")

# How many unsettled runs of its session a queued run waits behind (0: it leads).
WAITING_BEHIND = Statement("""
SELECT (SELECT count(*) FROM runs e
        WHERE e.session_id = r.session_id AND e.seq < r.seq
          AND e.status IN ('queued', 'running')) AS waiting_behind
FROM runs r WHERE r.run_id = :run_id AND r.status = 'queued'
""")

# The queued run of a settled run's session that leads now: the one to start.
NEXT_IN_SESSION = Statement("""
SELECT n.run_id FROM runs r JOIN runs n ON n.session_id = r.session_id
WHERE r.run_id = :run_id AND r.status IN ('completed', 'failed', 'aborted')
  AND n.status = 'queued'
  AND NOT EXISTS (
      SELECT 1 FROM runs e
      WHERE e.session_id = n.session_id AND e.seq < n.seq
        AND e.status IN ('queued', 'running'))
ORDER BY n.seq
LIMIT 1
""")

MARK_DISPATCHED = Statement("""
UPDATE runs SET dispatched_at = now(), updated_at = now()
WHERE run_id = :run_id AND status = 'queued'
RETURNING run_id
""")

# --- reaping -----------------------------------------------------------------------------

RECENTLY_SETTLED = _sql("""
SELECT $run_columns FROM runs
WHERE status IN ('completed', 'failed', 'aborted')
  AND finished_at > now() - make_interval(secs => CAST(:within AS double precision))
ORDER BY finished_at
LIMIT :limit
""")

# A reaped run keeps the journals of its placement record (what ran, with their nonces
# and give-ups): a run log Redis lost is rebuilt from them (driver.replay.StoredLog).
# Without a host: the sandboxes any host can destroy (no host-local provider, or no
# host recorded); with one: that host's own. ``:host_local`` is hosts.HOST_LOCAL_PROVIDERS.
RUNS_TO_REAP = _sql("""
SELECT $run_columns FROM runs
WHERE status IN ('completed', 'failed', 'aborted')
  AND jsonb_typeof(sandbox_ref -> 'sandbox') = 'object'
  AND CASE WHEN CAST(:host AS text) IS NULL
      THEN sandbox_host IS NULL
           OR NOT (sandbox_ref -> 'sandbox' ->> 'provider') = ANY(CAST(:host_local AS text[]))
      ELSE sandbox_host = :host
           AND (sandbox_ref -> 'sandbox' ->> 'provider') = ANY(CAST(:host_local AS text[]))
      END
ORDER BY finished_at
LIMIT :limit
""")

FORGET_SANDBOX = Statement("""
UPDATE runs SET sandbox_ref = sandbox_ref - 'sandbox', updated_at = now()
WHERE run_id = :run_id AND status IN ('completed', 'failed', 'aborted')
RETURNING run_id
""")

UNSETTLED_SANDBOX_REFS = Statement("""
SELECT sandbox_ref FROM runs
WHERE status IN ('queued', 'running') AND sandbox_ref IS NOT NULL
""")

# The sandboxes runs have moved on from: each journal of a placement names the sandbox
# its agent process ran in, and one that is not the run's sandbox any more was left
# behind (a takeover on another host found it lost and continued in a sandbox of its
# own). Not the last journal's either: the run's own, still named once a reap forgot
# its sandbox. Unsettled runs, and those settled within ``:within`` (an orphan's TTL).
SUPERSEDED_SANDBOXES = Statement("""
SELECT DISTINCT j -> 'ref' ->> 'id' AS sandbox_id
FROM runs r, jsonb_array_elements(r.sandbox_ref -> 'journals') AS j
WHERE jsonb_typeof(r.sandbox_ref -> 'journals') = 'array'
  AND (r.status IN ('queued', 'running')
       OR r.finished_at > now() - make_interval(secs => CAST(:within AS double precision)))
  AND j -> 'ref' ->> 'id' IS NOT NULL
  AND j -> 'ref' ->> 'id' IS DISTINCT FROM r.sandbox_ref -> 'sandbox' ->> 'id'
  AND j -> 'ref' ->> 'id' IS DISTINCT FROM r.sandbox_ref -> 'journals' -> -1 -> 'ref' ->> 'id'
""")

PRUNE_SETTLED = _sql("""
WITH batch AS (
    SELECT run_id FROM runs
    WHERE finished_at IS NOT NULL AND pruned_at IS NULL
      AND finished_at < now() - make_interval(secs => CAST(:older_than AS double precision))
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), segments AS (
    DELETE FROM segments s USING batch b WHERE s.run_id = b.run_id
), slots AS (
    DELETE FROM turn_slots j USING batch b WHERE j.run_id = b.run_id
), marked AS (
    UPDATE runs r SET pruned_at = now(), payload = r.payload $unsealed
    FROM batch b WHERE r.run_id = b.run_id
    RETURNING r.run_id
)
SELECT count(*) FROM marked
""")

# --- hosts and their workers -------------------------------------------------------------

# A worker process starting: a fresh row (a pid reused by a new process starts anew,
# without an earlier process's drain).
START_WORKER = Statement("""
INSERT INTO workers (worker_id, host_id, pid, main_pid)
VALUES (:worker_id, :host_id, :pid, :main_pid)
ON CONFLICT (worker_id) DO UPDATE SET host_id = EXCLUDED.host_id, pid = EXCLUDED.pid,
    main_pid = EXCLUDED.main_pid, started_at = now(), last_seen = now(),
    draining_at = NULL, hand_over_at = NULL
RETURNING worker_id
""")

# A worker's heartbeat, answering its drain orders (a pruned row comes back).
BEAT_WORKER = Statement("""
INSERT INTO workers (worker_id, host_id, pid, main_pid)
VALUES (:worker_id, :host_id, :pid, :main_pid)
ON CONFLICT (worker_id) DO UPDATE SET last_seen = now()
RETURNING draining_at IS NOT NULL AS draining,
    COALESCE(hand_over_at <= now(), false) AS hand_over_due
""")

HOST_ALIVE = _sql("""
SELECT EXISTS (SELECT 1 FROM workers WHERE host_id = :host_id AND last_seen > $seen_since) AS alive
""")

LIVE_HOSTS = _sql("""
SELECT DISTINCT host_id FROM workers WHERE last_seen > $seen_since ORDER BY host_id
""")

# Hosts none of whose workers was seen within dead_after, the last seen first.
DEAD_HOSTS = _sql("""
SELECT host_id FROM workers GROUP BY host_id HAVING max(last_seen) <= $seen_since
ORDER BY max(last_seen) DESC, host_id
LIMIT :limit
""")

# A second drain of a host never puts off a hand-over the first one ordered.
DRAIN_WORKERS = _sql("""
UPDATE workers SET draining_at = COALESCE(draining_at, now()),
    hand_over_at = LEAST(hand_over_at,
        now() + make_interval(secs => CAST(:hand_over_after AS double precision)))
WHERE host_id = :host_id AND last_seen > $seen_since
RETURNING worker_id, pid, main_pid
""")

WORKERS = _sql("""
SELECT worker_id, host_id, pid, main_pid, started_at, last_seen, draining_at, hand_over_at,
    last_seen > $seen_since AS alive
FROM workers ORDER BY host_id, started_at, worker_id
""")

# The sandboxes the fleet holds: every run whose placement still names one.
PLACED_SANDBOXES = Statement("""
SELECT run_id, status, owner, sandbox_host, handed_over_at IS NOT NULL AS awaiting_adoption,
    sandbox_ref -> 'sandbox' ->> 'provider' AS provider,
    sandbox_ref -> 'sandbox' ->> 'id' AS sandbox_id
FROM runs
WHERE jsonb_typeof(sandbox_ref -> 'sandbox') = 'object'
ORDER BY sandbox_host, seq
LIMIT :limit
""")

PRUNE_WORKERS = Statement("""
WITH pruned AS (
    DELETE FROM workers
    WHERE last_seen < now() - make_interval(secs => CAST(:older_than AS double precision))
    RETURNING 1
)
SELECT count(*) FROM pruned
""")

# Takeovers sent to a host's queue while it was alive, whose host has died since:
# dispatched again (same attempt, same epoch), once, for the caller to send to the
# shared queue. A run's last dispatch before its host's last heartbeat + dead_after
# went to the host; any later one was routed after the host was dead.
DEAD_HOST_TAKEOVERS = _sql("""
WITH seen AS (
    SELECT host_id, max(last_seen) AS last_seen FROM workers GROUP BY host_id
), stale AS (
    SELECT r.run_id FROM runs r JOIN seen s ON s.host_id = r.sandbox_host
    WHERE r.status = 'running' AND r.handed_over_at IS NOT NULL
      AND r.cancel_requested_at IS NULL AND (r.deadline IS NULL OR r.deadline > now())
      AND s.last_seen <= $seen_since
      AND COALESCE(r.dispatched_at, r.handed_over_at)
          < s.last_seen + make_interval(secs => CAST(:dead_after AS double precision))
    ORDER BY r.handed_over_at, r.seq
    LIMIT :limit
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE runs r SET dispatched_at = now(), updated_at = now()
FROM stale s WHERE r.run_id = s.run_id
RETURNING r.run_id, r.attempt_id, r.epoch
""")

NOW = Statement("SELECT now()")

# What /metrics reads of the store on each scrape: a few indexed aggregates, as JSON
# objects keyed by status, outcome (``running`` for open attempts) and handover cause
# (``lease`` for a superseded attempt that predates causes).
FLEET_COUNTS = Statement("""
SELECT
    (SELECT COALESCE(jsonb_object_agg(status, n), '{}') FROM
        (SELECT status, count(*) AS n FROM runs GROUP BY status) s) AS runs_by_status,
    (SELECT COALESCE(jsonb_object_agg(outcome, n), '{}') FROM
        (SELECT COALESCE(outcome, 'running') AS outcome, count(*) AS n FROM attempts
         GROUP BY 1) o) AS attempts_by_outcome,
    (SELECT COALESCE(jsonb_object_agg(cause, n), '{}') FROM
        (SELECT COALESCE(handover_cause, 'lease') AS cause, count(*) AS n FROM attempts
         WHERE outcome = 'superseded' GROUP BY 1) c) AS takeovers_by_cause,
    (SELECT count(*) FROM runs WHERE status = 'running' AND lease_expires_at < now())
        AS expired_leases,
    (SELECT COALESCE(max(epoch), 0) FROM runs WHERE status IN ('queued', 'running'))
        AS max_epoch
""")


# --- the fleet page ---------------------------------------------------------------------

# Worker processes seen within :shown_for seconds (the live ones and those that stopped
# lately), each with the running runs it owns: the current attempt's age (how long it
# has held the run) and what is left of its lease, on the database clock. A process is
# alive while it beat within :dead_after and either missed no beat (one every
# :beat_every seconds) or still has a session on the database: a killed process's
# sessions end with it, so it stops counting a beat and a half after its last one.
FLEET_WORKERS = _sql("""
SELECT w.worker_id, w.host_id, w.pid, w.main_pid, w.started_at, w.last_seen,
    w.draining_at IS NOT NULL AS draining,
    w.last_seen > $seen_since AND (
        w.last_seen > now() - make_interval(secs => 1.5 * CAST(:beat_every AS double precision))
        OR $worker_connected) AS alive,
    CAST(EXTRACT(EPOCH FROM now() - w.last_seen) AS double precision) AS silent_seconds,
    COALESCE(jsonb_agg(jsonb_build_object(
        'run_id', r.run_id, 'epoch', r.epoch,
        'held_seconds', CAST(EXTRACT(EPOCH FROM now() - a.started_at) AS double precision),
        'lease_seconds_left',
            CAST(EXTRACT(EPOCH FROM r.lease_expires_at - now()) AS double precision))
        ORDER BY r.seq) FILTER (WHERE r.run_id IS NOT NULL), '[]') AS runs
FROM workers w
LEFT JOIN runs r ON r.status = 'running' AND r.owner = w.worker_id
LEFT JOIN attempts a ON a.run_id = r.run_id AND a.attempt_id = r.attempt_id
WHERE w.last_seen > now() - make_interval(secs => CAST(:shown_for AS double precision))
GROUP BY w.worker_id
ORDER BY w.host_id, w.main_pid, w.started_at, w.worker_id
LIMIT :limit
""")

# Running runs no worker owns: handed over, waiting for a worker to adopt them.
AWAITING_ADOPTION = Statement("""
SELECT run_id, epoch,
    CAST(EXTRACT(EPOCH FROM now() - handed_over_at) AS double precision) AS waiting_seconds
FROM runs WHERE handed_over_at IS NOT NULL
ORDER BY handed_over_at, seq
LIMIT :limit
""")

# The last :minutes minutes, one row per minute, oldest first: runs started (claimed
# from the queue), runs settled by status, and takeovers (attempts superseded) by cause
# (``lease`` for one that predates causes).
FLEET_ACTIVITY = Statement("""
WITH bounds AS (
    SELECT date_trunc('minute', now()) AS last,
        date_trunc('minute', now()) - make_interval(mins => CAST(:minutes AS integer) - 1)
            AS since
), started AS MATERIALIZED (
    SELECT date_trunc('minute', r.started_at) AS minute, count(*) AS n
    FROM runs r, bounds b WHERE r.started_at >= b.since GROUP BY 1
), settled AS MATERIALIZED (
    SELECT minute, jsonb_object_agg(status, n) AS by_status FROM (
        SELECT date_trunc('minute', r.finished_at) AS minute, r.status, count(*) AS n
        FROM runs r, bounds b
        WHERE r.finished_at >= b.since AND r.status IN ('completed', 'failed', 'aborted')
        GROUP BY 1, 2) s
    GROUP BY minute
), takeovers AS MATERIALIZED (
    SELECT minute, jsonb_object_agg(cause, n) AS by_cause FROM (
        SELECT date_trunc('minute', a.ended_at) AS minute,
            COALESCE(a.handover_cause, 'lease') AS cause, count(*) AS n
        FROM attempts a, bounds b WHERE a.outcome = 'superseded' AND a.ended_at >= b.since
        GROUP BY 1, 2) t
    GROUP BY minute
)
SELECT m.minute, COALESCE(s.n, 0) AS started, COALESCE(se.by_status, '{}') AS settled,
    COALESCE(t.by_cause, '{}') AS takeovers
FROM bounds b
CROSS JOIN generate_series(b.since, b.last, interval '1 minute') AS m(minute)
LEFT JOIN started s ON s.minute = m.minute
LEFT JOIN settled se ON se.minute = m.minute
LEFT JOIN takeovers t ON t.minute = m.minute
ORDER BY m.minute
""")

# Takeovers whose new attempt started in the last :minutes minutes, each with its pause
# as the run page says it (``web.views.attempt_views``): the gap in the run's stored
# output, from the last journal bytes the predecessor stored to the first its successor
# stored (segments are fenced by the attempt, so those within an attempt's time are its
# own); when either stored none, the wait from the hand-over (the old attempt
# superseded) to the adoption (the new one started). Counted per bucket of :bounds
# (``width_bucket``: 0 below the first bound, i for bounds[i - 1] <= seconds < bounds[i],
# len(bounds) at or past the last one).
TAKEOVER_LATENCY = Statement("""
WITH takeovers AS (
    SELECT n.run_id, o.started_at AS old_started, o.ended_at AS handed_over,
        n.started_at AS adopted, n.ended_at AS new_ended
    FROM attempts n
    JOIN attempts o ON o.run_id = n.run_id AND o.epoch = n.epoch - 1
        AND o.outcome = 'superseded'
    WHERE n.started_at >= date_trunc('minute', now())
        - make_interval(mins => CAST(:minutes AS integer) - 1)
), latencies AS (
    SELECT CAST(EXTRACT(EPOCH FROM COALESCE(
        resumed.first_stored_at - stopped.last_stored_at, t.adopted - t.handed_over))
        AS double precision) AS seconds
    FROM takeovers t
    CROSS JOIN LATERAL (
        SELECT max(s.created_at) AS last_stored_at FROM segments s
        WHERE s.run_id = t.run_id AND s.created_at >= t.old_started
          AND s.created_at <= t.handed_over
    ) stopped
    CROSS JOIN LATERAL (
        SELECT min(s.created_at) AS first_stored_at FROM segments s
        WHERE s.run_id = t.run_id AND s.created_at >= t.adopted
          AND (t.new_ended IS NULL OR s.created_at <= t.new_ended)
    ) resumed
)
SELECT
    COALESCE((SELECT jsonb_object_agg(bucket, n) FROM (
        SELECT width_bucket(seconds, CAST(:bounds AS double precision[])) AS bucket,
            count(*) AS n
        FROM latencies GROUP BY 1) b), '{}') AS buckets,
    (SELECT count(*) FROM latencies) AS count,
    (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FROM latencies) AS p50,
    (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds) FROM latencies) AS p95,
    (SELECT max(seconds) FROM latencies) AS max
""")

# --- beat's sweeps ---------------------------------------------------------------------

# A periodic sweep (reconcile, reap, prune) finished now: the fleet page tells an
# operator when beat last swept, and warns once that is overdue.
RECORD_SWEEP = Statement("""
INSERT INTO sweeps (name, finished_at) VALUES (:name, now())
ON CONFLICT (name) DO UPDATE SET finished_at = now()
""")

# When each sweep last finished, and how long ago on the database clock.
SWEEPS = Statement("""
SELECT name, finished_at,
    CAST(EXTRACT(EPOCH FROM now() - finished_at) AS double precision) AS seconds_ago
FROM sweeps ORDER BY name
""")


_BIND = re.compile(r"(?<![:\w]):(\w+)")


@cache
def pyformat(statement: Statement) -> str:
    """The statement in psycopg's ``%(name)s`` style, for the pooled driver connection."""
    return _BIND.sub(r"%(\1)s", statement.text.replace("%", "%%"))
