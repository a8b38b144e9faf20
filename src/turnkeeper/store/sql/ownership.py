"""The store's SQL: ownership."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

CLAIM_RUN = templated("""
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
CLAIM_AND_BEGIN = templated("""
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

RENEW_LEASE = templated("""
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
REPLACE_ATTEMPT = templated("""
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
HAND_OVER_EXPIRED = templated("""
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
