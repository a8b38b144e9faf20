"""The store's SQL: session workspaces (docs/architecture.md, "Session workspaces")."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

SESSION_WORKSPACE = Statement("""
SELECT workspace, workspace_host FROM sessions WHERE session_id = :session_id
""")

# The workspaces of idle sessions, on the host's share as RUNS_TO_REAP splits it.
IDLE_WORKSPACES = templated("""
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
RETIRE_WORKSPACE = templated("""
UPDATE sessions s SET workspace = jsonb_build_object('sandbox', NULL, 'gone', 'expired'),
    workspace_host = NULL
WHERE s.session_id = :session_id AND s.workspace -> 'sandbox' ->> 'id' = :sandbox_id
  AND $session_idle
RETURNING s.session_id
""")

# Run under the session's advisory lock too, with :ttl 0: the workspace is still that
# sandbox and no run of the session is queued or running, so whatever runs there is a
# settled run's leftover, and no run is admitted until the lock is let go.
QUIET_WORKSPACE = templated("""
SELECT s.session_id FROM sessions s
WHERE s.session_id = :session_id AND s.workspace -> 'sandbox' ->> 'id' = :sandbox_id
  AND $session_idle
""")

KEPT_WORKSPACES = Statement("""
SELECT workspace -> 'sandbox' ->> 'id' AS sandbox_id FROM sessions
WHERE jsonb_typeof(workspace -> 'sandbox') = 'object'
""")
