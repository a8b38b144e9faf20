"""A real stack for web tests: worker and beat processes plus the web app served by uvicorn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from tests.driver.fleet import Fleet
from turnkeeper.config import Settings
from turnkeeper.web import create_app
from turnkeeper.web.serve import BackgroundServer


class WebServer(BackgroundServer):
    """The app on a uvicorn thread, with an HTTP client factory."""

    @classmethod
    def start_app(cls, app: FastAPI) -> WebServer:
        started = BackgroundServer.start(app)
        return cls(server=started.server, thread=started.thread, base_url=started.base_url)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(60.0))


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    """One worker (2 processes) and beat, lease 2 s, on this test's servers."""
    fleet = Fleet.create(settings, tmp_path / "logs")
    try:
        fleet.start_worker(concurrency=2)
        fleet.start_beat()
        yield fleet
    finally:
        fleet.stop()


SECRET = "web-test-secret"  # noqa: S105 - the server secret of test apps


@pytest.fixture
def web(fleet: Fleet) -> Iterator[WebServer]:
    settings = fleet.settings.model_copy(update={"secret": SecretStr(SECRET)})
    server = WebServer.start_app(create_app(settings, ping_seconds=0.5))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bare_web(settings: Settings) -> Iterator[WebServer]:
    """The web app alone (no workers): submitted runs stay queued."""
    server = WebServer.start_app(
        create_app(settings.model_copy(update={"secret": SecretStr(SECRET)}), ping_seconds=0.5)
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http(web: WebServer) -> Iterator[httpx.Client]:
    with web.http() as client:
        yield client
