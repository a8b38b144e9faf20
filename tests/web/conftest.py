"""A real stack for web tests: worker and beat processes plus the web app served by uvicorn,
and API keys in the test's database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.conftest import TEST_SECRET
from tests.driver.fleet import Fleet
from turnkeeper.config import Settings
from turnkeeper.secret import STREAM_TOKENS, ServerSecret
from turnkeeper.store.store import Store
from turnkeeper.web import create_app
from turnkeeper.web.serve import BackgroundServer
from turnkeeper.web.tokens import StreamTokens


def stream_tokens(ttl: float = 60) -> StreamTokens:
    """Tokens as the test apps issue them (same secret, same subkey)."""
    return StreamTokens(ServerSecret(TEST_SECRET.encode()).subkey(STREAM_TOKENS), ttl)


@dataclass(frozen=True)
class ApiKeys:
    """Keys of the test's database: an admin, a tenant that may send commands, and one
    that may only run the catalog's agents."""

    admin: str
    alice: str
    bob: str

    @classmethod
    def create(cls, settings: Settings) -> ApiKeys:
        with Store(settings.require_database_url(), pool_size=1) as store:
            return cls(
                admin=store.create_key("admin", admin=True, allow_commands=True),
                alice=store.create_key("alice", allow_commands=True),
                bob=store.create_key("bob"),
            )


class WebServer(BackgroundServer):
    """The app on a uvicorn thread, with an HTTP client factory."""

    @classmethod
    def start_app(cls, app: FastAPI) -> WebServer:
        started = BackgroundServer.start(app)
        return cls(server=started.server, thread=started.thread, base_url=started.base_url)

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(60.0), headers=headers)


@pytest.fixture
def api_keys(settings: Settings) -> ApiKeys:
    return ApiKeys.create(settings)


@contextmanager
def running_fleet(settings: Settings, tmp_path: Path, **overrides: Any) -> Iterator[Fleet]:
    """One worker (2 processes) and beat, lease 2 s, on this test's servers."""
    fleet = Fleet.create(settings, tmp_path / "logs", **overrides)
    try:
        fleet.start_worker(concurrency=2)
        fleet.start_beat()
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(settings, tmp_path) as started:
        yield started


@pytest.fixture
def web(fleet: Fleet, api_keys: ApiKeys) -> Iterator[WebServer]:
    server = WebServer.start_app(create_app(fleet.settings, ping_seconds=0.5))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bare_web(settings: Settings, api_keys: ApiKeys) -> Iterator[WebServer]:
    """The web app alone (no workers): submitted runs stay queued."""
    server = WebServer.start_app(create_app(settings, ping_seconds=0.5))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http(web: WebServer, api_keys: ApiKeys) -> Iterator[httpx.Client]:
    """A client with alice's key (a tenant that may send inline commands)."""
    with web.http(api_keys.alice) as client:
        yield client
