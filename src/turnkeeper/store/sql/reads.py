"""The store's SQL: reads and the reconciler."""

from __future__ import annotations

from string import Template

from turnkeeper.store.sql.statement import Statement, templated

GET_RUN = templated("SELECT $run_columns FROM runs WHERE run_id = :run_id")

LIST_RUNS = templated("""
SELECT $run_columns FROM runs
$runs_matching
ORDER BY seq DESC
LIMIT :limit OFFSET :offset
""")

# Counted up to :most only: a dashboard refreshes this every few seconds.
COUNT_RUNS = templated(
    "SELECT count(*) AS n FROM (SELECT 1 FROM runs $runs_matching LIMIT :most) AS counted"
)

# The sessions a list shows, by its optional filters: a key's tenant, an id holding
# :search (any case).
SESSIONS_MATCHING = """WHERE (CAST(:key_name AS text) IS NULL OR s.key_name = :key_name)
  AND (CAST(:search AS text) IS NULL OR strpos(lower(s.session_id), lower(:search)) > 0)"""

# Sessions, the one whose latest run was admitted last first, each with that run and
# how many runs it has (counted for the page only).
LIST_SESSIONS = Statement(
    Template("""
SELECT page.session_id, page.key_name, page.leaf_id, page.created_at, page.updated_at,
       page.last_run_id, page.last_status, page.last_run_at,
       (SELECT count(*) FROM runs r WHERE r.session_id = page.session_id) AS run_count
FROM (
    SELECT s.session_id, s.key_name, s.leaf_id, s.created_at, s.updated_at,
           latest.run_id AS last_run_id, latest.status AS last_status,
           latest.created_at AS last_run_at, latest.seq AS last_seq
    FROM sessions s
    LEFT JOIN LATERAL (
        SELECT r.run_id, r.status, r.created_at, r.seq FROM runs r
        WHERE r.session_id = s.session_id ORDER BY r.seq DESC LIMIT 1
    ) latest ON true
    $matching
    ORDER BY latest.seq DESC NULLS LAST, s.session_id
    LIMIT :limit OFFSET :offset
) page
ORDER BY page.last_seq DESC NULLS LAST, page.session_id
""").substitute(matching=SESSIONS_MATCHING)
)

COUNT_SESSIONS = Statement(
    Template(
        "SELECT count(*) AS n FROM (SELECT 1 FROM sessions s $matching LIMIT :most) AS counted"
    ).substitute(matching=SESSIONS_MATCHING)
)

# A run's attempts, oldest first, each with when it first and last stored journal
# bytes (segments are fenced by the attempt, so those within its time are its own).
RUN_ATTEMPTS = Statement("""
SELECT a.attempt_id, a.epoch, a.owner, a.started_at, a.ended_at, a.outcome,
       a.handover_cause, a.log_seq, stored.first_stored_at, stored.last_stored_at
FROM attempts a
CROSS JOIN LATERAL (
    SELECT min(s.created_at) AS first_stored_at, max(s.created_at) AS last_stored_at
    FROM segments s
    WHERE s.run_id = a.run_id AND s.created_at >= a.started_at
      AND (a.ended_at IS NULL OR s.created_at <= a.ended_at)
) stored
WHERE a.run_id = :run_id
ORDER BY a.epoch, a.started_at
""")

# Where a takeover's attempt began in the run log, recorded once, by the attempt.
# Fenced like every owner write: a superseded attempt (a zombie stopped between its log
# fence and this write) would mark a position its successor's chunks already passed.
RECORD_ATTEMPT_LOG_SEQ = Statement("""
UPDATE attempts SET log_seq = :log_seq
WHERE run_id = :run_id AND attempt_id = :attempt_id AND log_seq IS NULL
  AND EXISTS (SELECT 1 FROM runs
              WHERE run_id = :run_id AND attempt_id = :attempt_id AND status = 'running'
              FOR SHARE)
""")

# A run queued behind an earlier unsettled run of its session is waiting, not stale:
# the settle of the run ahead starts it (NEXT_IN_SESSION), or this sweep once it leads.
STALE_QUEUED_RUNS = templated("""
SELECT $run_columns FROM runs r
WHERE r.status = 'queued'
  AND COALESCE(r.dispatched_at, r.created_at)
      < now() - make_interval(secs => CAST(:older_than AS double precision))
  AND NOT EXISTS (
      SELECT 1 FROM runs e
      WHERE e.session_id = r.session_id AND e.seq < r.seq
        AND e.status IN ('queued', 'running'))
ORDER BY r.seq
LIMIT :limit
""")

# How many unsettled runs of its session a queued run waits behind (0: it leads).
WAITING_BEHIND = Statement("""
SELECT (SELECT count(*) FROM runs e
        WHERE e.session_id = r.session_id AND e.seq < r.seq
          AND e.status IN ('queued', 'running')) AS waiting_behind
FROM runs r WHERE r.run_id = :run_id AND r.status = 'queued'
""")

# The queued run of a settled run's session that leads now: the one to start.
NEXT_IN_SESSION = Statement("""
SELECT n.run_id FROM runs r JOIN runs n ON n.session_id = r.session_id
WHERE r.run_id = :run_id AND r.status IN ('completed', 'failed', 'aborted')
  AND n.status = 'queued'
  AND NOT EXISTS (
      SELECT 1 FROM runs e
      WHERE e.session_id = n.session_id AND e.seq < n.seq
        AND e.status IN ('queued', 'running'))
ORDER BY n.seq
LIMIT 1
""")

MARK_DISPATCHED = Statement("""
UPDATE runs SET dispatched_at = now(), updated_at = now()
WHERE run_id = :run_id AND status = 'queued'
RETURNING run_id
""")
