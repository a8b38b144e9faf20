"""The web part: the ASGI app (API, resumable SSE, dashboard), stream tokens, metrics.

``turnkeeper.web:app`` is built on first access and reads its settings when it
starts, so importing this package connects nothing.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.web.app import create_app

__all__ = ["app", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        app = create_app()
        globals()["app"] = app
        return app
    raise AttributeError(name)
