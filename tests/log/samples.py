"""Small chunk factories shared by the log tests."""

from __future__ import annotations

from turnkeeper.chunks import Chunk


def text_chunk(n: int, message_id: str = "m") -> Chunk:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": f"chunk {n}"}


def custom_chunk(name: str) -> Chunk:
    return {"type": "CUSTOM", "name": name, "value": {"n": name}}
