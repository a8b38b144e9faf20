"""The fleet page in headless Chromium (Debian's, driven by Playwright), on a real fleet:
the workers with their slots and the runs they own, a worker appearing when it starts and
leaving for the stopped list once killed, the charts drawn from real runs, and a tenant's
key told that the page needs an admin key."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer, running_fleet
from turnkeeper.config import Settings

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


def test_a_tenant_key_is_told_the_fleet_page_needs_an_admin_key(
    web: WebServer, api_keys: ApiKeys, page: Any
) -> None:
    _sign_in(page, api_keys.alice)
    page.wait_for_selector("#fleet-error:not([hidden])")
    assert page.locator("#fleet-error").inner_text() == (
        "The fleet page needs an admin key: sign in with one (turnkeeper keys create NAME --admin)."
    )
    assert page.locator("#workers [data-worker]").count() == 0
