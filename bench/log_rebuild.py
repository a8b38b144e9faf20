"""Rebuilding a lost run log from Postgres, against reading its segments alone.

A settled run of a ``text`` agent holds about 100,000 chunks' worth of journal in
Postgres (segments of 512 lines, as a fast agent's drive stores them). Redis loses
its log. We time what the next read does (``RunLog.ensure``: read the run row and
every segment in pages, translate every line, write the log back in pages under the
rebuild token, close it) against the floor it cannot avoid: reading the same
segments from Postgres and nothing else. Rounds alternate which side goes first.

    .venv/bin/python bench/log_rebuild.py [--quick] [--chunks N] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import uuid

import psycopg
import structlog

from turnkeeper.config import plain_postgres_url
from turnkeeper.driver.placement import PlacedJournal, Placement
from turnkeeper.driver.replay import StoredLog, stored_chunks
from turnkeeper.log import RunLog
from turnkeeper.sandbox import (
    JournalHandle,
    JournalPaths,
    SandboxRef,
    exit_sentinel_line,
    new_nonce,
)
from turnkeeper.store import Store, migration
from turnkeeper.store.records import RunStatus

RUN_ID = "rebuild-bench"
LINES_PER_SEGMENT = 512
SEGMENT_PAGE = 256


def fill(store: Store, chunks: int) -> str:
    """A settled run whose journal makes ``chunks`` chunks; returns its journal key."""
    agent = {"command": ["cat"], "format": "text"}
    store.admit_run(RUN_ID, RUN_ID, {"agent": agent}, max_attempts=1, deadline=None)
    claim = store.claim_run(RUN_ID, "bench", 600)
    assert claim is not None
    ref = SandboxRef("local", "bench", "/nonexistent/bench")
    journal = PlacedJournal(JournalHandle(ref, JournalPaths(ref.journal_dir, RUN_ID), new_nonce()))
    store.record_sandbox(claim, Placement(ref, [journal]).to_dict())
    # RUN_STARTED, the text message's start and one chunk per line, its end, RUN_FINISHED.
    lines = chunks - 4
    offset = 0
    for first in range(0, lines, LINES_PER_SEGMENT):
        body = b"".join(
            b"line %d of the agent's answer, a realistic sixty-byte line\n" % n
            for n in range(first, min(lines, first + LINES_PER_SEGMENT))
        )
        store.append_segment(claim, journal.journal_key, offset, body)
        offset += len(body)
    sentinel = exit_sentinel_line(0, journal.handle.nonce)
    store.append_segment(claim, journal.journal_key, offset, sentinel)
    store.settle_run(claim, RunStatus.COMPLETED)
    return journal.journal_key


def read_segments(store: Store, journal_key: str) -> int:
    """The floor: every stored byte of the journal, in the rebuild's own pages."""
    total, from_byte = 0, 0
    while True:
        page = store.segments(journal_key, from_byte, limit=SEGMENT_PAGE)
        total += sum(len(segment.body) for segment in page)
        if len(page) < SEGMENT_PAGE:
            return total
        from_byte = page[-1].byte_end


def rebuild(run_log: RunLog) -> int:
    keys = run_log.keys(RUN_ID)
    run_log.client.delete(keys.stream, keys.meta)  # what a flush does
    assert run_log.ensure(RUN_ID)
    return run_log.state(RUN_ID).last_seq


def timed(fn: object, *args: object) -> tuple[float, int]:
    gc.collect()
    began = time.perf_counter()
    result = fn(*args)  # type: ignore[operator]
    return time.perf_counter() - began, result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10,000 chunks, 2 rounds")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "TURNKEEPER_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("TURNKEEPER_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.rounds = 10_000, 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    admin = plain_postgres_url(args.database_url)
    name = f"tk_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        migration.upgrade(url)
        with Store(url, pool_size=2) as store:
            began = time.perf_counter()
            journal_key = fill(store, args.chunks)
            run = store.get_run(RUN_ID)
            assert run is not None
            expected = list(stored_chunks(store, run))
            run_log = RunLog.from_url(
                args.redis_url,
                namespace=namespace,
                max_chunks=10_000_000,
                source=StoredLog(store),
            )
            stored_bytes = read_segments(store, journal_key)
            print(
                f"stored the journal of {len(expected):,} chunks ({stored_bytes / 1e6:.1f} MB, "
                f"{len(store.segments(journal_key))} segments) in "
                f"{time.perf_counter() - began:.1f}s"
            )
            samples: dict[str, list[float]] = {"segments": [], "rebuild": []}
            for rnd in range(args.rounds):
                order = ("segments", "rebuild") if rnd % 2 else ("rebuild", "segments")
                for side in order:
                    if side == "segments":
                        elapsed, result = timed(read_segments, store, journal_key)
                        assert result == stored_bytes
                    else:
                        elapsed, result = timed(rebuild, run_log)
                        assert result == len(expected), result
                    samples[side].append(elapsed)
                print(
                    f"round {rnd + 1}: segments only {samples['segments'][-1]:7.3f}s   "
                    f"rebuild {samples['rebuild'][-1]:7.3f}s   "
                    f"ratio {samples['rebuild'][-1] / samples['segments'][-1]:6.1f}"
                )
            assert [chunk for _, chunk in run_log.snapshot(RUN_ID)] == expected
            seg = statistics.median(samples["segments"])
            reb = statistics.median(samples["rebuild"])
            print(f"median segments only {seg:8.3f}s")
            print(f"median rebuild       {reb:8.3f}s  ({len(expected) / reb:,.0f} chunks/s)")
            print(f"ratio rebuild/segments {reb / seg:6.1f}")
            run_log.client.delete(*run_log.keys(RUN_ID).as_list())
            run_log.client.close()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
