"""Screenshots of the dashboard at 1280x800 and at a phone's 390x844, on a real stack.

A real stack in a scratch database (``bench/_fleet.py``, as ``turnkeeper demo`` and
the web tests start one): two workers, beat and the web app; scripted runs in a few
sessions (one branched), one that fails (its agent exits with code 2), one cancelled,
one still running, and one whose worker is SIGKILLed mid-run so that the other worker
takes it over. Debian's Chromium, driven by Playwright exactly as the dashboard tests
drive it (``tests/web/browser.py``), signs in with an admin key and photographs the
runs, run and fleet pages (the README shows these, ``docs/dashboard-*.png``) and,
under ``--out``, every page: the login, the runs (with and without a filter), the
failed run, the live run, a session.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots]

On each page it checks that nothing overflows the window's width (the page's
``scrollWidth`` is at most the window's), and stops with the pages that do.
Uses TURNKEEPER_DATABASE_URL / TURNKEEPER_REDIS_URL when set, else the embedded
servers.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from playwright.sync_api import sync_playwright
from tests.web.browser import DESKTOP, PHONE, launch, overflow, sign_in

from _fleet import BenchFleet, bench_fleet
from turnkeeper.client import Client
from turnkeeper.owner import owner_pid
from turnkeeper.store.store import Store
from turnkeeper.web import create_app
from turnkeeper.web.serve import BackgroundServer

SETTINGS = {
    "lease_ttl": 2.0,
    "heartbeat_interval": 0.5,
    "reconcile_interval": 0.5,
    "requeue_after": 3.0,
    "sandbox_ro_binds": ",".join(
        dict.fromkeys([sys.prefix, sys.base_prefix, str(REPO / "src" / "turnkeeper")])
    ),
}
HANG_GUARD = 120.0  # seconds; nothing here is timed
README_SHOTS = REPO / "docs"
FAILING_PROMPT = (
    "Update the snapshot tests after the renderer change\n"
    "Run them with --update, then check the diff by hand before committing."
)


def _agent(turns: int, pace: float, seed: int, *args: str) -> dict[str, Any]:
    return {"preset": "scripted", "turns": turns, "pace": pace, "seed": seed, "args": list(args)}


def _wait(what: str, ready: Any) -> Any:
    deadline = time.monotonic() + HANG_GUARD
    while not (value := ready()):
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)
    return value


def _settled(client: Client, run_id: str) -> None:
    _wait(f"{run_id} to settle", lambda: client.require(run_id).status.is_terminal)


def _takeover(fleet: BenchFleet, client: Client, run_id: str) -> None:
    """Kill the worker that owns ``run_id`` once it is well into the run, start a
    replacement, and wait for the other worker to finish it."""
    _wait(f"{run_id} mid-run", lambda: len(client.log.snapshot(run_id)) >= 40)
    owner = client.require(run_id).owner
    if owner is None:
        raise SystemExit(f"{run_id} has no owner to kill")
    os.killpg(os.getpgid(owner_pid(owner)), signal.SIGKILL)
    fleet.worker(concurrency=2)
    _settled(client, run_id)


def _stage(fleet: BenchFleet, client: Client, alice: str) -> dict[str, str]:
    """The runs the pages show; returns the ids the screenshots open."""
    submit = client.submit
    submit(_agent(2, 0.01, 1), "Add a --verbose flag to the CLI", run_id="cli-verbose-1",
           session_id="cli-flags", key_name=alice)  # fmt: skip
    _settled(client, "cli-verbose-1")
    submit(_agent(2, 0.01, 2), "Now document the flag in the README", run_id="cli-verbose-2",
           session_id="cli-flags", key_name=alice)  # fmt: skip
    _settled(client, "cli-verbose-2")
    submit(_agent(1, 0.01, 3), "Document it in docs/usage.md instead", run_id="cli-verbose-3",
           session_id="cli-flags", key_name=alice, from_entry="cli-verbose-2/input")  # fmt: skip
    _settled(client, "cli-verbose-3")
    for number in range(1, 4):
        submit(_agent(1, 0.01, 10 + number), f"Fix flaky test number {number}",
               run_id=f"flaky-test-{number}", key_name=alice)  # fmt: skip
    submit(_agent(1, 0.01, 5, "--exit-code", "2"), FAILING_PROMPT, run_id="update-snapshots",
           key_name=alice)  # fmt: skip
    submit(_agent(3, 0.15, 7), "Rename the config loader and update its callers",
           run_id="rename-loader", key_name=alice)  # fmt: skip
    _takeover(fleet, client, "rename-loader")
    submit(_agent(40, 0.5, 8), "Port the build scripts to the new toolchain",
           run_id="port-build", key_name=alice)  # fmt: skip
    submit(_agent(40, 0.5, 9), "Bump every dependency", run_id="bump-deps", key_name=alice)
    _wait("port-build running", lambda: client.require("port-build").status.value == "running")
    client.cancel("bump-deps")
    for run_id in ("flaky-test-1", "flaky-test-2", "flaky-test-3", "update-snapshots"):
        _settled(client, run_id)
    return {
        "takeover": "rename-loader",
        "failed": "update-snapshots",
        "live": "port-build",
        "session": "cli-flags",
    }


class _Camera:
    """Photographs one tab's pages at its window's size, and notes any page wider than
    the window."""

    def __init__(self, page: Any, size: dict[str, int], out: Path) -> None:
        self.page = page
        self.width = size["width"]
        self.suffix = f"{size['width']}x{size['height']}"
        self.out = out
        self.shots: list[Path] = []
        self.overflowing: list[str] = []

    def shot(self, name: str, *, full: bool = False, readme: str | None = None) -> None:
        if (extra := overflow(self.page)) > 0:
            self.overflowing.append(f"{name} at {self.width} px: {extra} px too wide")
        paths = [self.out / f"{name}-{self.suffix}.png"]
        if readme is not None:
            paths.append(README_SHOTS / f"dashboard-{readme}-{self.width}.png")
        for path in paths:
            self.page.screenshot(path=str(path), full_page=full)
            self.shots.append(path)


def _tour(camera: _Camera, base_url: str, key: str, ids: dict[str, str]) -> None:
    page, shot = camera.page, camera.shot
    page.goto("/login")
    shot("login")
    sign_in(page, key)
    page.wait_for_url(f"{base_url}/")
    page.wait_for_selector(f'tr[data-run-id="{ids["failed"]}"] .error-cell')
    shot("runs", readme="runs")
    page.goto("/?status=completed&search=flaky")
    page.wait_for_selector("table.runs[data-query*='flaky']")
    shot("runs-filtered")
    page.goto(f"/ui/runs/{quote(ids['takeover'], safe='')}")
    page.wait_for_selector("#conversation[data-ended='true']")
    page.wait_for_selector(".marker.takeover")
    desktop = camera.width == DESKTOP["width"]
    shot("run-takeover-full", full=True, readme="run" if desktop else None)
    page.evaluate("document.querySelector('.marker.takeover').scrollIntoView({block: 'center'})")
    shot("run-takeover", readme=None if desktop else "run")
    page.goto(f"/ui/runs/{quote(ids['failed'], safe='')}")
    page.wait_for_selector("#conversation[data-ended='true']")
    page.wait_for_selector("#failure:not([hidden])")
    shot("run-failed")
    page.goto(f"/ui/runs/{quote(ids['live'], safe='')}")
    page.wait_for_function(
        "() => Number(document.querySelector('#conversation').dataset.lastSeq) > 20"
    )
    shot("run-live")
    page.goto(f"/ui/sessions/{quote(ids['session'], safe='')}")
    page.wait_for_selector("#conversation[data-loaded='settled']")
    shot("session")
    page.goto("/ui/fleet")
    page.wait_for_selector("#fleet[data-loaded='true']")
    page.wait_for_selector("#chart-latency .legend-item")
    shot("fleet-full", full=True)
    shot("fleet", readme="fleet", full=desktop)


def _shoot(base_url: str, key: str, ids: dict[str, str], out: Path) -> list[Path]:
    shots: list[Path] = []
    overflowing: list[str] = []
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            for size in (DESKTOP, PHONE):
                context = browser.new_context(base_url=base_url, viewport=size)
                page = context.new_page()
                page.set_default_timeout(HANG_GUARD * 1000)
                camera = _Camera(page, size, out)
                _tour(camera, base_url, key, ids)
                shots += camera.shots
                overflowing += camera.overflowing
                context.close()
        finally:
            browser.close()
    if overflowing:
        raise SystemExit("pages wider than the window:\n" + "\n".join(overflowing))
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="tk-shots-") as scratch,
        bench_fleet(Path(scratch) / "data", **SETTINGS) as fleet,
    ):
        fleet.logs = Path(scratch)
        with Store(fleet.settings.require_database_url(), pool_size=1) as store:
            admin = store.create_key("operator", admin=True, allow_commands=True)
            store.create_key("alice", allow_commands=True)
        fleet.worker(concurrency=2)
        fleet.worker(concurrency=2)
        fleet.beat()
        server = BackgroundServer.start(create_app(fleet.settings, ping_seconds=0.5))
        client = Client.from_settings(fleet.settings)
        try:
            ids = _stage(fleet, client, "alice")
            shots = _shoot(server.base_url, admin, ids, args.out)
            client.cancel(ids["live"])
        finally:
            client.close()
            server.stop()
    for path in shots:
        print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


if __name__ == "__main__":
    main()
