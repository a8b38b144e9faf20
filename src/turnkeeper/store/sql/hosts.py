"""The store's SQL: hosts and their workers."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

# A worker process starting: a fresh row (a pid reused by a new process starts anew,
# without an earlier process's drain).
START_WORKER = Statement("""
INSERT INTO workers (worker_id, host_id, pid, main_pid)
VALUES (:worker_id, :host_id, :pid, :main_pid)
ON CONFLICT (worker_id) DO UPDATE SET host_id = EXCLUDED.host_id, pid = EXCLUDED.pid,
    main_pid = EXCLUDED.main_pid, started_at = now(), last_seen = now(),
    draining_at = NULL, hand_over_at = NULL
RETURNING worker_id
""")

# A worker's heartbeat, answering its drain orders (a pruned row comes back).
BEAT_WORKER = Statement("""
INSERT INTO workers (worker_id, host_id, pid, main_pid)
VALUES (:worker_id, :host_id, :pid, :main_pid)
ON CONFLICT (worker_id) DO UPDATE SET last_seen = now()
RETURNING draining_at IS NOT NULL AS draining,
    COALESCE(hand_over_at <= now(), false) AS hand_over_due
""")

HOST_ALIVE = templated("""
SELECT EXISTS (SELECT 1 FROM workers WHERE host_id = :host_id AND last_seen > $seen_since) AS alive
""")

LIVE_HOSTS = templated("""
SELECT DISTINCT host_id FROM workers WHERE last_seen > $seen_since ORDER BY host_id
""")

# Hosts none of whose workers was seen within dead_after, the last seen first.
DEAD_HOSTS = templated("""
SELECT host_id FROM workers GROUP BY host_id HAVING max(last_seen) <= $seen_since
ORDER BY max(last_seen) DESC, host_id
LIMIT :limit
""")

# A second drain of a host never puts off a hand-over the first one ordered.
DRAIN_WORKERS = templated("""
UPDATE workers SET draining_at = COALESCE(draining_at, now()),
    hand_over_at = LEAST(hand_over_at,
        now() + make_interval(secs => CAST(:hand_over_after AS double precision)))
WHERE host_id = :host_id AND last_seen > $seen_since
RETURNING worker_id, pid, main_pid
""")

WORKERS = templated("""
SELECT worker_id, host_id, pid, main_pid, started_at, last_seen, draining_at, hand_over_at,
    last_seen > $seen_since AS alive
FROM workers ORDER BY host_id, started_at, worker_id
""")

# The sandboxes the fleet holds: every run whose placement still names one.
PLACED_SANDBOXES = Statement("""
SELECT run_id, status, owner, sandbox_host, handed_over_at IS NOT NULL AS awaiting_adoption,
    sandbox_ref -> 'sandbox' ->> 'provider' AS provider,
    sandbox_ref -> 'sandbox' ->> 'id' AS sandbox_id
FROM runs
WHERE jsonb_typeof(sandbox_ref -> 'sandbox') = 'object'
ORDER BY sandbox_host, seq
LIMIT :limit
""")

PRUNE_WORKERS = Statement("""
WITH pruned AS (
    DELETE FROM workers
    WHERE last_seen < now() - make_interval(secs => CAST(:older_than AS double precision))
    RETURNING 1
)
SELECT count(*) FROM pruned
""")

# Takeovers sent to a host's queue while it was alive, whose host has died since:
# dispatched again (same attempt, same epoch), once, for the caller to send to the
# shared queue. A run's last dispatch before its host's last heartbeat + dead_after
# went to the host; any later one was routed after the host was dead.
DEAD_HOST_TAKEOVERS = templated("""
WITH seen AS (
    SELECT host_id, max(last_seen) AS last_seen FROM workers GROUP BY host_id
), stale AS (
    SELECT r.run_id FROM runs r JOIN seen s ON s.host_id = r.sandbox_host
    WHERE r.status = 'running' AND r.handed_over_at IS NOT NULL
      AND r.cancel_requested_at IS NULL AND (r.deadline IS NULL OR r.deadline > now())
      AND s.last_seen <= $seen_since
      AND COALESCE(r.dispatched_at, r.handed_over_at)
          < s.last_seen + make_interval(secs => CAST(:dead_after AS double precision))
    ORDER BY r.handed_over_at, r.seq
    LIMIT :limit
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE runs r SET dispatched_at = now(), updated_at = now()
FROM stale s WHERE r.run_id = s.run_id
RETURNING r.run_id, r.attempt_id, r.epoch
""")

NOW = Statement("SELECT now()")

# What /metrics reads of the store on each scrape: a few indexed aggregates, as JSON
# objects keyed by status, outcome (``running`` for open attempts) and handover cause
# (``lease`` for a superseded attempt that predates causes).
FLEET_COUNTS = Statement("""
SELECT
    (SELECT COALESCE(jsonb_object_agg(status, n), '{}') FROM
        (SELECT status, count(*) AS n FROM runs GROUP BY status) s) AS runs_by_status,
    (SELECT COALESCE(jsonb_object_agg(outcome, n), '{}') FROM
        (SELECT COALESCE(outcome, 'running') AS outcome, count(*) AS n FROM attempts
         GROUP BY 1) o) AS attempts_by_outcome,
    (SELECT COALESCE(jsonb_object_agg(cause, n), '{}') FROM
        (SELECT COALESCE(handover_cause, 'lease') AS cause, count(*) AS n FROM attempts
         WHERE outcome = 'superseded' GROUP BY 1) c) AS takeovers_by_cause,
    (SELECT count(*) FROM runs WHERE status = 'running' AND lease_expires_at < now())
        AS expired_leases,
    (SELECT COALESCE(max(epoch), 0) FROM runs WHERE status IN ('queued', 'running'))
        AS max_epoch
""")
