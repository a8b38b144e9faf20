"""The web part: the ASGI app (API, resumable SSE, dashboard), stream tokens, metrics.

``turnkeeper.web:app`` is built on first access and reads its settings when it
starts, so importing this package connects nothing. The app's module (FastAPI and
everything the routes use) loads on first access too: the CLI and the store's users
import ``turnkeeper.web.views`` without paying for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnkeeper.web.app import create_app

__all__ = ["app", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        return importlib.import_module("turnkeeper.web.app").create_app
    if name == "app":
        app = importlib.import_module("turnkeeper.web.app").create_app()
        globals()["app"] = app
        return app
    raise AttributeError(name)
