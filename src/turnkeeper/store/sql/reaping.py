"""The store's SQL: reaping."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

RECENTLY_SETTLED = templated("""
SELECT $run_columns FROM runs
WHERE status IN ('completed', 'failed', 'aborted')
  AND finished_at > now() - make_interval(secs => CAST(:within AS double precision))
ORDER BY finished_at
LIMIT :limit
""")

# A reaped run keeps the journals of its placement record (what ran, with their nonces
# and give-ups): a run log Redis lost is rebuilt from them (driver.replay.StoredLog).
# Without a host: the sandboxes any host can destroy (no host-local provider, or no
# host recorded); with one: that host's own. ``:host_local`` is hosts.HOST_LOCAL_PROVIDERS.
RUNS_TO_REAP = templated("""
SELECT $run_columns FROM runs
WHERE status IN ('completed', 'failed', 'aborted')
  AND jsonb_typeof(sandbox_ref -> 'sandbox') = 'object'
  AND CASE WHEN CAST(:host AS text) IS NULL
      THEN sandbox_host IS NULL
           OR NOT (sandbox_ref -> 'sandbox' ->> 'provider') = ANY(CAST(:host_local AS text[]))
      ELSE sandbox_host = :host
           AND (sandbox_ref -> 'sandbox' ->> 'provider') = ANY(CAST(:host_local AS text[]))
      END
ORDER BY finished_at
LIMIT :limit
""")

FORGET_SANDBOX = Statement("""
UPDATE runs SET sandbox_ref = sandbox_ref - 'sandbox', updated_at = now()
WHERE run_id = :run_id AND status IN ('completed', 'failed', 'aborted')
RETURNING run_id
""")

UNSETTLED_SANDBOX_REFS = Statement("""
SELECT sandbox_ref FROM runs
WHERE status IN ('queued', 'running') AND sandbox_ref IS NOT NULL
""")

# The sandboxes runs have moved on from: each journal of a placement names the sandbox
# its agent process ran in, and one that is not the run's sandbox any more was left
# behind (a takeover on another host found it lost and continued in a sandbox of its
# own). Not the last journal's either: the run's own, still named once a reap forgot
# its sandbox. Unsettled runs, and those settled within ``:within`` (an orphan's TTL).
SUPERSEDED_SANDBOXES = Statement("""
SELECT DISTINCT j -> 'ref' ->> 'id' AS sandbox_id
FROM runs r, jsonb_array_elements(r.sandbox_ref -> 'journals') AS j
WHERE jsonb_typeof(r.sandbox_ref -> 'journals') = 'array'
  AND (r.status IN ('queued', 'running')
       OR r.finished_at > now() - make_interval(secs => CAST(:within AS double precision)))
  AND j -> 'ref' ->> 'id' IS NOT NULL
  AND j -> 'ref' ->> 'id' IS DISTINCT FROM r.sandbox_ref -> 'sandbox' ->> 'id'
  AND j -> 'ref' ->> 'id' IS DISTINCT FROM r.sandbox_ref -> 'journals' -> -1 -> 'ref' ->> 'id'
""")

PRUNE_SETTLED = templated("""
WITH batch AS (
    SELECT run_id FROM runs
    WHERE finished_at IS NOT NULL AND pruned_at IS NULL
      AND finished_at < now() - make_interval(secs => CAST(:older_than AS double precision))
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), segments AS (
    DELETE FROM segments s USING batch b WHERE s.run_id = b.run_id
), slots AS (
    DELETE FROM turn_slots j USING batch b WHERE j.run_id = b.run_id
), marked AS (
    UPDATE runs r SET pruned_at = now(), payload = r.payload $unsealed
    FROM batch b WHERE r.run_id = b.run_id
    RETURNING r.run_id
)
SELECT count(*) FROM marked
""")
