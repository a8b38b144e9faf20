"""What AsyncClient costs against the sync Client it wraps, and what it saves.

1. Store calls (``get``): the sync client called directly, against AsyncClient, which
   runs the same call on a worker thread (anyio.to_thread): one caller in a row, then
   50 callers at once (50 threads against 50 coroutines on one loop).
2. Following runs (``events``): N runs whose logs a writer appends to (stamped
   chunks, fenced appends, as the driver does), followed by N sync readers (a thread
   each: the only way to follow N runs at once with Client) against N coroutines of
   one AsyncClient. Latency from append to the reader, and the threads the readers
   add to the process.

    .venv/bin/python bench/async_client.py [--quick]

Uses TURNKEEPER_DATABASE_URL / TURNKEEPER_REDIS_URL (a scratch database is created and
dropped), or the embedded servers in .turnkeeper when unset.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from _fleet import bench_fleet, percentile
from turnkeeper.client import AsyncClient, Client
from turnkeeper.config import Settings
from turnkeeper.log import AsyncRunLog, RunLog
from turnkeeper.store.store import Store
from turnkeeper.tasks import create_app

CALLERS = 50
ROUNDS = 5
REPEATS = 3


def summary(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50), percentile(samples, 99)


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def admit(client: Client, runs: list[str]) -> None:
    for run_id in runs:  # admitted only: no worker runs them, the bench writes their logs
        client.store.admit_run(run_id, run_id, {"bench": True}, max_attempts=1, deadline=600)


def store_calls(settings: Settings, calls: int) -> None:
    """Both clients in one loop, call for call (and batch for batch), so that the load
    of a shared machine falls on both alike."""
    run_id = f"bench-get-{uuid.uuid4().hex[:8]}"
    per_caller = max(1, calls // CALLERS)
    measured: dict[str, list[float]] = {
        "sync-one": [],
        "async-one": [],
        "sync-many": [],
        "async-many": [],
    }

    async def measure() -> None:
        async with AsyncClient.from_settings(settings) as aclient:
            client = aclient.sync
            admit(client, [run_id])

            async def one() -> float:
                started = time.perf_counter()
                await aclient.get(run_id)
                return (time.perf_counter() - started) * 1000

            async def acaller() -> list[float]:
                return [await one() for _ in range(per_caller)]

            def caller(_: int) -> list[float]:
                return [timed(lambda: client.get(run_id)) for _ in range(per_caller)]

            for _ in range(calls):
                measured["sync-one"].append(timed(lambda: client.get(run_id)))
                measured["async-one"].append(await one())
            with ThreadPoolExecutor(CALLERS) as pool:
                for _ in range(ROUNDS):
                    batches = list(pool.map(caller, range(CALLERS)))
                    measured["sync-many"] += [ms for batch in batches for ms in batch]
                    batches = await asyncio.gather(*(acaller() for _ in range(CALLERS)))
                    measured["async-many"] += [ms for batch in batches for ms in batch]

    asyncio.run(measure())
    print(f"{'store get':<28} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8}")
    labels = {
        "sync-one": "Client, 1 caller",
        "async-one": "AsyncClient, 1 caller",
        "sync-many": f"Client, {CALLERS} threads",
        "async-many": f"AsyncClient, {CALLERS} coroutines",
    }
    for name, label in labels.items():
        p50, p99 = summary(measured[name])
        print(f"{label:<28} {len(measured[name]):>6} {p50:>8.2f} {p99:>8.2f}")
    for shape in ("one", "many"):
        (s50, s99), (a50, a99) = (
            summary(measured[f"sync-{shape}"]),
            summary(measured[f"async-{shape}"]),
        )
        label = f"ratio async/sync, {shape}"
        print(f"{label:<28} {'':>6} {a50 / s50:>7.2f}x {a99 / s99:>7.2f}x")


def settled_threads(timeout: float = 60.0) -> int:
    """The thread count once idle worker threads of earlier loops have exited (anyio's
    linger a few seconds): what the next readers add is then theirs."""
    deadline = time.monotonic() + timeout
    while any(t.name.startswith("AnyIO worker") for t in threading.enumerate()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return threading.active_count()


def writer(log: RunLog, runs: list[str], rounds: int, gap: float, ready: threading.Event) -> None:
    """A first chunk each run, once every reader is parked; then stamped ones."""
    for run_id in runs:
        log.append(run_id, 1, 1, [{"type": "CUSTOM", "name": "warm-up", "value": 0}])
    ready.wait()
    for seq in range(2, rounds + 2):
        for run_id in runs:
            log.append(run_id, 1, seq, [{"type": "CUSTOM", "name": "bench", "value": time.time()}])
        time.sleep(gap)
    for run_id in runs:
        log.close(run_id, 1)


class Readers:
    """What the readers saw: every stamped chunk's latency; ``ready`` once all of them
    read their run's first chunk (they are parked on their logs from then on)."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.samples: list[float] = []
        self.ready = threading.Event()
        self._opened = 0
        self._lock = threading.Lock()

    def saw(self, chunk: dict[str, Any]) -> None:
        if chunk["name"] == "bench":
            self.samples.append((time.time() - chunk["value"]) * 1000)
            return
        with self._lock:
            self._opened += 1
            if self._opened == self.streams:
                self.ready.set()


def follow(
    settings: Settings, streams: int, rounds: int, gap: float, mode: str
) -> tuple[list[float], int]:
    """The latencies, and how many threads the readers (and the writer) added while
    parked on their logs."""
    runs = [f"bench-{mode}-{uuid.uuid4().hex[:8]}-{i}" for i in range(streams)]
    log = RunLog.from_settings(settings)
    readers = Readers(streams)
    # A connection a parked reader, in both modes, as the web app sizes its pool.
    pool = RunLog.from_settings(settings, max_connections=streams + 10)
    store = Store(settings.require_database_url())
    with Client(settings, store=store, log=pool, app=create_app(settings)) as client:
        admit(client, runs)
        for run_id in runs:
            log.fence(run_id, 1)
        before = settled_threads()
        writing = threading.Thread(target=writer, args=(log, runs, rounds, gap, readers.ready))
        writing.start()
        if mode == "sync":

            def read(run_id: str) -> None:
                for _, chunk in client.events(run_id):
                    readers.saw(chunk)

            threads = [threading.Thread(target=read, args=(r,)) for r in runs]
            for thread in threads:
                thread.start()
            readers.ready.wait()
            parked = threading.active_count()
            for thread in threads:
                thread.join()
        else:

            async def read_all() -> int:
                run_log = AsyncRunLog.from_settings(settings, max_connections=streams + 10)
                async with AsyncClient(client, run_log) as aclient:

                    async def read(run_id: str) -> None:
                        async for _, chunk in aclient.events(run_id):
                            readers.saw(chunk)

                    tasks = [asyncio.create_task(read(r)) for r in runs]
                    await asyncio.to_thread(readers.ready.wait)
                    threads = threading.active_count()
                    await asyncio.gather(*tasks)
                    return threads

            parked = asyncio.run(read_all())
        writing.join()
    log.client.close()
    assert len(readers.samples) == streams * rounds, (mode, len(readers.samples))
    return readers.samples, parked - before


def following(settings: Settings, streams: int, rounds: int, gap: float) -> None:
    """Both modes in turn, ``REPEATS`` times, so that load swings fall on both."""
    modes = {"sync": "Client, a thread a run", "async": "AsyncClient, one loop"}
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    threads: dict[str, int] = dict.fromkeys(modes, 0)
    for _ in range(REPEATS):
        for mode in modes:
            got, added = follow(settings, streams, rounds, gap, mode)
            samples[mode] += got
            threads[mode] = max(threads[mode], added)
    title = f"events, {streams} runs"
    print(f"\n{title:<28} {'events':>6} {'p50 ms':>8} {'p99 ms':>8} {'threads':>8}")
    for mode, label in modes.items():
        p50, p99 = summary(samples[mode])
        print(f"{label:<28} {len(samples[mode]):>6} {p50:>8.2f} {p99:>8.2f} {threads[mode]:>8}")
    (s50, s99), (a50, a99) = summary(samples["sync"]), summary(samples["async"])
    ratio = threads["async"] / max(1, threads["sync"])
    print(f"{'ratio async/sync':<28} {'':>6} {a50 / s50:>7.2f}x {a99 / s99:>7.2f}x {ratio:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    with tempfile.TemporaryDirectory() as data, bench_fleet(Path(data)) as fleet:
        store_calls(fleet.settings, 200 if args.quick else 1000)
        for streams in (1, 200):
            following(fleet.settings, streams, 10 if args.quick else 30, 0.05)


if __name__ == "__main__":
    main()
