"""The store's SQL: the fleet page."""

from __future__ import annotations

from turnkeeper.store.sql.statement import Statement, templated

# Worker processes seen within :shown_for seconds (the live ones and those that stopped
# lately), each with the running runs it owns: the current attempt's age (how long it
# has held the run) and what is left of its lease, on the database clock. A process is
# alive while it beat within :dead_after and either missed no beat (one every
# :beat_every seconds) or still has a session on the database: a killed process's
# sessions end with it, so it stops counting a beat and a half after its last one.
FLEET_WORKERS = templated("""
SELECT w.worker_id, w.host_id, w.pid, w.main_pid, w.started_at, w.last_seen,
    w.draining_at IS NOT NULL AS draining,
    w.last_seen > $seen_since AND (
        w.last_seen > now() - make_interval(secs => 1.5 * CAST(:beat_every AS double precision))
        OR $worker_connected) AS alive,
    CAST(EXTRACT(EPOCH FROM now() - w.last_seen) AS double precision) AS silent_seconds,
    COALESCE(jsonb_agg(jsonb_build_object(
        'run_id', r.run_id, 'epoch', r.epoch,
        'held_seconds', CAST(EXTRACT(EPOCH FROM now() - a.started_at) AS double precision),
        'lease_seconds_left',
            CAST(EXTRACT(EPOCH FROM r.lease_expires_at - now()) AS double precision))
        ORDER BY r.seq) FILTER (WHERE r.run_id IS NOT NULL), '[]') AS runs
FROM workers w
LEFT JOIN runs r ON r.status = 'running' AND r.owner = w.worker_id
LEFT JOIN attempts a ON a.run_id = r.run_id AND a.attempt_id = r.attempt_id
WHERE w.last_seen > now() - make_interval(secs => CAST(:shown_for AS double precision))
GROUP BY w.worker_id
ORDER BY w.host_id, w.main_pid, w.started_at, w.worker_id
LIMIT :limit
""")

# Running runs no worker owns: handed over, waiting for a worker to adopt them.
AWAITING_ADOPTION = Statement("""
SELECT run_id, epoch,
    CAST(EXTRACT(EPOCH FROM now() - handed_over_at) AS double precision) AS waiting_seconds
FROM runs WHERE handed_over_at IS NOT NULL
ORDER BY handed_over_at, seq
LIMIT :limit
""")

# The last :minutes minutes, one row per minute, oldest first: runs started (claimed
# from the queue), runs settled by status, and takeovers (attempts superseded) by cause
# (``lease`` for one that predates causes).
FLEET_ACTIVITY = Statement("""
WITH bounds AS (
    SELECT date_trunc('minute', now()) AS last,
        date_trunc('minute', now()) - make_interval(mins => CAST(:minutes AS integer) - 1)
            AS since
), started AS MATERIALIZED (
    SELECT date_trunc('minute', r.started_at) AS minute, count(*) AS n
    FROM runs r, bounds b WHERE r.started_at >= b.since GROUP BY 1
), settled AS MATERIALIZED (
    SELECT minute, jsonb_object_agg(status, n) AS by_status FROM (
        SELECT date_trunc('minute', r.finished_at) AS minute, r.status, count(*) AS n
        FROM runs r, bounds b
        WHERE r.finished_at >= b.since AND r.status IN ('completed', 'failed', 'aborted')
        GROUP BY 1, 2) s
    GROUP BY minute
), takeovers AS MATERIALIZED (
    SELECT minute, jsonb_object_agg(cause, n) AS by_cause FROM (
        SELECT date_trunc('minute', a.ended_at) AS minute,
            COALESCE(a.handover_cause, 'lease') AS cause, count(*) AS n
        FROM attempts a, bounds b WHERE a.outcome = 'superseded' AND a.ended_at >= b.since
        GROUP BY 1, 2) t
    GROUP BY minute
)
SELECT m.minute, COALESCE(s.n, 0) AS started, COALESCE(se.by_status, '{}') AS settled,
    COALESCE(t.by_cause, '{}') AS takeovers
FROM bounds b
CROSS JOIN generate_series(b.since, b.last, interval '1 minute') AS m(minute)
LEFT JOIN started s ON s.minute = m.minute
LEFT JOIN settled se ON se.minute = m.minute
LEFT JOIN takeovers t ON t.minute = m.minute
ORDER BY m.minute
""")

# Takeovers whose new attempt started in the last :minutes minutes, each with its pause
# as the run page says it (``web.views.attempt_views``): the gap in the run's stored
# output, from the last journal bytes the predecessor stored to the first its successor
# stored (segments are fenced by the attempt, so those within an attempt's time are its
# own); when either stored none, the wait from the hand-over (the old attempt
# superseded) to the adoption (the new one started). Counted per bucket of :bounds
# (``width_bucket``: 0 below the first bound, i for bounds[i - 1] <= seconds < bounds[i],
# len(bounds) at or past the last one).
TAKEOVER_LATENCY = Statement("""
WITH takeovers AS (
    SELECT n.run_id, o.started_at AS old_started, o.ended_at AS handed_over,
        n.started_at AS adopted, n.ended_at AS new_ended
    FROM attempts n
    JOIN attempts o ON o.run_id = n.run_id AND o.epoch = n.epoch - 1
        AND o.outcome = 'superseded'
    WHERE n.started_at >= date_trunc('minute', now())
        - make_interval(mins => CAST(:minutes AS integer) - 1)
), latencies AS (
    SELECT CAST(EXTRACT(EPOCH FROM COALESCE(
        resumed.first_stored_at - stopped.last_stored_at, t.adopted - t.handed_over))
        AS double precision) AS seconds
    FROM takeovers t
    CROSS JOIN LATERAL (
        SELECT max(s.created_at) AS last_stored_at FROM segments s
        WHERE s.run_id = t.run_id AND s.created_at >= t.old_started
          AND s.created_at <= t.handed_over
    ) stopped
    CROSS JOIN LATERAL (
        SELECT min(s.created_at) AS first_stored_at FROM segments s
        WHERE s.run_id = t.run_id AND s.created_at >= t.adopted
          AND (t.new_ended IS NULL OR s.created_at <= t.new_ended)
    ) resumed
)
SELECT
    COALESCE((SELECT jsonb_object_agg(bucket, n) FROM (
        SELECT width_bucket(seconds, CAST(:bounds AS double precision[])) AS bucket,
            count(*) AS n
        FROM latencies GROUP BY 1) b), '{}') AS buckets,
    (SELECT count(*) FROM latencies) AS count,
    (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FROM latencies) AS p50,
    (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds) FROM latencies) AS p95,
    (SELECT max(seconds) FROM latencies) AS max
""")
