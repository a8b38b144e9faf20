"""Serving the app from inside another process (the demo, tests, the benchmark)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from turnkeeper.errors import ServiceError


def free_port(host: str = "127.0.0.1", preferred: int = 0) -> int:
    """``preferred`` when it can be bound now, else a free port the kernel picks."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            chosen: int = sock.getsockname()[1]
            return chosen
    raise ServiceError(f"no free port on {host}", reason="no-port")


class DrainingServer(uvicorn.Server):
    """uvicorn that, when it starts shutting down, ends the app's event streams cleanly
    (``app.state.drain_streams``, set by ``create_app``) instead of waiting for runs
    to end: each stream sends what it has, ends its response, and its client resumes
    with ``Last-Event-ID``."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(self.config.app, "state", None)
        drain = getattr(state, "drain_streams", None)
        if drain is not None:
            drain()
        await super().shutdown(sockets)


@dataclass
class BackgroundServer:
    """uvicorn on a thread of this process; ``stop`` shuts it down gracefully."""

    server: uvicorn.Server
    thread: threading.Thread
    base_url: str

    @classmethod
    def start(
        cls, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0
    ) -> BackgroundServer:
        port = port or free_port(host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        server = DrainingServer(config)
        thread = threading.Thread(target=server.run, name="turnkeeper-web", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise ServiceError(f"the web server did not start on {host}:{port}")
            time.sleep(0.02)
        return cls(server=server, thread=thread, base_url=f"http://{host}:{port}")

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout)
