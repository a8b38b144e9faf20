"""Shared helpers for the agents tests: feed whole journals, check every chunk."""

from __future__ import annotations

from pathlib import Path

from turnkeeper.agents.formats import translator_for
from turnkeeper.chunks import Chunk, validate_chunk

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def translate_all(fmt: str, data: bytes, run_id: str = "run-1") -> list[Chunk]:
    """Every chunk a fresh translator makes from a journal, finish included, all validated."""
    translator = translator_for(fmt, run_id)
    chunks: list[Chunk] = []
    for line in data.splitlines(keepends=True):
        chunks.extend(translator.feed(line))
    chunks.extend(translator.finish())
    for chunk in chunks:
        validate_chunk(chunk)
    return chunks


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()
