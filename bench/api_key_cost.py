"""What an API key costs a request: GET /runs/{id} with the key looked up, against the same
route with the lookup replaced by a fixed caller (FastAPI's dependency override).

Ours: every request reads its key by hash (no cache, so a revoke is refused at once) and
writes its last use at most once a minute. The plain alternative: the same app, route and
run, with no key read at all. Served by uvicorn in this process, one httpx client.

    .venv/bin/python bench/api_key_cost.py [--requests N]

Uses TURNKEEPER_DATABASE_URL / TURNKEEPER_REDIS_URL (a scratch database is created and
dropped), or the embedded servers in .turnkeeper when unset.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from _fleet import bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.logconfig import configure_logging
from turnkeeper.web import create_app
from turnkeeper.web.auth import Principal, authenticate
from turnkeeper.web.serve import BackgroundServer

BLOCK = 50


def timed(http: httpx.Client, url: str, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        response = http.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp)) as fleet:
        with Client.from_settings(fleet.settings) as client:
            key = client.store.create_key("bench")
            client.submit("scripted", "p", run_id="bench-run", key_name="bench")
        caller = Principal("bench", admin=False, allow_commands=False, max_running=None)
        plain_app = create_app(fleet.settings)
        plain_app.dependency_overrides[authenticate] = lambda: caller
        servers = {
            "plain": BackgroundServer.start(plain_app),
            "ours": BackgroundServer.start(create_app(fleet.settings)),
        }
        rows: dict[str, list[float]] = {"plain": [], "ours": []}
        headers = {"Authorization": f"Bearer {key}"}
        try:
            clients = {
                name: httpx.Client(base_url=server.base_url, headers=headers)
                for name, server in servers.items()
            }
            for http in clients.values():
                timed(http, "/runs/bench-run", 50)  # warm up pools
            # Interleaved blocks, so that the machine's load falls on both alike.
            for _ in range(args.requests // BLOCK):
                for name, http in clients.items():
                    rows[name] += timed(http, "/runs/bench-run", BLOCK)
            for http in clients.values():
                http.close()
        finally:
            for server in servers.values():
                server.stop()
    print(f"GET /runs/{{id}}, {args.requests} requests, one client")
    print(f"{'path':<34} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, label in (("plain", "no key read (plain)"), ("ours", "key read by hash (ours)")):
        samples = rows[name]
        mean = sum(samples) / len(samples)
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        print(f"{label:<34} {p50:>8.2f} {p99:>8.2f} {mean:>8.2f}")
    ratio = percentile(rows["ours"], 50) / percentile(rows["plain"], 50)
    print(f"ours / plain at p50: {ratio:.2f}x")


if __name__ == "__main__":
    main()
