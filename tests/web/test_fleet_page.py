"""The fleet page in headless Chromium (Debian's, driven by Playwright), on a real fleet:
the workers with their slots and the runs they own, a worker appearing when it starts and
leaving for the stopped list once killed, the charts drawn from real runs, a killed pool
process counted as no slot, the takeover histogram showing a real takeover's pause, and
a tenant's key finding no fleet page."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import psycopg
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer, running_fleet
from turnkeeper.config import Settings
from turnkeeper.store.fleet import LATENCY_BOUNDS
from turnkeeper.store.store import Store
from turnkeeper.web import create_app

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
HOST_DEAD_AFTER = 3.0  # a killed worker leaves the live list this long after its last beat
SLOW = {"preset": "scripted", "turns": 8, "pace": 0.25, "seed": 4}

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed (scripts/system-deps)"
)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    """The web tests' fleet, its host dead 3 s after its last beat."""
    with running_fleet(settings, tmp_path, host_dead_after=HOST_DEAD_AFTER) as started:
        yield started


@pytest.fixture
def page(web: WebServer) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_context(base_url=web.base_url).new_page()
            page.set_default_timeout(90_000)  # a hang guard only
            yield page
        finally:
            browser.close()


def _sign_in(page: Any, key: str) -> None:
    page.goto("/login?next=%2Fui%2Ffleet")
    page.fill("#key", key)
    page.click("#login button[type=submit]")
    page.wait_for_url("**/ui/fleet")


def _workers(page: Any, where: str) -> list[int]:
    pids = page.eval_on_selector_all(
        f"{where} [data-worker]", "cards => cards.map(c => Number(c.dataset.mainPid))"
    )
    return [int(pid) for pid in pids]


def _wait_workers(page: Any, where: str, pids: list[int]) -> None:
    page.wait_for_function(
        """([where, pids]) => JSON.stringify([...document.querySelectorAll(
               `${where} [data-worker]`)].map(c => Number(c.dataset.mainPid))) ===
           JSON.stringify(pids)""",
        arg=[where, pids],
    )


@pytest.mark.slow
def test_the_fleet_page_shows_a_worker_start_own_a_run_and_go_when_killed(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, page: Any
) -> None:
    first = fleet.procs[0]
    with web.http(api_keys.alice) as alice:
        body = {"agent": SLOW, "prompt": "fix the typo in the readme", "run_id": "fleet 1"}
        assert alice.post("/runs", json=body).status_code == 201
    run = fleet.wait("fleet 1", lambda r: r.owner is not None and r.status.value == "running")

    _sign_in(page, api_keys.admin)
    page.wait_for_selector("#fleet[data-loaded='true']")
    owner_slot = page.locator(f'#workers [data-slot="{run.owner}"]')
    owner_slot.locator('[data-owned-run="fleet 1"]').wait_for()
    assert _workers(page, "#workers") == [first.pid]
    slot_pids = page.eval_on_selector_all(
        f'#workers [data-main-pid="{first.pid}"] [data-slot]',
        "slots => slots.map(s => Number(s.dataset.pid))",
    )
    assert sorted(slot_pids) == sorted(c.pid for c in psutil.Process(first.pid).children())
    assert owner_slot.locator(".run-link").inner_text() == "fleet 1"
    assert owner_slot.locator(".run-link").get_attribute("href") == "/ui/runs/fleet%201"

    second = fleet.start_worker(concurrency=1)  # appears once its process beats
    expected = sorted([first.pid, second.pid])
    _wait_workers(page, "#workers", expected)
    assert page.locator(f'#workers [data-main-pid="{second.pid}"] [data-slot]').count() == 1
    assert page.locator("#stopped-workers [data-worker]").count() == 0

    os.killpg(second.pid, signal.SIGKILL)  # gone: no beat after host_dead_after
    second.wait(timeout=60)
    _wait_workers(page, "#workers", [first.pid])
    _wait_workers(page, "#stopped-workers", [second.pid])
    gone = page.locator(f'#stopped-workers [data-main-pid="{second.pid}"]')
    assert gone.get_attribute("data-alive") == "false"

    fleet.wait_settled("fleet 1")  # the charts count it within the window
    page.wait_for_function(
        """() => { const s = document.querySelector('#chart-runs [data-series=completed]');
                   return s && s.textContent === 'completed 1'; }"""
    )
    legend = page.locator("#chart-runs .legend-item").all_inner_texts()
    assert legend == ["completed 1", "failed 0", "aborted 0", "started 1"]
    assert page.locator("#chart-runs svg rect.bar-completed").count() == 1
    assert page.locator("#chart-takeovers .legend-item").all_inner_texts() == [
        "crash 0",
        "lease expired 0",
        "forced 0",
    ]
    page.wait_for_function(
        "() => document.querySelectorAll('#workers [data-owned-run]').length === 0"
    )
    # Every message consumed (a loaded machine may have repeated the run's trigger).
    page.wait_for_function(
        """() => JSON.stringify([...document.querySelectorAll('#queues [data-queue]')].map(
               r => [r.dataset.kind, r.querySelector('.depth').textContent])) ===
           JSON.stringify([["turns", "0"], ["control", "0"], ["host", "0"]])"""
    )
    # Icons are inline SVG: no character that needs an emoji font.
    text = page.locator("main").inner_text()
    assert all(ord(ch) < 0x2190 or ch == "\u2265" for ch in text), text  # below arrows; ≥


def test_a_tenant_key_finds_no_fleet_page(web: WebServer, api_keys: ApiKeys, page: Any) -> None:
    _sign_in(page, api_keys.alice)
    page.wait_for_selector("#not-found")
    assert page.locator("#not-found p").first.inner_text() == (
        "There is no fleet page for this key: it needs an admin key."
    )
    assert page.locator("#fleet").is_hidden()
    assert page.locator("#workers [data-worker]").count() == 0


def _text(page: Any, selector: str) -> str:
    return str(page.locator(selector).inner_text())


def _wait_text(page: Any, selector: str, text: str) -> None:
    page.wait_for_function(
        """([selector, text]) => { const node = document.querySelector(selector);
               return node !== null && node.textContent === text; }""",
        arg=[selector, text],
    )


@pytest.mark.slow
def test_a_killed_worker_process_counts_as_no_slot(
    settings: Settings, tmp_path: Path, api_keys: ApiKeys
) -> None:
    """At the default ``host_dead_after`` (a minute), so that only its lost sessions and
    its missed beats tell: a killed pool process (which Celery replaces) stays listed as
    stopped and is counted neither busy nor free; a whole worker killed leaves for the
    stopped list; the page's tile and each worker's header say the same counts."""
    with running_fleet(settings, tmp_path) as fleet:
        server = WebServer.start_app(create_app(fleet.settings, ping_seconds=0.5))
        try:
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, args=ARGS, headless=True
                )
                try:
                    page = browser.new_context(base_url=server.base_url).new_page()
                    page.set_default_timeout(90_000)  # a hang guard only
                    _check_killed_slots(fleet, server, api_keys, page)
                finally:
                    browser.close()
        finally:
            server.stop()


def _check_killed_slots(fleet: Fleet, server: WebServer, api_keys: ApiKeys, page: Any) -> None:
    first = fleet.procs[0]
    _sign_in(page, api_keys.admin)
    page.wait_for_selector("#fleet[data-loaded='true']")
    header = f'#workers [data-main-pid="{first.pid}"] .worker-head > .meta'
    _wait_text(page, "[data-tile='slots busy'] .tile-value", "0/2")
    page.wait_for_function(
        "selector => document.querySelector(selector).textContent.startsWith('0/2 slots busy ·')",
        arg=header,
    )
    (victim, _) = sorted(child.pid for child in psutil.Process(first.pid).children())
    os.kill(victim, signal.SIGKILL)  # Celery starts another pool process in its place
    page.wait_for_function(
        "selector => document.querySelector(selector).textContent"
        ".startsWith('0/2 slots busy · 1 stopped ·')",
        arg=header,
    )
    _wait_text(page, "[data-tile='slots busy'] .tile-value", "0/2")
    slot = page.locator(f'#workers [data-pid="{victim}"]')
    assert (slot.get_attribute("class"), slot.locator(".slot-idle").inner_text()) == (
        "slot gone",
        "stopped",
    )
    with server.http(api_keys.admin) as admin:
        body = admin.get("/fleet").json()
    assert body["slots"] == {"live": 2, "busy": 0}
    (worker,) = body["workers"]
    assert (worker["main_pid"], worker["alive"], worker["slots_live"], worker["slots_busy"]) == (
        first.pid,
        True,
        2,
        0,
    )
    live = sorted(slot["pid"] for slot in worker["slots"] if slot["alive"])
    assert live == sorted(child.pid for child in psutil.Process(first.pid).children())
    assert [s["pid"] for s in worker["slots"] if not s["alive"]] == [victim]

    second = fleet.start_worker(concurrency=1)
    _wait_text(page, "[data-tile='slots busy'] .tile-value", "0/3")
    _wait_text(page, "[data-tile='workers'] .tile-value", "2")
    os.killpg(second.pid, signal.SIGKILL)  # the whole worker: gone a beat and a half later
    second.wait(timeout=60)
    _wait_workers(page, "#stopped-workers", [second.pid])
    assert _workers(page, "#workers") == [first.pid]
    assert _text(page, "[data-tile='workers'] .tile-value") == "1"
    assert _text(page, "[data-tile='slots busy'] .tile-value") == "0/2"


def _pause(fleet: Fleet, run_id: str) -> float:
    """The pause in the run's stored output at its takeover, measured here: from the last
    journal bytes epoch 1 stored to the first of epoch 2, on the database clock."""
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT a.epoch, min(s.created_at), max(s.created_at) FROM attempts a"
            " JOIN segments s ON s.run_id = a.run_id AND s.created_at >= a.started_at"
            " AND s.created_at <= COALESCE(a.ended_at, now())"
            " WHERE a.run_id = %s GROUP BY a.epoch ORDER BY a.epoch",
            (run_id,),
        ).fetchall()
    (_, _, last_of_first), (_, first_of_second, _) = rows
    return round((first_of_second - last_of_first).total_seconds(), 3)


def _shown(seconds: float) -> str:
    """As the fleet page writes a pause: JavaScript's toFixed(1) (half up, on the float's
    exact value), or milliseconds below a tenth."""
    if seconds < 0.1:
        return f"{round(seconds * 1000)} ms"
    return f"{Decimal(seconds).quantize(Decimal('0.1'), ROUND_HALF_UP)} s"


@pytest.mark.slow
def test_the_takeover_histogram_shows_the_pause_of_a_real_takeover(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, page: Any
) -> None:
    """A run's worker frozen mid-run, then killed: the other worker takes it over. The
    histogram's median and max are the pause measured from the stored output, to the
    tenth of a second the page shows, and the run page's mark says the same."""
    fleet.start_worker()
    fleet.wait_ready()
    with web.http(api_keys.alice) as alice:
        body = {"agent": SLOW, "prompt": "rename it", "run_id": "paused 1"}
        assert alice.post("/runs", json=body).status_code == 201
        fleet.wait_chunks("paused 1", 12)
        owned = fleet.client.require("paused 1")
        pgid = fleet.signal_worker_of(owned, signal.SIGSTOP)
        os.killpg(pgid, signal.SIGKILL)
        done = fleet.wait_settled("paused 1")
        assert (done.status.value, done.epoch) == ("completed", 2)
        attempts = alice.get(f"/runs/{quote('paused 1', safe='')}").json()["attempts"]
    pause = _pause(fleet, "paused 1")
    assert attempts[1]["takeover_seconds"] == pause
    shown = _shown(pause)

    _sign_in(page, api_keys.admin)
    legend = "#chart-latency .legend-item"
    _wait_text(page, legend, f"1 takeover · median {shown} · p95 {shown} · max {shown}")
    bucket = next((i for i, bound in enumerate(LATENCY_BOUNDS) if pause < bound), None)
    label = f"<{LATENCY_BOUNDS[bucket]:g}" if bucket is not None else f"≥{LATENCY_BOUNDS[-1]:g}"
    titles = page.eval_on_selector_all(
        "#chart-latency rect.bar-latency title", "ts => ts.map(t => t.textContent)"
    )
    assert titles == [f"{label} s: 1 takeovers"]
    page.goto(f"/ui/runs/{quote('paused 1', safe='')}")
    page.wait_for_selector("#conversation .marker.takeover")
    assert f"took over after {shown}" in page.locator("#conversation .marker.takeover").inner_text()


def test_beat_overdue_is_said_on_the_fleet_page(
    bare_web: WebServer, api_keys: ApiKeys, settings: Settings
) -> None:
    """No beat runs here: the sweeps' records are written as beat would have left them.
    The reconciler last finished an hour ago (overdue), reap a moment ago (on time),
    prune never, while the only worker process has been up for an hour (overdue too:
    beat would have pruned within three of its periods)."""
    with Store(settings.require_database_url(), pool_size=1) as store:
        store.record_sweep("reconcile")
        store.record_sweep("reap")
        store.start_worker("vm:41:aa", "vm", 41, 40)
    with psycopg.connect(settings.require_database_url()) as conn:
        conn.execute("UPDATE sweeps SET finished_at = now() - interval '1 hour'"
                     " WHERE name = 'reconcile'")  # fmt: skip
        conn.execute("UPDATE workers SET started_at = now() - interval '1 hour'")
    with bare_web.http(api_keys.admin) as admin:
        sweeps = admin.get("/fleet").json()["sweeps"]
    every = (settings.reconcile_interval, settings.reap_interval, settings.prune_interval)
    assert [(s["name"], s["every_seconds"], s["overdue"]) for s in sweeps] == [
        ("reconcile", every[0], True),
        ("reap", every[1], False),
        ("prune", every[2], True),
    ]
    assert 3600 <= sweeps[0]["seconds_ago"] < 3700
    assert sweeps[2]["finished_at"] is None

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_context(base_url=bare_web.base_url).new_page()
            page.set_default_timeout(90_000)  # a hang guard only
            _sign_in(page, api_keys.admin)
            page.wait_for_selector("#fleet[data-loaded='true']")
            warning = page.locator("#beat-warning").inner_text()
            assert warning.startswith("The reconciler last ran 60 min ago and runs every ")
            assert warning.endswith(
                ": beat or its control worker has stopped. Until it runs, runs whose lease "
                "ran out are not taken over."
            )
            rows = page.eval_on_selector_all(
                "#sweeps tr", "rs => rs.map(r => [r.dataset.sweep, r.lastChild.textContent])"
            )
            assert rows == [["reconcile", "overdue"], ["reap", "on time"], ["prune", "overdue"]]
            assert page.locator("[data-tile='reconciled']").get_attribute("class") == (
                "tile text warn"
            )
        finally:
            browser.close()
