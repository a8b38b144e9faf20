"""The fleet page's reads with the indexes of migration 0009 against the same statements
without them, and what those indexes cost every lease renewal, in one run.

A scratch database holds N settled runs spread over the last days (one attempt each,
every 50th superseded by a takeover) plus a few running ones; the timed reads are
``fleet_activity`` and ``takeover_latency`` over the last hour and day, and
``renew_lease`` of a running run. The sides alternate in rounds (the indexes dropped
and made again between them, after an unreported warm-up round); the figures are
medians over rounds, so a burst of noise on a shared machine moves one round.

    .venv/bin/python bench/fleet_page.py [--runs N] [--database-url URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

import psycopg
import structlog

from turnkeeper.config import plain_postgres_url
from turnkeeper.store import Store, migration

INDEXES = {
    "ix_runs_started_at": "CREATE INDEX ix_runs_started_at ON runs (started_at)",
    "ix_runs_finished_at": "CREATE INDEX ix_runs_finished_at ON runs (finished_at)",
    "ix_attempts_started_at": "CREATE INDEX ix_attempts_started_at ON attempts (started_at)",
    "ix_attempts_ended_at_superseded": "CREATE INDEX ix_attempts_ended_at_superseded "
    "ON attempts (ended_at) WHERE outcome = 'superseded'",
}
FILL_RUNS = """
INSERT INTO runs (run_id, session_id, status, payload, max_attempts, started_at,
    finished_at, epoch, attempt_count)
SELECT 'r' || g, 's' || g, 'completed', '{}', 3, now() - make_interval(secs => g * %(gap)s),
    now() - make_interval(secs => g * %(gap)s - 2), 1, 1
FROM generate_series(1, %(n)s) g
"""
FILL_ATTEMPTS = """
INSERT INTO attempts (run_id, attempt_id, epoch, owner, started_at, ended_at, outcome,
    handover_cause)
SELECT 'r' || g, 'a' || g, 1, 'w', now() - make_interval(secs => g * %(gap)s),
    now() - make_interval(secs => g * %(gap)s - 2),
    CASE WHEN g %% 50 = 0 THEN 'superseded' ELSE 'completed' END,
    CASE WHEN g %% 50 = 0 THEN 'crash' END
FROM generate_series(1, %(n)s) g
"""


def _timed(call: Callable[[], object], times: int) -> float:
    """The median milliseconds of ``times`` calls."""
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "TURNKEEPER_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    admin = plain_postgres_url(args.database_url)
    name = f"tk_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    try:
        migration.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            params = {"n": args.runs, "gap": 3 * 86400 / args.runs}  # over three days
            conn.execute(FILL_RUNS, params)
            conn.execute(FILL_ATTEMPTS, params)
            conn.execute("ANALYZE")
        with Store(url, pool_size=2) as store:
            for n in range(8):  # running runs whose leases the renewals renew
                store.admit_run(f"live-{n}", f"live-{n}", {}, max_attempts=3, deadline=None)
            claims = [store.claim_run(f"live-{n}", "bench", 3600.0) for n in range(8)]
            reads: dict[str, Callable[[], object]] = {
                "activity, last hour": lambda: store.fleet_activity(60),
                "activity, last day": lambda: store.fleet_activity(1440),
                "latency, last hour": lambda: store.takeover_latency(60),
                "latency, last day": lambda: store.takeover_latency(1440),
                "renew_lease": lambda: [store.renew_lease(c, 3600.0) for c in claims if c],
            }
            figures: dict[tuple[str, str], list[float]] = {}
            with psycopg.connect(url, autocommit=True) as conn:
                for rnd in range(args.rounds + 1):  # round 0 warms up, unreported
                    order = ("indexed", "plain") if rnd % 2 else ("plain", "indexed")
                    for side in order:
                        for index, create in INDEXES.items():
                            conn.execute(f"DROP INDEX IF EXISTS {index}")
                            if side == "indexed":
                                conn.execute(create)
                        conn.execute("ANALYZE runs, attempts")
                        for what, call in reads.items():
                            ms = _timed(call, 5 if what.startswith("activity") else 20)
                            if rnd:
                                figures.setdefault((what, side), []).append(ms)
        print(f"{args.runs} settled runs over 3 days; medians of {args.rounds} rounds, ms")
        print(f"{'read':<22} {'indexed':>10} {'plain':>10} {'plain/indexed':>14}")
        for what in reads:
            ours = statistics.median(figures[what, "indexed"])
            plain = statistics.median(figures[what, "plain"])
            label = "renew 8 leases" if what == "renew_lease" else what
            print(f"{label:<22} {ours:>10.2f} {plain:>10.2f} {plain / ours:>14.2f}")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
