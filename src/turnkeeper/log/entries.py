"""Pure decoding of what Redis answers, shared by the sync and the async log.

Stream replies become ``(seq, chunk)`` pairs with a gap check: seqs are
contiguous by construction (an append must start at the next seq), so a first
entry after ``cursor + 1`` can only mean that retention trimmed the range the
caller asked for. Script replies become typed errors with structured fields.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from turnkeeper.chunks import Chunk, decode_chunk
from turnkeeper.errors import (
    LogClosedError,
    LogError,
    LogFencedError,
    LogGoneError,
    LogNotFencedError,
    LogUnavailableError,
    SequenceConflictError,
)
from turnkeeper.log.keys import CHUNK_FIELD, END_FIELD


@dataclass(frozen=True, slots=True)
class LogState:
    """What the meta hash and the stream head say about one run's log.

    ``exists`` is False for a run never fenced, or whose log Redis lost or expired.
    ``first_seq`` is the first seq still stored (``next_seq`` when none is).
    ``rebuilding``: a rebuild from Postgres holds the log (``RunLog.ensure``).
    ``stream_lost``: the meta hash survived its stream (an eviction of one key).
    """

    exists: bool
    epoch: int
    closed: bool
    closed_epoch: int | None
    next_seq: int
    first_seq: int
    rebuilding: bool = False
    stream_lost: bool = False

    @property
    def missing(self) -> bool:
        """The log is not there to be read or written: never made, lost, or being rebuilt."""
        return self.rebuilding or not self.exists or self.stream_lost

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1


@dataclass(frozen=True, slots=True)
class Page:
    """Chunks decoded from one stream reply, and whether the end marker was in it."""

    chunks: list[tuple[int, Chunk]]
    ended: bool


@contextmanager
def redis_errors(run_id: str | None, operation: str) -> Iterator[None]:
    """Turn redis-py exceptions into LogError types; callers never see a redis type."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise LogUnavailableError(
            f"Redis unreachable during {operation}: {exc}",
            run_id=run_id,
            reason=type(exc).__name__,
        ) from exc
    except redis.RedisError as exc:
        raise LogError(
            f"Redis failed {operation}: {exc}", run_id=run_id, reason="redis-error"
        ) from exc


def entry_seq(entry_id: bytes | str) -> int:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.partition("-")[2])


def decode_page(
    entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]], cursor: int, run_id: str
) -> Page:
    """Decode entries read strictly after ``cursor``; raise LogGoneError on a trimmed gap."""
    chunks: list[tuple[int, Chunk]] = []
    expected = cursor + 1
    for entry_id, fields in entries:
        seq = entry_seq(entry_id)
        if seq != expected:
            raise LogGoneError(
                f"seqs {expected}..{seq - 1} were removed by retention",
                run_id=run_id,
                reason="trimmed",
                offset=cursor,
                first_seq=seq,
            )
        if END_FIELD in fields:
            return Page(chunks, ended=True)
        chunks.append((seq, decode_chunk(fields[CHUNK_FIELD])))
        expected = seq + 1
    return Page(chunks, ended=False)


def stream_entries(reply: Any) -> list[tuple[bytes, Mapping[bytes, bytes]]]:
    """The entries of an XREAD reply on one stream, in RESP2 or RESP3 shape."""
    if not reply:
        return []
    if isinstance(reply, Mapping):
        return [entry for entries in reply.values() for entry in _resp3_entries(entries)]
    return [entry for _name, entries in reply for entry in entries]


def _resp3_entries(value: Any) -> list[tuple[bytes, Mapping[bytes, bytes]]]:
    # redis-py wraps RESP3 XREAD values as [[entries]]; unwrap one level when needed.
    if value and isinstance(value[0], list) and value[0] and isinstance(value[0][0], tuple):
        return list(value[0])
    return list(value)


def parse_state(meta: Sequence[bytes | None], head: Sequence[Any]) -> LogState:
    """A LogState from ``HMGET epoch closed next rebuilding`` and ``XRANGE - + COUNT 1``."""
    epoch_raw, closed_raw, next_raw, rebuilding_raw = meta
    exists = epoch_raw is not None
    next_seq = int(next_raw) if next_raw is not None else 1
    first_seq = next_seq
    if head and CHUNK_FIELD in head[0][1]:
        first_seq = entry_seq(head[0][0])
    return LogState(
        exists=exists,
        epoch=int(epoch_raw) if epoch_raw is not None else 0,
        closed=closed_raw is not None,
        closed_epoch=int(closed_raw) if closed_raw is not None else None,
        next_seq=next_seq,
        first_seq=first_seq,
        rebuilding=rebuilding_raw is not None,
        stream_lost=exists and next_seq > 1 and not head,
    )


STATE_FIELDS = ["epoch", "closed", "next", "rebuilding"]


def refusal(reply: Any) -> bytes | None:
    """The reason of a script's refusal (``{reason, number}``), None for a success."""
    if isinstance(reply, int):
        return None
    return bytes(reply[0])


def script_result(reply: Any, *, run_id: str, epoch: int, operation: str) -> int:
    """The integer a script answered, or the typed error of its refusal."""
    if isinstance(reply, int):
        return reply
    status, number = bytes(reply[0]), int(reply[1])
    if status == b"fenced":
        raise LogFencedError(
            f"{operation} refused: the log is fenced at epoch {number}",
            run_id=run_id,
            epoch=epoch,
            reason="fenced",
            stored_epoch=number,
        )
    if status == b"unfenced":
        raise LogNotFencedError(
            f"{operation} refused: the log's epoch is {number}; call fence() first",
            run_id=run_id,
            epoch=epoch,
            reason="unfenced",
            stored_epoch=number,
        )
    if status == b"closed":
        raise LogClosedError(
            f"{operation} refused: the log was closed at epoch {number}",
            run_id=run_id,
            epoch=epoch,
            reason="closed",
            closed_epoch=number,
        )
    if status == b"conflict":
        raise SequenceConflictError(
            f"{operation} refused: the next seq is {number}",
            run_id=run_id,
            epoch=epoch,
            reason="sequence-conflict",
            expected=number,
        )
    raise LogError(f"unexpected script reply {reply!r}", run_id=run_id, reason="bad-reply")
