"""Every SQL statement of the store, named, in one module per area of the store.

A statement is a ``Statement`` (``statement``) holding its text in SQLAlchemy's
``:name`` parameter style, turned into psycopg's ``%(name)s`` once, on first use.
Each conditional write is one statement whose WHERE clause is the guard and whose
RETURNING row is the verdict, so no read-then-write race exists between Python and
the database. Times are always ``now()`` on the database clock; no statement takes a
time from the client, only durations in seconds.
"""

from __future__ import annotations

from functools import cache

from turnkeeper.store.sql import (
    admission,
    fleet_page,
    hosts,
    keys,
    owner_locks,
    ownership,
    reads,
    reaping,
    segments,
    sessions,
    sweeps,
    transcript,
    turn_slot,
    workspaces,
)
from turnkeeper.store.sql.statement import Statement

AREAS = (
    admission,
    ownership,
    owner_locks,
    turn_slot,
    segments,
    transcript,
    sessions,
    workspaces,
    keys,
    reads,
    reaping,
    hosts,
    fleet_page,
    sweeps,
)


@cache
def statements() -> dict[str, Statement]:
    """Every statement by its constant's name, lowercased (metrics and errors name it)."""
    return {
        name.lower(): value
        for area in AREAS
        for name, value in vars(area).items()
        if isinstance(value, Statement)
    }
