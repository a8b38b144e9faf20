"""The store's SQL: sessions."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement

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
