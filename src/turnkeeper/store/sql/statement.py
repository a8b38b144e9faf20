"""What every SQL statement of the store is made of: ``Statement``, the fragments and
constants several areas share, and the ``:name`` -> ``%(name)s`` rewrite.

A statement is a ``Statement`` of our own holding its text in SQLAlchemy's ``:name``
parameter style, turned into psycopg's ``%(name)s`` once, on first use (``pyformat``).
Not SQLAlchemy's ``text()``: the store runs every statement on psycopg and never had
SQLAlchemy compile one, and importing SQLAlchemy only to hold strings cost every
``turnkeeper status`` a script calls in a loop about 100 ms (bench/cli_start.py).
SQLAlchemy stays for the schema and its migrations (``schema``, ``migration``).

Each conditional write is one statement whose WHERE clause is the guard and
whose RETURNING row is the verdict, so no read-then-write race exists between
Python and the database. Times are always ``now()`` on the database clock; no
statement takes a time from the client, only durations in seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from string import Template


@dataclass(frozen=True, eq=False, slots=True)
class Statement:
    """One SQL statement, its bound values written ``:name`` (``::`` is a cast).

    Compared and hashed by identity, as each is one constant of an area module: its name
    is the constant's (``database._statement_name``) and its psycopg form is cached per
    statement (``pyformat``)."""

    text: str


RUN_COLUMNS = (
    "run_id, seq, session_id, status, payload, attempt_id, epoch, owner, lease_expires_at, "
    "attempt_count, max_attempts, deadline, cancel_requested_at, sandbox_ref, created_at, "
    "started_at, finished_at, updated_at, error, dispatched_at, pruned_at, key_name, "
    "handed_over_at, sandbox_host, agent_session_id"
)
SLOT_COLUMNS = (
    "run_id, attempt_id, turn_index, turn_id, phase, revision, journal_key, tool_request, "
    "checkpoint_leaf_id, committed_leaf_id, journal_consumed_at, created_at, updated_at"
)
KEY_COLUMNS = "name, admin, allow_commands, max_running, created_at, last_used_at, revoked_at"
ENTRY_COLUMNS = (
    "session_id, entry_id, parent_id, run_id, attempt_id, kind, body, position, created_at"
)


# The owner lock of a run is a session-level advisory lock in the two-int key space
# (which never overlaps the one-bigint space of LOCK_SESSION and the migration lock):
# this first key, and the 32-bit hashtext of the run id. Two running runs may share a
# key; only one owner then takes it, and the other run's attempt is never marked as
# locked, so it is never watched and is left to its lease.
OWNER_LOCK_SPACE = 1953198444  # "tkol"
# The crash watcher's leader lock, in the same two-int space (no run's: its first key
# differs): one watcher sweeps per database, whatever the number of beats.
WATCHER_LOCK_SPACE = 1953199969

# How a worker process names its sessions on the server (``application_name``), each
# followed by its owner (``runs.owner``): its owner lock session and its store's pool.
# The crash watcher reads a session so named as a sign that the owner is alive.
LOCKS_SESSION_PREFIX = "turnkeeper-locks "
STORE_SESSION_PREFIX = "turnkeeper-store "


def _q(prefix: str, columns: str) -> str:
    return ", ".join(f"{prefix}.{c.strip()}" for c in columns.split(","))


_OWNED_SLOT = """
FROM runs r
WHERE j.run_id = :run_id AND j.attempt_id = :attempt_id
  AND r.run_id = j.run_id AND r.attempt_id = :attempt_id AND r.status = 'running'
"""

# The handover of the runs a statement picked in its CTE ``candidates`` (run_id,
# attempt_id), as the CTEs that follow it: a new attempt id and epoch + 1 fence the old
# owner at once; the slot follows; the old attempt ends as superseded, for :cause. The
# lease starts only at adoption. The statement's own SELECT reads ``handed``.
_HAND_OVER_CANDIDATES = """handed AS (
    UPDATE runs r SET attempt_id = replace(CAST(gen_random_uuid() AS text), '-', ''),
        epoch = r.epoch + 1, owner = NULL, lease_expires_at = NULL,
        handed_over_at = now(), dispatched_at = now(), updated_at = now()
    FROM candidates c WHERE r.run_id = c.run_id
    RETURNING r.run_id, r.attempt_id, r.epoch, c.attempt_id AS old_attempt_id
), slot AS (
    UPDATE turn_slots j SET attempt_id = handed.attempt_id,
        revision = j.revision + 1, updated_at = now()
    FROM handed WHERE j.run_id = handed.run_id
), ended AS (
    UPDATE attempts a SET ended_at = now(), outcome = 'superseded', handover_cause = :cause
    FROM handed
    WHERE a.run_id = handed.run_id AND a.attempt_id = handed.old_attempt_id
      AND a.ended_at IS NULL
)"""


_SESSION_OF = Template("""EXISTS (
    SELECT 1 FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
      AND a.application_name IN (
          left('$locks' || $key, 63), left('$store' || $key, 63)))""")


def _has_session(owner: str) -> str:
    """The process named by the owner id in column ``owner`` has a session on this
    database besides ours. Its sessions are named (``owner.session_name``) by a prefix,
    the owner's token, then the owner, cut to the 63 bytes the server keeps."""
    key = Template("""CASE WHEN split_part($owner, ':', 3) = '' THEN $owner
    ELSE split_part($owner, ':', 3) || ' ' || $owner END""").substitute(owner=owner)
    return _SESSION_OF.substitute(locks=LOCKS_SESSION_PREFIX, store=STORE_SESSION_PREFIX, key=key)


# Run r's owner process has a session on this database besides ours.
_OWNER_ALIVE = _has_session("r.owner")

# Fixed fragments shared by several statements. They are constants of this module,
# never input: every value reaches the database as a bound parameter.
# A session is idle once none of its runs is unsettled or settled within the TTL.
SESSION_IDLE = """NOT EXISTS (
    SELECT 1 FROM runs r WHERE r.session_id = s.session_id
      AND (r.status IN ('queued', 'running')
           OR r.finished_at > now() - make_interval(secs => CAST(:ttl AS double precision))))"""

# The agent a run names: its preset, or its inline command's program.
RUN_AGENT = "COALESCE(payload -> 'agent' ->> 'preset', payload -> 'agent' -> 'command' ->> 0)"
# The runs a list shows, by its optional filters.
RUNS_MATCHING = f"""WHERE (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:session_id AS text) IS NULL OR session_id = :session_id)
  AND (CAST(:key_name AS text) IS NULL OR key_name = :key_name)
  AND (CAST(:agent AS text) IS NULL OR {RUN_AGENT} = :agent)
  AND (CAST(:search AS text) IS NULL OR strpos(lower(run_id), lower(:search)) > 0)
  AND (CAST(:created_since AS timestamptz) IS NULL OR created_at >= :created_since)
  AND (CAST(:created_until AS timestamptz) IS NULL OR created_at < :created_until)
  AND (CAST(:finished_since AS timestamptz) IS NULL OR finished_at >= :finished_since)
  AND (CAST(:finished_until AS timestamptz) IS NULL OR finished_at < :finished_until)"""

_FRAGMENTS = {
    "runs_matching": RUNS_MATCHING,
    "session_idle": SESSION_IDLE,
    "run_columns": RUN_COLUMNS,
    "slot_columns": SLOT_COLUMNS,
    "entry_columns": ENTRY_COLUMNS,
    "r_run_columns": _q("r", RUN_COLUMNS),
    "e_entry_columns": _q("e", ENTRY_COLUMNS),
    "lease": "now() + make_interval(secs => CAST(:lease_ttl AS double precision))",
    # A worker seen after this is alive, and so is its host.
    "seen_since": "now() - make_interval(secs => CAST(:dead_after AS double precision))",
    "owned_slot": _OWNED_SLOT,
    "slot_returning": ", ".join(
        f"{c.strip()} AS slot_{c.strip()}" for c in SLOT_COLUMNS.split(",")
    ),
    "hand_over_to_new_attempt": _HAND_OVER_CANDIDATES,
    "key_columns": KEY_COLUMNS,
    "lock_space": str(OWNER_LOCK_SPACE),
    "owner_alive": _OWNER_ALIVE,
    "worker_connected": _has_session("w.worker_id"),
    # A run's payload without its sealed env: what idempotency compares, and what a
    # settled run keeps (turnkeeper.envelope).
    "unsealed": "#- '{env,sealed}'",
}


def templated(template: str) -> Statement:
    return Statement(Template(template).substitute(_FRAGMENTS))


_BIND = re.compile(r"(?<![:\w]):(\w+)")


@cache
def pyformat(statement: Statement) -> str:
    """The statement in psycopg's ``%(name)s`` style, for the pooled driver connection."""
    return _BIND.sub(r"%(\1)s", statement.text.replace("%", "%%"))
