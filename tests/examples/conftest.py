"""The examples run as the README runs them, each a process of its own, against a real
turnkeeper: its workers and web app (tests/web's fixtures), with API keys in the test's
database. Browsers are Debian's Chromium, headless, driven by Playwright."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.examples.pages import Example, start_django_chat, start_fastapi_chat
from tests.web.browser import CHROMIUM, launch
from tests.web.conftest import ApiKeys, WebServer, api_keys, fleet, web

__all__ = ["api_keys", "browser", "django_chat", "fastapi_chat", "fleet", "web"]


@pytest.fixture
def fastapi_chat(web: WebServer, api_keys: ApiKeys, tmp_path: Path) -> Iterator[Example]:
    """The FastAPI example on bob's key (a tenant that may run only the catalog's agents)."""
    example = start_fastapi_chat(web.base_url, api_keys.bob, tmp_path)
    try:
        yield example
    finally:
        example.stop()


@pytest.fixture
def django_chat(web: WebServer, api_keys: ApiKeys, tmp_path: Path) -> Iterator[Example]:
    """The Django example on bob's key (a tenant that may run only the catalog's agents)."""
    example = start_django_chat(web.base_url, api_keys.bob, tmp_path)
    try:
        yield example
    finally:
        example.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.skip("Debian chromium is not installed (scripts/system-deps)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = launch(playwright)
        try:
            yield launched
        finally:
            launched.close()
