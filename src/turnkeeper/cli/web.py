"""`turnkeeper web`: the API, the resumable SSE streams and the dashboard, served by uvicorn."""

from __future__ import annotations

import gc
import ipaddress
from typing import Annotated

import typer

from turnkeeper.cli.context import console, services, settings_from_env


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def web(
    host: Annotated[
        str | None,
        typer.Option(metavar="HOST", help="Bind address [TURNKEEPER_WEB_HOST, 127.0.0.1]."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, metavar="PORT", help="Port [TURNKEEPER_WEB_PORT]."),
    ] = None,
) -> None:
    """Serve the HTTP API, SSE streams, /metrics and the dashboard at /.

    Every route but /healthz and the dashboard's pages needs an API key
    (turnkeeper keys create); on an address other than loopback, the web app
    refuses to start until one exists.
    """
    import uvicorn

    from turnkeeper.agents.catalog import Catalog
    from turnkeeper.errors import ConfigError
    from turnkeeper.secret import ServerSecret, make_undumpable
    from turnkeeper.store.store import Store
    from turnkeeper.web import create_app
    from turnkeeper.web.serve import DrainingServer

    settings = settings_from_env(quiet=False)
    with services(settings, start=False) as resolved:
        ServerSecret.require(resolved, "to start the web app")
        Catalog.load(resolved)  # a bad agents file is a one-line error here, not a traceback
        bind_host = host or resolved.web_host
        bind_port = resolved.web_port if port is None else port
        if not is_loopback(bind_host):
            with Store(resolved.require_database_url(), pool_size=1) as store:
                if store.active_key_count() == 0:
                    raise ConfigError(
                        f"refusing to serve on {bind_host}, which is not loopback, while the "
                        "database holds no API key; create one with "
                        "`turnkeeper keys create NAME`",
                        reason="no-api-key",
                    )
        make_undumpable()
        console.print(f"dashboard http://{bind_host}:{bind_port}/", highlight=False)
        config = uvicorn.Config(
            create_app(resolved),
            host=bind_host,
            port=bind_port,
            log_level=resolved.log_level.lower(),
            proxy_headers=True,
            server_header=False,
        )
        settle_gc()
        DrainingServer(config).run()


# Allocations between young-generation collections: the default (2,000) runs them, and
# with them the full collections, often enough that a full pass over a thousand open
# streams' objects stalls every stream at once.
GC_YOUNG_THRESHOLD = 50_000


def settle_gc() -> None:
    """Before serving: what the app loaded stays out of every later collection
    (``gc.freeze``), and collections run less often. With 1,000 streams open the tail of
    event latency is mostly collections (bench/agent_to_client_latency.py, "1000x1")."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
