"""The store's SQL: beat's sweeps."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement

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
