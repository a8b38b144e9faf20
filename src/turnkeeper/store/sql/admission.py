"""The store's SQL: admission."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

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

INSERT_RUN = templated("""
INSERT INTO runs (run_id, session_id, status, payload, max_attempts, deadline, key_name)
VALUES (
    :run_id, :session_id, 'queued', CAST(:payload AS jsonb), :max_attempts,
    now() + make_interval(secs => CAST(:deadline AS double precision)), :key_name
)
ON CONFLICT (run_id) DO NOTHING
RETURNING $run_columns
""")

EXISTING_RUN = templated("""
SELECT $run_columns,
    (payload $unsealed) = (CAST(:payload AS jsonb) $unsealed) AS same_payload
FROM runs WHERE run_id = :run_id
""")
