"""One run's full store cycle, ours against the same statements as plain psycopg calls.

claim -> begin -> provider_started -> tool_request_recorded -> commit -> settle
(with admission outside the timed part), at 1 and 8 threads, in one run. Prints
per-cycle p50/p99 in milliseconds and the ratio ours / plain (goal: <= 1.3).
The two sides run interleaved in rounds (after an unreported warm-up round) and
the figures are medians over rounds, so a burst of noise on this shared machine
moves one round, not the result.

    .venv/bin/python bench/store_cycle.py [--quick] [--database-url URL]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import structlog

from turnkeeper.config import plain_postgres_url
from turnkeeper.store import Store, Verdict, migration, sql


def _psycopg_sql(statement: object) -> str:
    """The store's own statement text with :name turned into psycopg's %(name)s."""
    text = str(statement.text)  # type: ignore[attr-defined]
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", text)


PLAIN = {
    name: _psycopg_sql(sql.statements()[name.lower()])
    for name in ("CLAIM_RUN", "BEGIN_TURN_SLOT", "UPDATE_PHASE", "COMMIT_TURN_SLOT", "SETTLE_RUN")
}


def ours_cycle(store: Store, run_id: str) -> None:
    claim = store.claim_run(run_id, "bench", 30)
    assert claim is not None
    assert store.begin_turn_slot(claim, 0, "t0", None) is Verdict.DONE
    assert (
        store.update_turn_phase(claim, "provider_started", journal_key=f"{run_id}:k")
        is Verdict.DONE
    )
    assert (
        store.update_turn_phase(claim, "tool_request_recorded", tool_request={"c": 1})
        is Verdict.DONE
    )
    assert store.commit_turn_slot(claim, "leaf") is Verdict.DONE
    assert store.settle_run(claim, "completed") is Verdict.DONE


def plain_cycle(conn: psycopg.Connection[tuple[object, ...]], run_id: str) -> None:
    attempt = uuid.uuid4().hex
    base = {"run_id": run_id, "attempt_id": attempt, "turn_index": 0}
    row = conn.execute(PLAIN["CLAIM_RUN"], {**base, "owner": "bench", "lease_ttl": 30.0}).fetchone()
    assert row is not None
    assert conn.execute(
        PLAIN["BEGIN_TURN_SLOT"],
        {**base, "turn_index": 0, "turn_id": "t0", "checkpoint_leaf_id": None},
    ).fetchone()
    phase = {"tool_request": None, "checkpoint_leaf_id": None}
    assert conn.execute(
        PLAIN["UPDATE_PHASE"],
        {
            **base,
            **phase,
            "phase": "provider_started",
            "from_a": "before_provider",
            "from_b": "before_provider",
            "journal_key": f"{run_id}:k",
        },
    ).fetchone()
    assert conn.execute(
        PLAIN["UPDATE_PHASE"],
        {
            **base,
            **phase,
            "phase": "tool_request_recorded",
            "from_a": "provider_started",
            "from_b": "provider_started",
            "journal_key": None,
            "tool_request": '{"c":1}',
        },
    ).fetchone()
    assert conn.execute(PLAIN["COMMIT_TURN_SLOT"], {**base, "committed_leaf_id": "leaf"}).fetchone()
    assert conn.execute(
        PLAIN["SETTLE_RUN"],
        {**base, "status": "completed", "error": None, "agent_session_id": None},
    ).fetchone()


def _timed(threads: int, cycles: int, make: Callable[[int], Callable[[int], None]]) -> list[float]:
    samples: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def worker(t: int) -> None:
        cycle = make(t)
        mine = []
        barrier.wait()
        for i in range(cycles):
            start = time.perf_counter()
            cycle(i)
            mine.append(time.perf_counter() - start)
        with lock:
            samples.extend(mine)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return samples


def _ours(store: Store, prefix: str) -> Callable[[int], Callable[[int], None]]:
    def make(t: int) -> Callable[[int], None]:
        return lambda i: ours_cycle(store, f"{prefix}-{t}-{i}")

    return make


def _plain(
    conns: list[psycopg.Connection[tuple[object, ...]]], prefix: str
) -> Callable[[int], Callable[[int], None]]:
    def make(t: int) -> Callable[[int], None]:
        conn = conns[t]  # one connection per thread for the whole run, like a warm pool
        return lambda i: plain_cycle(conn, f"{prefix}-{t}-{i}")

    return make


def _admit_all(store: Store, prefix: str, threads: int, cycles: int) -> None:
    for t in range(threads):
        for i in range(cycles):
            run_id = f"{prefix}-{t}-{i}"
            store.admit_run(run_id, run_id, {"n": i}, max_attempts=1, deadline=None)


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


def _median_ratio(ours: list[float], plain: list[float]) -> float:
    return statistics.median(o / p for o, p in zip(ours, plain, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cycles")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "TURNKEEPER_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    cycles = 60 if args.quick else 400
    admin = plain_postgres_url(args.database_url)
    name = f"tk_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    try:
        migration.upgrade(url)
        rounds = 4 if args.quick else 8
        per_round = max(10, cycles // rounds)
        print(
            f"cycle: claim, begin, 2 phase moves, commit, settle; {rounds} rounds of "
            f"{per_round} cycles per thread, ours and plain interleaved; medians of rounds"
        )
        print(f"{'threads':>7} {'impl':>6} {'p50 ms':>8} {'p99 ms':>8}")
        for threads in (1, 8):
            with Store(url, pool_size=threads) as store:
                p50: dict[str, list[float]] = {"plain": [], "ours": []}
                p99: dict[str, list[float]] = {"plain": [], "ours": []}
                conns = [psycopg.connect(url, autocommit=True) for _ in range(threads)]
                for rnd in range(rounds + 1):  # round 0 warms both sides up, unreported
                    # Alternate which side goes first, so drift hits both sides alike.
                    order = ("plain", "ours") if rnd % 2 else ("ours", "plain")
                    for impl in order:
                        prefix = f"{impl}{threads}r{rnd}"
                        _admit_all(store, prefix, threads, per_round)
                        make = _ours(store, prefix) if impl == "ours" else _plain(conns, prefix)
                        samples = _timed(threads, per_round, make)
                        if rnd:
                            p50[impl].append(_pct(samples, 0.5))
                            p99[impl].append(_pct(samples, 0.99))
                for conn in conns:
                    conn.close()
                for impl in ("plain", "ours"):
                    print(
                        f"{threads:>7} {impl:>6} {statistics.median(p50[impl]):>8.3f} "
                        f"{statistics.median(p99[impl]):>8.3f}"
                    )
                ratio50 = _median_ratio(p50["ours"], p50["plain"])
                ratio99 = _median_ratio(p99["ours"], p99["plain"])
                print(
                    f"{threads:>7} {'ratio':>6} {ratio50:>8.2f} {ratio99:>8.2f}  "
                    "(ours / plain, median of per-round ratios)"
                )
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
