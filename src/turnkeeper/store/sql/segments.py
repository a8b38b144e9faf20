"""The store's SQL: segments."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement

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
