"""The store's SQL: owner locks (docs/architecture.md, "Crash detection")."""

from __future__ import annotations

from turnkeeper.store.sql.statement import WATCHER_LOCK_SPACE, Statement, templated

# The owner locks of the runs a worker process drives that it still owns, taken on its
# lock session; the ones taken come back. CASE keeps a lock from being tried for a run
# that moved on.
TAKE_OWNER_LOCKS = templated("""
SELECT t.run_id FROM unnest(CAST(:run_ids AS text[]), CAST(:attempt_ids AS text[]))
    AS t(run_id, attempt_id)
WHERE CASE WHEN EXISTS (
        SELECT 1 FROM runs r
        WHERE r.run_id = t.run_id AND r.attempt_id = t.attempt_id AND r.status = 'running')
    THEN pg_try_advisory_lock($lock_space, hashtext(t.run_id)) ELSE false END
""")

RELEASE_OWNER_LOCK = templated(
    "SELECT pg_advisory_unlock($lock_space, hashtext(:run_id)) AS released"
)

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
WATCHED_OWNERS = templated("""
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
LIVE_OWNERS = templated("""
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
HAND_OVER_ABSENT = templated("""
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
ADOPT_ATTEMPT = templated("""
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
REDISPATCH_TAKEOVERS = templated("""
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
EXPIRE_EXHAUSTED = templated(_EXPIRE_EXHAUSTED.replace("$skip_locked", "SKIP LOCKED"))
# One run's (a cancel's): its row lock is waited for, not skipped. The lock may be an
# adoption's that the cancel just refused: skipped, the run would await adoption,
# cancelled, until the next reconcile.
EXPIRE_RUN_EXHAUSTED = templated(_EXPIRE_EXHAUSTED.replace("$skip_locked", ""))

SETTLE_RUN = templated("""
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
LISTEN_CANCELS = f"LISTEN {CANCEL_CHANNEL}"
PROBE_LISTENER = f"SELECT 1 AS {CANCEL_CHANNEL}_heard"
"""The listener's question after a quiet wait: a link that carries no reply is dead. A
listening session shows one of these two as its last statement."""

REQUEST_CANCEL = templated("""
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
