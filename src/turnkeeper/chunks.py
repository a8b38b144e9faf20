"""Chunks: the AG-UI events a run log holds, and their identity.

A chunk is an AG-UI event in its JSON wire form (camelCase keys, ``type`` set),
kept as a plain dict: translators produce them, the run log stores them, SSE
sends them. Two chunks are the same chunk when their fingerprints are equal;
the fingerprint ignores volatile fields (``timestamp``), so a journal replayed
at another time reproduces the same fingerprints.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from pydantic import TypeAdapter, ValidationError

from turnkeeper.errors import AgentError

Chunk = dict[str, Any]

VOLATILE_FIELDS: Final = frozenset({"timestamp"})

_OPTIONS: Final = orjson.OPT_SORT_KEYS


def encode_chunk(chunk: Chunk) -> bytes:
    """The stored form of a chunk: compact JSON with sorted keys."""
    return orjson.dumps(chunk, option=_OPTIONS)


def decode_chunk(data: bytes | str) -> Chunk:
    value = orjson.loads(data)
    if not isinstance(value, dict):
        raise AgentError("a chunk must be a JSON object", reason="not-an-object")
    return value


def fingerprint(chunk: Chunk) -> bytes:
    """Canonical JSON of a chunk without its volatile fields: equal chunks, equal bytes."""
    stable = {k: v for k, v in chunk.items() if k not in VOLATILE_FIELDS}
    return orjson.dumps(stable, option=_OPTIONS)


def _event_adapter() -> TypeAdapter[Any]:
    from ag_ui.core import Event  # noqa: PLC0415 - the models are large; load on first use

    return TypeAdapter(Event)


_adapter: TypeAdapter[Any] | None = None


def validate_chunk(chunk: Chunk) -> None:
    """Raise AgentError unless the chunk is a valid AG-UI event."""
    global _adapter  # noqa: PLW0603 - a lazily built, immutable validator
    if _adapter is None:
        _adapter = _event_adapter()
    try:
        _adapter.validate_python(chunk)
    except ValidationError as exc:
        raise AgentError(
            f"not a valid AG-UI event: {exc.errors()[0]['msg']}", reason="invalid-chunk"
        ) from exc
