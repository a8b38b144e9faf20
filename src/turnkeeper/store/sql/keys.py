"""The store's SQL: API keys."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

INSERT_KEY = Statement("""
INSERT INTO api_keys (name, key_hash, admin, allow_commands, max_running)
VALUES (:name, :key_hash, :admin, :allow_commands, :max_running)
ON CONFLICT (name) DO NOTHING
RETURNING name
""")

# One round trip per request, and a write at most once per ``touch_every`` seconds.
AUTHENTICATE_KEY = templated("""
WITH found AS (
    SELECT $key_columns FROM api_keys WHERE key_hash = :key_hash AND revoked_at IS NULL
), touched AS (
    UPDATE api_keys k SET last_used_at = now() FROM found
    WHERE k.name = found.name AND (found.last_used_at IS NULL OR found.last_used_at
        < now() - make_interval(secs => CAST(:touch_every AS double precision)))
)
SELECT $key_columns FROM found
""")

LIST_KEYS = templated("SELECT $key_columns FROM api_keys ORDER BY created_at, name")

REVOKE_KEY = templated("""
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
