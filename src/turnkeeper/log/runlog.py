"""The run log: one Redis stream per run, written only under the epoch fence.

Writers (the driver) fence, append and close; every write is one Lua script
that checks the epoch, the closed flag and the next seq before touching the
stream, so an append is refused or lands whole, and a writer that was fenced
out never lands a chunk after the fence. Readers (the web server, ``tail``)
take a snapshot or follow the log until it is closed.

The protocol a writer follows:

1. ``fence(run_id, epoch)`` once it owns the run at ``epoch`` (1 at the first
   claim, +1 per takeover). It returns the stored epoch; a value above
   ``epoch`` means the writer was superseded before it started.
2. ``append(run_id, epoch, first_seq, chunks)`` with ``first_seq`` equal to
   ``next_seq(run_id)`` (then the returned last seq + 1). The stored epoch
   must equal the writer's: higher is LogFencedError (stop writing),
   lower is LogNotFencedError (a bug: the writer skipped the fence).
3. ``close(run_id, epoch)`` when the run is settled: fenced like append,
   idempotent, it wakes parked readers and starts the retention TTL.

Retention: a log keeps its last ``max_chunks`` chunks (older ones are trimmed
by the append script) and disappears ``retention_seconds`` after close.
Reading from an offset retention removed raises LogGoneError.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final, Self, cast

import redis
import structlog

from turnkeeper.chunks import Chunk, encode_chunk
from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError, LogGoneError, LogOffsetError
from turnkeeper.log.entries import (
    LogState,
    decode_page,
    parse_state,
    redis_errors,
    script_result,
    stream_entries,
)
from turnkeeper.log.keys import (
    APPEND_LUA,
    CLOSE_LUA,
    FENCE_LUA,
    RunKeys,
    check_namespace,
    fleet_counters_key,
)

logger = structlog.get_logger(__name__)

DEFAULT_BLOCK_MS: Final = 5_000
# redis-py's default socket timeout (5 s) would cut a parked XREAD BLOCK of 5 s short.
SOCKET_TIMEOUT: Final = DEFAULT_BLOCK_MS / 1000 + 10
DEFAULT_PAGE_SIZE: Final = 1_000


def check_client(client: Any) -> None:
    """Chunks are bytes on the wire: a client that decodes responses would garble them."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ConfigError(
            "the run log needs a Redis client with decode_responses=False",
            reason="decode-responses",
        )


def _positive(name: str, value: int, run_id: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r} (run {run_id!r})")


class RunLog:
    """Fenced writes and blocking reads of run logs, on a sync redis-py client."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str,
        retention_seconds: float = 86_400.0,
        max_chunks: int = 1_000_000,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        check_client(client)
        if retention_seconds <= 0 or max_chunks < 1 or page_size < 1:
            raise ConfigError(
                "retention_seconds, max_chunks and page_size must be positive",
                reason="invalid-retention",
            )
        self._redis = client
        self.namespace = check_namespace(namespace)
        self.retention_ms = max(1, round(retention_seconds * 1000))
        self.max_chunks = max_chunks
        self.page_size = page_size
        self._fence = client.register_script(FENCE_LUA)
        self._append = client.register_script(APPEND_LUA)
        self._close = client.register_script(CLOSE_LUA)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str,
        retention_seconds: float = 86_400.0,
        max_chunks: int = 1_000_000,
        **client_options: Any,
    ) -> Self:
        """A log on its own client. A ``socket_timeout`` given must stay above ``block_ms``."""
        client_options.setdefault("socket_timeout", SOCKET_TIMEOUT)
        client = redis.Redis.from_url(url, decode_responses=False, **client_options)
        return cls(
            client,
            namespace=namespace,
            retention_seconds=retention_seconds,
            max_chunks=max_chunks,
        )

    @classmethod
    def from_settings(cls, settings: Settings, **client_options: Any) -> Self:
        """A log as configured: Redis URL, namespace, retention and trim bound."""
        return cls.from_url(
            settings.require_redis_url(),
            namespace=settings.namespace,
            retention_seconds=settings.log_retention,
            max_chunks=settings.log_max_chunks,
            **client_options,
        )

    @property
    def client(self) -> redis.Redis:
        return self._redis

    def keys(self, run_id: str) -> RunKeys:
        return RunKeys.of(self.namespace, run_id)

    # --- writes ------------------------------------------------------------------

    def fence(self, run_id: str, epoch: int) -> int:
        """Raise the log's epoch to at least ``epoch``; return the stored epoch.

        From the moment this returns, every append or close at a lower epoch is
        refused. A return above ``epoch`` means a later attempt already owns it.
        """
        _positive("epoch", epoch, run_id)
        with redis_errors(run_id, "fence"):
            reply = self._fence(keys=self.keys(run_id).as_list(), args=[epoch, run_id])
        stored = script_result(reply, run_id=run_id, epoch=epoch, operation="fence")
        logger.info("log.fenced", run_id=run_id, epoch=epoch, stored_epoch=stored)
        return stored

    def append(self, run_id: str, epoch: int, first_seq: int, chunks: Sequence[Chunk]) -> int:
        """Append ``chunks`` as seqs ``first_seq...``; return the log's last seq.

        All or nothing: LogFencedError, LogNotFencedError, LogClosedError or
        SequenceConflictError (``fields["expected"]`` is the next seq) leave
        the log untouched. An empty ``chunks`` only checks the guards.
        """
        _positive("epoch", epoch, run_id)
        _positive("first_seq", first_seq, run_id)
        args: list[Any] = [epoch, first_seq, self.max_chunks]
        args.extend(encode_chunk(chunk) for chunk in chunks)
        with redis_errors(run_id, "append"):
            reply = self._append(keys=self.keys(run_id).as_list(), args=args)
        try:
            return script_result(reply, run_id=run_id, epoch=epoch, operation="append")
        except Exception as exc:
            logger.warning("log.append_refused", run_id=run_id, epoch=epoch, error=str(exc))
            raise

    def close(self, run_id: str, epoch: int) -> None:
        """Close the log at ``epoch``: fenced, idempotent, wakes every parked reader."""
        _positive("epoch", epoch, run_id)
        with redis_errors(run_id, "close"):
            reply = self._close(keys=self.keys(run_id).as_list(), args=[epoch, self.retention_ms])
        closed_at = script_result(reply, run_id=run_id, epoch=epoch, operation="close")
        logger.info("log.closed", run_id=run_id, epoch=epoch, closed_epoch=closed_at)

    def delete(self, run_id: str) -> None:
        """Drop a run's log at once (pruning); readers then see an unknown run."""
        keys = self.keys(run_id)
        with redis_errors(run_id, "delete"):
            self._redis.delete(keys.stream, keys.meta)

    # --- fleet counters -------------------------------------------------------------

    def count(self, name: str, amount: int = 1) -> None:
        """Add to a fleet counter (for /metrics). Best effort: never fails a run."""
        try:
            self._redis.hincrby(fleet_counters_key(self.namespace), name, amount)
        except redis.RedisError as exc:
            logger.warning("metrics.count_failed", counter=name, error=str(exc))

    def counters(self) -> dict[str, int]:
        with redis_errors("-", "counters"):
            raw = self._redis.hgetall(fleet_counters_key(self.namespace))
        return {key.decode(): int(value) for key, value in cast("dict[bytes, bytes]", raw).items()}

    # --- reads -------------------------------------------------------------------

    def state(self, run_id: str) -> LogState:
        keys = self.keys(run_id)
        with redis_errors(run_id, "state"):
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(keys.meta, ["epoch", "closed", "next"])
            pipe.xrange(keys.stream, "-", "+", count=1)
            meta, head = pipe.execute()
        return parse_state(meta, head)

    def next_seq(self, run_id: str) -> int:
        """The seq the next appended chunk gets (1 for a new log)."""
        return self.state(run_id).next_seq

    def snapshot(self, run_id: str, after_seq: int = 0) -> list[tuple[int, Chunk]]:
        """Every chunk stored now after ``after_seq``, in order; never blocks.

        ``[]`` for an unknown or expired run read from 0. LogGoneError when
        retention removed chunk ``after_seq + 1``.
        """
        stream = self.keys(run_id).stream
        out: list[tuple[int, Chunk]] = []
        cursor = after_seq
        while True:
            with redis_errors(run_id, "snapshot"):
                entries = self._redis.xrange(stream, f"(0-{cursor}", "+", count=self.page_size)
            rows: list[Any] = cast("list[Any]", entries or [])
            page = decode_page(rows, cursor, run_id)
            out.extend(page.chunks)
            if page.ended or len(rows) < self.page_size:
                break
            cursor = out[-1][0]
        if not out and after_seq > 0 and not self.state(run_id).exists:
            raise LogGoneError("the log expired", run_id=run_id, reason="expired", offset=after_seq)
        return out

    def read(
        self, run_id: str, after_seq: int = 0, *, block_ms: int = DEFAULT_BLOCK_MS
    ) -> Iterator[tuple[int, Chunk]]:
        """Chunks after ``after_seq`` as they arrive; ends when the log is closed.

        Parks (XREAD BLOCK) on an open or not yet created log. Raises
        LogGoneError when the range was trimmed or the log expired, and
        LogOffsetError for an offset past the end of the log.
        """
        check_read_offset(self.state(run_id), run_id, after_seq)
        stream = self.keys(run_id).stream
        cursor = after_seq
        while True:
            with redis_errors(run_id, "read"):
                reply = self._redis.xread(
                    {stream: f"0-{cursor}"}, count=self.page_size, block=block_ms
                )
            entries = stream_entries(reply)
            if entries:
                page = decode_page(entries, cursor, run_id)
                for seq, chunk in page.chunks:
                    cursor = seq
                    yield seq, chunk
                if page.ended:
                    return
            elif read_is_over(self.state(run_id), run_id, cursor):
                return


def check_read_offset(state: LogState, run_id: str, after_seq: int) -> None:
    if after_seq < 0:
        raise LogOffsetError("an offset cannot be negative", run_id=run_id, offset=after_seq)
    if after_seq > 0 and not state.exists:
        raise LogGoneError(
            "the log expired or never existed", run_id=run_id, reason="expired", offset=after_seq
        )
    if state.exists and after_seq > state.last_seq:
        raise LogOffsetError(
            f"offset {after_seq} is past the last seq {state.last_seq}",
            run_id=run_id,
            reason="offset-ahead",
            offset=after_seq,
        )


def read_is_over(state: LogState, run_id: str, cursor: int) -> bool:
    """After a block timeout: has the log ended or vanished under a parked reader?

    The end marker normally wakes readers; this catches a log that expired or
    was deleted while a reader was parked on it.
    """
    if not state.exists:
        if cursor > 0:
            raise LogGoneError("the log expired", run_id=run_id, reason="expired", offset=cursor)
        return False
    return state.closed and cursor >= state.last_seq
