"""Run logs written as the driver writes them, for Durable Streams tests.

``submit_run`` admits a run through the API (it stays queued without workers, owned
by the key that sent it); ``LogWriter`` fences, appends to and closes its log with the
real ``RunLog`` scripts, so a test decides exactly which chunks a stream holds and
when it closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.log import RunLog
from turnkeeper.web.durable import format_offset


def stream_path(run_id: str) -> str:
    return f"/streams/runs/{quote(run_id, safe='')}"


def submit_run(http: httpx.Client, run_id: str) -> dict[str, Any]:
    response = http.post("/runs", json={"agent": "scripted", "prompt": "seeded", "run_id": run_id})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def chunk(number: int) -> Chunk:
    return {"type": "CUSTOM", "name": "seeded", "value": {"n": number, "text": f"é{number}"}}


@dataclass
class LogWriter:
    """The driver's side of one run's log, at epoch 1."""

    log: RunLog
    run_id: str
    written: list[Chunk] = field(default_factory=list)

    @classmethod
    def open(cls, settings: Settings, run_id: str, *, max_chunks: int = 1_000_000) -> LogWriter:
        log = RunLog.from_url(
            settings.require_redis_url(), namespace=settings.namespace, max_chunks=max_chunks
        )
        log.fence(run_id, 1)
        return cls(log, run_id)

    def append(self, *chunks: Chunk) -> str:
        """Append ``chunks``; the tail offset after them."""
        last = self.log.append(self.run_id, 1, len(self.written) + 1, list(chunks))
        self.written.extend(chunks)
        return format_offset(last)

    def close(self) -> None:
        self.log.close(self.run_id, 1)
