"""The store's SQL: turn slot."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

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

UPDATE_PHASE = templated("""
UPDATE turn_slots j SET phase = :phase, revision = j.revision + 1, updated_at = now(),
    journal_key = COALESCE(:journal_key, j.journal_key),
    tool_request = COALESCE(CAST(:tool_request AS jsonb), j.tool_request),
    checkpoint_leaf_id = COALESCE(:checkpoint_leaf_id, j.checkpoint_leaf_id)
$owned_slot
  AND j.phase IN (:from_a, :from_b)
  AND (CAST(:turn_index AS integer) IS NULL OR j.turn_index = :turn_index)
RETURNING j.revision
""")

COMMIT_TURN_SLOT = templated("""
UPDATE turn_slots j SET phase = 'committed', committed_leaf_id = :committed_leaf_id,
    revision = j.revision + 1, updated_at = now()
$owned_slot
  AND j.phase IN ('provider_started', 'tool_request_recorded')
  AND (CAST(:turn_index AS integer) IS NULL OR j.turn_index = :turn_index)
RETURNING j.revision
""")

MARK_JOURNAL_CONSUMED = templated("""
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

GET_TURN_SLOT = templated("SELECT $slot_columns FROM turn_slots WHERE run_id = :run_id")
