"""A small, strict SSE reader for tests: events exactly as the server framed them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Event:
    id: str | None
    event: str
    data: str

    @property
    def chunk(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.data)
        return value


def iter_events(
    http: httpx.Client,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    method: str = "GET",
    body: Any = None,
) -> Iterator[Event | str]:
    """Events, and comment lines (keep-alives) as plain strings, until the stream ends
    (``body``: the JSON a POST sends)."""
    with http.stream(method, url, headers=headers, json=body) as response:
        if response.status_code != 200:
            response.read()
            raise httpx.HTTPStatusError(
                f"{response.status_code}: {response.text}",
                request=response.request,
                response=response,
            )
        fields: dict[str, str] = {}
        data: list[str] = []
        for line in response.iter_lines():
            if line.startswith(":"):
                yield line
            elif line == "":
                if data or fields:
                    yield Event(fields.get("id"), fields.get("event", "message"), "\n".join(data))
                fields, data = {}, []
            else:
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                else:
                    fields[name] = value


def read_stream(
    http: httpx.Client, url: str, *, headers: dict[str, str] | None = None
) -> tuple[list[tuple[int, dict[str, Any]]], Event]:
    """The (seq, chunk) pairs of a whole stream and its final (end) event."""
    chunks: list[tuple[int, dict[str, Any]]] = []
    for item in iter_events(http, url, headers=headers):
        if isinstance(item, str):
            continue
        if item.event != "message":
            return chunks, item
        assert item.id is not None
        chunks.append((int(item.id), item.chunk))
    raise AssertionError(f"the stream of {url} ended without an end event")
