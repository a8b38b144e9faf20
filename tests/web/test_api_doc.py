"""docs/api.md documents every route the app serves: a route added without its doc
fails here."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import Mount

from turnkeeper.config import Settings
from turnkeeper.web import create_app

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _documented_path(path: str) -> str:
    """A route's path as the doc writes it: ``{run_id:path}`` is ``{run_id}``."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _served(routes: Iterable[Any]) -> Iterator[Any]:
    """Every route, those of included routers too (FastAPI may keep an included router
    whole, as ``original_router``, rather than copy its routes into the app's)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _served(inner.routes)
        else:
            yield route


def test_every_route_is_in_the_api_doc(settings: Settings) -> None:
    doc = API_DOC.read_text()
    app = create_app(settings)
    missing = []
    found = 0
    for route in _served(app.routes):
        if isinstance(route, Mount):
            if f"{route.path}/" not in doc:
                missing.append(route.path)
        elif isinstance(route, APIRoute):
            path = _documented_path(route.path)
            if f"`{path}`" not in doc and not any(
                f"`{method} {path}`" in doc for method in route.methods
            ):
                missing.append(f"{sorted(route.methods)} {path}")
            found += 1
    assert found > 10  # the API's routes were seen, not only the dashboard's
    assert missing == []


def test_the_doc_names_only_routes_that_exist(settings: Settings) -> None:
    """Each ``### `METHOD /path` `` heading of the HTTP API is a route of the app."""
    app = create_app(settings)
    served = {
        (method, _documented_path(route.path))
        for route in _served(app.routes)
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    headings = re.findall(r"^### `([A-Z]+) (/[^`]*)`", API_DOC.read_text(), re.MULTILINE)
    assert headings
    assert [heading for heading in headings if heading not in served] == []
