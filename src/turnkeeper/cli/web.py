"""`turnkeeper web`: the API, the resumable SSE streams and the dashboard, served by uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer
import uvicorn

from turnkeeper.cli.context import console, services, settings_from_env
from turnkeeper.web import create_app


def web(
    host: Annotated[str | None, typer.Option(help="Bind address [TURNKEEPER_WEB_HOST].")] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port [TURNKEEPER_WEB_PORT].")
    ] = None,
) -> None:
    """Serve the HTTP API, SSE streams, /metrics and the dashboard at /."""
    settings = settings_from_env(quiet=False)
    with services(settings, start=False) as resolved:
        bind_host = host or resolved.web_host
        bind_port = resolved.web_port if port is None else port
        console.print(f"dashboard http://{bind_host}:{bind_port}/", highlight=False)
        uvicorn.run(
            create_app(resolved),
            host=bind_host,
            port=bind_port,
            log_level=resolved.log_level.lower(),
            proxy_headers=True,
        )
