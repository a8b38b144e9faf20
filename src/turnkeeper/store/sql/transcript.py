"""The store's SQL: transcript."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

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

ACTIVE_PATH = templated("""
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

SESSION_ENTRIES = templated("""
SELECT $entry_columns FROM transcript_entries WHERE session_id = :session_id ORDER BY position
""")

# The entries from the root to one entry of the session (what a follow-up from it saw).
PATH_TO_ENTRY = templated("""
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
