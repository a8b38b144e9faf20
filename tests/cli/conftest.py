"""A stack for the CLI's tests: the web app (to compare the CLI's JSON with the API's)
and, where a test needs runs to happen, a worker; the CLI runs as a process on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer
from turnkeeper.config import Settings
from turnkeeper.web import create_app


@pytest.fixture
def api_keys(settings: Settings) -> ApiKeys:
    return ApiKeys.create(settings)


@pytest.fixture
def web(settings: Settings, api_keys: ApiKeys) -> Iterator[WebServer]:
    server = WebServer.start_app(create_app(settings, ping_seconds=0.5))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    """The CLI's environment on this test's servers; no worker until a test starts one
    (without one, a submitted run stays queued)."""
    fleet = Fleet.create(settings, tmp_path / "logs")
    try:
        yield fleet
    finally:
        fleet.stop()
