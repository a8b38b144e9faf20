"""First-event latency through POST /agui/{agent} against the plain SSE route.

A scratch fleet (one worker, beat) and one `turnkeeper web` process serve both
routes, with a catalog agent `quick` (the scripted agent, no tool turns, no pace).
What is timed is from a request's first byte to its first event's arrival:

- a new run: ours is one POST /agui/quick of the RunAgentInput HttpAgent sends
  (key check, body parsed and validated, the run admitted, its stream gated);
  plain is POST /runs and then GET /runs/{id}/events with the key. Both wait for
  the worker to claim the run and fence its log (RUN_STARTED).
- a settled run, re-attached: ours is the same POST again (the admission replayed
  in Postgres); plain is GET /runs/{id}/events.
- each event of an open stream: a writer appends a stamped chunk every 5 ms to a
  run's log as a worker would, one client of each route reads it (the gate's cost
  per event).

The routes alternate which goes first.

    .venv/bin/python bench/agui_latency.py [--runs 100]

Uses TURNKEEPER_DATABASE_URL / TURNKEEPER_REDIS_URL (a scratch database is
created and dropped), or the embedded servers in .turnkeeper when unset.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from _fleet import bench_fleet, percentile
from turnkeeper.log import RunLog
from turnkeeper.logconfig import configure_logging
from turnkeeper.store.store import Store
from turnkeeper.web.serve import free_port

AGENT = "quick"
CATALOG = '[agents.quick]\npreset = "scripted"\nturns = 0\npace = 0\n'
PROMPT = "tidy up"


def run_input(run_id: str, session_id: str) -> dict[str, Any]:
    return {
        "threadId": session_id,
        "runId": run_id,
        "messages": [{"id": f"{run_id}/user", "role": "user", "content": PROMPT}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }


async def first_event_ms(
    http: httpx.AsyncClient, method: str, url: str, body: Any, started: float | None = None
) -> float:
    """Milliseconds from ``started`` (sending this request) to its first data line."""
    started = time.perf_counter() if started is None else started
    async with http.stream(method, url, json=body) as response:
        assert response.status_code == 200, (url, response.status_code)
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                return (time.perf_counter() - started) * 1000
    raise AssertionError(f"{url}: no event")


async def new_and_settled(
    base_url: str, key: str, store: Store, runs: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    tag = uuid.uuid4().hex[:8]
    headers = {"Authorization": f"Bearer {key}"}
    new: dict[str, list[float]] = {"plain": [], "agui": []}
    settled: dict[str, list[float]] = {"plain": [], "agui": []}
    async with httpx.AsyncClient(base_url=base_url, timeout=120, headers=headers) as http:

        async def plain_new(run_id: str, session_id: str) -> float:
            started = time.perf_counter()
            body = {"agent": AGENT, "prompt": PROMPT, "run_id": run_id, "session_id": session_id}
            admitted = await http.post("/runs", json=body)
            assert admitted.status_code == 201, admitted.text
            url = f"/runs/{quote(run_id, safe='')}/events"
            return await first_event_ms(http, "GET", url, None, started)

        async def agui(run_id: str, session_id: str) -> float:
            body = run_input(run_id, session_id)
            return await first_event_ms(http, "POST", f"/agui/{AGENT}", body)

        ids = []
        for index in range(runs):
            for route in ("plain", "agui") if index % 2 else ("agui", "plain"):
                run_id, session_id = f"{route}-{tag}-{index}", f"s-{route}-{tag}-{index}"
                ids.append((route, run_id, session_id))
                timed = plain_new if route == "plain" else agui
                new[route].append(await timed(run_id, session_id))
        for _, run_id, _ in ids:  # every run settled meanwhile or soon
            while not store.get_run(run_id).status.is_terminal:  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
        for index, (_, run_id, session_id) in enumerate(ids):
            plain = ("plain", "GET", f"/runs/{quote(run_id, safe='')}/events", None)
            ours = ("agui", "POST", f"/agui/{AGENT}", run_input(run_id, session_id))
            for name, method, url, body in (plain, ours) if index % 2 else (ours, plain):
                settled[name].append(await first_event_ms(http, method, url, body))
    return new, settled


def writer(log: RunLog, run_id: str, rounds: int, gap: float, ready: threading.Event) -> None:
    ready.wait()
    for index in range(2, rounds + 2):
        chunk = {"type": "CUSTOM", "name": "bench", "value": time.perf_counter_ns()}
        log.append(run_id, 1, index, [chunk])
        time.sleep(gap)
    log.append(run_id, 1, rounds + 2, [{"type": "RUN_FINISHED", "threadId": "x", "runId": run_id}])
    log.close(run_id, 1)


async def live_reader(
    http: httpx.AsyncClient, method: str, url: str, body: Any, *, out: list[float], opened: Any
) -> None:
    async with http.stream(method, url, json=body) as response:
        assert response.status_code == 200, (url, response.status_code)
        opened()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            chunk = orjson.loads(line.removeprefix("data:").strip())
            if chunk.get("name") == "bench":
                out.append((time.perf_counter_ns() - chunk["value"]) / 1e6)


async def live_events(
    base_url: str, key: str, log: RunLog, rounds: int, gap: float
) -> dict[str, list[float]]:
    run_id, session_id = f"live-{uuid.uuid4().hex[:8]}", f"live-s-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {key}"}
    samples: dict[str, list[float]] = {"plain": [], "agui": []}
    ready = threading.Event()
    count = 0

    def opened() -> None:
        nonlocal count
        count += 1
        if count == 2:
            ready.set()

    async with httpx.AsyncClient(base_url=base_url, timeout=120, headers=headers) as http:
        admitted = await http.post(
            "/runs",
            json={"agent": AGENT, "prompt": PROMPT, "run_id": run_id, "session_id": session_id},
        )
        assert admitted.status_code == 201, admitted.text  # no worker yet: it stays queued
        log.fence(run_id, 1)
        log.append(run_id, 1, 1, [{"type": "RUN_STARTED", "threadId": session_id, "runId": run_id}])
        thread = threading.Thread(target=writer, args=(log, run_id, rounds, gap, ready))
        thread.start()
        await asyncio.gather(
            live_reader(
                http, "GET", f"/runs/{run_id}/events", None, out=samples["plain"], opened=opened
            ),
            live_reader(
                http,
                "POST",
                f"/agui/{AGENT}",
                run_input(run_id, session_id),
                out=samples["agui"],
                opened=opened,
            ),
        )
        thread.join()
        assert (await http.post(f"/runs/{run_id}/cancel")).status_code == 200
    return samples


def report(
    title: str, samples: dict[str, list[float]], plain: str = "GET /runs/{id}/events"
) -> None:
    print(title)
    print(f"  {'route':<34} {'samples':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for name, label in (("plain", plain), ("agui", f"POST /agui/{AGENT}")):
        p50, p99 = percentiles(samples[name])
        print(f"  {label:<34} {len(samples[name]):>7} {p50:>8.2f} {p99:>8.2f}")
    (a50, a99), (p50, p99) = percentiles(samples["agui"]), percentiles(samples["plain"])
    print(f"  {'ratio agui/plain':<34} {'':>7} {a50 / p50:>7.2f}x {a99 / p99:>7.2f}x")


def percentiles(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50), percentile(samples, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="new runs through each route")
    parser.add_argument("--events", type=int, default=500, help="events of the live stream")
    args = parser.parse_args()
    configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Path(tmp) / "agents.toml"
        catalog.write_text(CATALOG)
        (Path(tmp) / "data").mkdir()
        overrides = {"agents_file": catalog, "submit_rate": 100000, "submit_burst": 100000}
        with bench_fleet(Path(tmp) / "data", secret=secrets.token_hex(16), **overrides) as fleet:
            port = free_port()
            fleet.start("web", "--port", str(port))
            base_url = f"http://127.0.0.1:{port}"
            while True:
                try:
                    if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            log = RunLog.from_settings(fleet.settings)
            with Store(fleet.settings.require_database_url(), pool_size=2) as store:
                key = store.create_key("agui-bench")
                live = asyncio.run(live_events(base_url, key, log, args.events, 0.005))
                fleet.worker(concurrency=2)
                fleet.beat()
                new, settled = asyncio.run(new_and_settled(base_url, key, store, args.runs))
            log.client.close()
            report(
                "a new run: request sent -> RUN_STARTED read",
                new,
                "POST /runs, GET /runs/{id}/events",
            )
            report("a settled run, re-attached: request sent -> first event read", settled)
            report("each event of an open stream: chunk appended -> event read", live)


if __name__ == "__main__":
    main()
