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

Postgres is the truth, this log its cache. A log given a ``source``
(``log.origin``) that Redis lost (a flush, a restart without persistence, an
eviction, a failover, or a closed log past its retention) is rebuilt from it on the
next read or write (``ensure``), with the same seqs and the same chunks, fenced at
the run's epoch as Postgres has it. The rebuild holds the log (a token in the meta
hash) while it writes it in pages; every write is refused meanwhile and retried
once it ends, and readers wait for it, so an owner's append never lands inside a
rebuild, out of order or twice. A log that cannot be rebuilt raises LogGoneError
(``reason="pruned"``); nothing reports a lost log as an empty one.
"""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import islice
from typing import Any, Final, Self, cast

import redis

from turnkeeper.chunks import Chunk, encode_chunk
from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError, LogGoneError, LogOffsetError, LogUnavailableError
from turnkeeper.log.entries import (
    STATE_FIELDS,
    LogState,
    decode_page,
    parse_state,
    redis_errors,
    refusal,
    script_result,
    stream_entries,
)
from turnkeeper.log.keys import (
    APPEND_LUA,
    CLOSE_LUA,
    FENCE_LUA,
    REBUILD_ABORT_LUA,
    REBUILD_BEGIN_LUA,
    REBUILD_END_LUA,
    REBUILD_PAGE_LUA,
    RunKeys,
    check_namespace,
    fleet_counters_key,
)
from turnkeeper.log.origin import LogSource, rebuild_cause
from turnkeeper.logconfig import get_logger

logger = get_logger(__name__)

DEFAULT_BLOCK_MS: Final = 5_000
# redis-py's default socket timeout (5 s) would cut a parked XREAD BLOCK of 5 s short.
SOCKET_TIMEOUT: Final = DEFAULT_BLOCK_MS / 1000 + 10
DEFAULT_PAGE_SIZE: Final = 1_000
REBUILD_LOCK_MS: Final = 15_000
"""How long a rebuild holds a log without writing a page before the next reader takes over."""
LOGS_LOST: Final = "logs_lost"
"""The fleet counter of logs Redis lost that were rebuilt (``log.rebuilt``)."""
LEASE_RENEWALS: Final = "lease_renewals"
"""The fleet counter of lease renewals (every worker's heartbeats)."""
REFUSED_APPENDS: Final = "refused_appends"
"""The fleet counter of appends a fence refused (a superseded owner's)."""
REBUILD_WAIT_SECONDS: Final = 120.0
"""How long a read or write waits for other rebuilds before giving up (LogUnavailableError)."""
_REBUILD_POLL = 0.02
# Refusals that mean "the log is not there": missing (never made, or lost), or being rebuilt.
_ABSENT = (b"rebuilding", b"missing")


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
        source: LogSource | None = None,
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
        self._rebuild_begin = client.register_script(REBUILD_BEGIN_LUA)
        self._rebuild_page = client.register_script(REBUILD_PAGE_LUA)
        self._rebuild_end = client.register_script(REBUILD_END_LUA)
        self._rebuild_abort = client.register_script(REBUILD_ABORT_LUA)
        self.source = source
        """Where a lost log is rebuilt from; None: a lost log stays lost (tests of the log)."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str,
        retention_seconds: float = 86_400.0,
        max_chunks: int = 1_000_000,
        source: LogSource | None = None,
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
            source=source,
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
        # A fence never makes a log that has a source: a missing one is made by the
        # rebuild, from Postgres, at Postgres's epoch, the first claim's included. An
        # owner frozen between its claim and this fence may wake after its run was
        # handed over and its log lost; made here, its empty log at its stale epoch
        # would read as empty and refuse the real owner's appends.
        create = self.source is None
        while True:
            with redis_errors(run_id, "fence"):
                reply = self._fence(
                    keys=self.keys(run_id).as_list(), args=[epoch, run_id, int(create)]
                )
            if refusal(reply) not in _ABSENT:
                break
            # Lost (or never made): rebuilt at Postgres's epoch first, so the fence
            # never makes an empty log of a run that has output.
            create = not self.ensure(run_id, found_by="fence")
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
        reply = self._guarded(self._append, run_id, args, "append")
        try:
            return script_result(reply, run_id=run_id, epoch=epoch, operation="append")
        except Exception as exc:
            logger.warning("log.append_refused", run_id=run_id, epoch=epoch, error=str(exc))
            raise

    def close(self, run_id: str, epoch: int) -> None:
        """Close the log at ``epoch``: fenced, idempotent, wakes every parked reader."""
        _positive("epoch", epoch, run_id)
        reply = self._guarded(self._close, run_id, [epoch, self.retention_ms], "close")
        closed_at = script_result(reply, run_id=run_id, epoch=epoch, operation="close")
        logger.info("log.closed", run_id=run_id, epoch=epoch, closed_epoch=closed_at)

    def _guarded(self, script: Any, run_id: str, args: list[Any], operation: str) -> Any:
        """Run a write script; a log that is lost or being rebuilt is rebuilt (or waited
        for), then the write is tried again on it."""
        while True:
            with redis_errors(run_id, operation):
                reply = script(keys=self.keys(run_id).as_list(), args=args)
            reason = refusal(reply)
            lost = reason == b"unfenced" and int(reply[1]) == 0
            if self.source is None or not (reason == b"rebuilding" or lost):
                return reply
            if not self.ensure(run_id, found_by=operation):
                return reply  # the run has no log: an unfenced write stays refused

    # --- rebuilding a lost log -----------------------------------------------------------

    def ensure(self, run_id: str, *, found_by: str = "read") -> bool:
        """Make sure the log is in Redis: rebuild it from the source when it was lost,
        or wait for the rebuild another reader or writer is doing.

        True when the log is there now; False when the run has no log yet (or no
        source was given). Raises LogGoneError when it was lost and cannot be rebuilt.
        ``found_by``: the operation that found it missing (for the log line).
        """
        if self.source is None:
            return False
        deadline = time.monotonic() + REBUILD_WAIT_SECONDS
        while True:
            state = self._read_state(run_id)
            if not state.missing:
                return True
            if not state.rebuilding:
                rebuilt = self._rebuild(run_id, found_by)
                if rebuilt is not None:
                    return rebuilt
            if time.monotonic() > deadline:
                raise LogUnavailableError(
                    "the log is being rebuilt and the rebuild does not end",
                    run_id=run_id,
                    reason="rebuild-stuck",
                )
            time.sleep(_REBUILD_POLL)

    def _rebuild(self, run_id: str, found_by: str) -> bool | None:
        """One try at rebuilding: True (rebuilt, or found present), False (the run has
        no log), None (another rebuild holds it, or took it over: wait and look again)."""
        assert self.source is not None  # noqa: S101 - checked by ensure
        keys = self.keys(run_id).as_list()
        token = secrets.token_hex(16)
        with redis_errors(run_id, "rebuild"):
            begun = self._rebuild_begin(keys=keys, args=[token, run_id, REBUILD_LOCK_MS])
        if refusal(begun) is not None:
            return None
        if begun == 0:
            return True
        started = time.perf_counter()
        try:
            # Read only once the rebuild holds the log: whatever an owner stored before
            # is in it, and whatever it appends now is refused until the rebuild ends.
            origin = self.source.origin(run_id)
            if origin is None:
                self._abort_rebuild(run_id, token)
                return False
            last = 0
            chunks = iter(origin.chunks)
            while page := list(islice(chunks, self.page_size)):
                args: list[Any] = [token, REBUILD_LOCK_MS, self.max_chunks]
                args.extend(encode_chunk(chunk) for chunk in page)
                with redis_errors(run_id, "rebuild"):
                    reply = self._rebuild_page(keys=keys, args=args)
                if refusal(reply) is not None:
                    return None  # the lock lapsed and another rebuild took over
                last = int(reply)
            end_args: list[Any] = [token, origin.epoch, int(origin.closed), self.retention_ms]
            with redis_errors(run_id, "rebuild"):
                reply = self._rebuild_end(keys=keys, args=end_args)
            if refusal(reply) is not None:
                return None
        except BaseException:
            self._abort_rebuild(run_id, token)
            raise
        cause = rebuild_cause(origin, timedelta(milliseconds=self.retention_ms), found_by)
        fields = {
            "run_id": run_id,
            "epoch": origin.epoch,
            "closed": origin.closed,
            "last_seq": last,
            "found_by": found_by,
            "seconds": round(time.perf_counter() - started, 3),
        }
        if cause == "first":
            logger.debug("log.made", **fields)
        elif cause == "expired":
            logger.info("log.restored", reason=cause, **fields)
        else:
            self.count(LOGS_LOST)
            logger.warning("log.rebuilt", reason=cause, **fields)
        return True

    def _abort_rebuild(self, run_id: str, token: str) -> None:
        try:
            self._rebuild_abort(keys=self.keys(run_id).as_list(), args=[token])
        except redis.RedisError as exc:  # the lock lapses on its own
            logger.warning("log.rebuild_abort_failed", run_id=run_id, error=str(exc))

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

    def _read_state(self, run_id: str) -> LogState:
        keys = self.keys(run_id)
        with redis_errors(run_id, "state"):
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(keys.meta, STATE_FIELDS)
            pipe.xrange(keys.stream, "-", "+", count=1)
            meta, head = pipe.execute()
        return parse_state(meta, head)

    def state(self, run_id: str) -> LogState:
        """The log's state, once a lost log was rebuilt (with a source). A log lost
        again right after its rebuild is rebuilt again: never the state of a missing
        log for one that exists (an aligner would take it for an empty log)."""
        state = self._read_state(run_id)
        for stalls in range(SHORT_READ_TRIES + 2):
            if not state.missing or not self.ensure(run_id, found_by="read"):
                return state
            state = self._read_state(run_id)
            check_short_read(stalls, run_id, 0)
        return state

    def page(self, run_id: str, after_seq: int, count: int) -> list[tuple[int, Chunk]]:
        """Up to ``count`` stored chunks after ``after_seq``, in order; [] past the end.
        LogGoneError when retention removed chunk ``after_seq + 1``."""
        stream = self.keys(run_id).stream
        with redis_errors(run_id, "page"):
            entries = self._redis.xrange(stream, f"(0-{after_seq}", "+", count=count)
        return decode_page(cast("list[Any]", entries or []), after_seq, run_id).chunks

    def next_seq(self, run_id: str) -> int:
        """The seq the next appended chunk gets (1 for a new log)."""
        return self.state(run_id).next_seq

    def snapshot(self, run_id: str, after_seq: int = 0) -> list[tuple[int, Chunk]]:
        """Every chunk stored now after ``after_seq``, in order; never blocks.

        ``[]`` for a run that has no log yet (and, without a source, for an unknown or
        expired one read from 0). LogGoneError when retention removed chunk
        ``after_seq + 1``, or when the log was lost and cannot be rebuilt.
        """
        stream = self.keys(run_id).stream
        rebuilds = self.source is not None
        walk = SnapshotWalk(run_id, after_seq, self.page_size, rebuilds, self.state(run_id))
        while walk.going:
            with redis_errors(run_id, "snapshot"):
                rows = self._redis.xrange(stream, f"(0-{walk.cursor}", "+", count=self.page_size)
            if walk.take(cast("list[Any]", rows or [])) is WalkStep.STATE:
                walk.restate(self.state(run_id))
        return walk.result()

    def read(
        self, run_id: str, after_seq: int = 0, *, block_ms: int = DEFAULT_BLOCK_MS
    ) -> Iterator[tuple[int, Chunk]]:
        """Chunks after ``after_seq`` as they arrive; ends when the log is closed.

        Parks (XREAD BLOCK) on an open or not yet created log. Raises
        LogGoneError when the range was trimmed or the log expired, and
        LogOffsetError for an offset past the end of the log.
        """
        follow = FollowWalk(run_id, after_seq, self.state(run_id))
        stream = self.keys(run_id).stream
        while follow.going:
            with redis_errors(run_id, "read"):
                reply = self._redis.xread(
                    {stream: f"0-{follow.cursor}"}, count=self.page_size, block=block_ms
                )
            chunks = follow.take(reply)
            if chunks is None:
                follow.timed_out(self.state(run_id))
            else:
                yield from chunks


SHORT_READ_TRIES: Final = 50
"""Looks at a log that reads short of its known end, lost again after every rebuild,
before a snapshot gives up (LogUnavailableError): never a short or empty answer."""


class WalkStep(enum.Enum):
    PAGE = "page"
    """Read the next page after the cursor."""
    STATE = "state"
    """Read the log's state again (``restate``), then the next page."""
    DONE = "done"


@dataclass
class SnapshotWalk:
    """A snapshot's walk through a log, page by page, without I/O: ``RunLog`` and
    ``AsyncRunLog`` drive the same one. Each page read after ``cursor`` is taken; a
    page short of the known end, on a log that can be rebuilt, means it was lost under
    the read: its state is read again (which rebuilds it, with the same seqs) and the
    walk reads on from the cursor, unless the log is gone."""

    run_id: str
    after_seq: int
    page_size: int
    rebuilds: bool
    state: LogState
    chunks: list[tuple[int, Chunk]] = field(default_factory=list)
    going: bool = True
    stalls: int = 0

    @property
    def cursor(self) -> int:
        return self.chunks[-1][0] if self.chunks else self.after_seq

    def take(self, rows: list[Any]) -> WalkStep:
        page = decode_page(rows, self.cursor, self.run_id)
        self.chunks.extend(page.chunks)
        if len(rows) == self.page_size and not page.ended:
            return WalkStep.PAGE
        if page.ended or self.cursor >= self.state.last_seq or not self.rebuilds:
            self.going = False
            return WalkStep.DONE
        self.stalls = 0 if page.chunks else self.stalls + 1
        check_short_read(self.stalls, self.run_id, self.cursor)
        return WalkStep.STATE

    def restate(self, state: LogState) -> None:
        self.state = state
        self.going = state.exists

    def result(self) -> list[tuple[int, Chunk]]:
        if not self.chunks and self.after_seq > 0 and not self.state.exists:
            raise LogGoneError(
                "the log expired", run_id=self.run_id, reason="expired", offset=self.after_seq
            )
        return self.chunks


class FollowWalk:
    """A follow's walk along a log, without I/O: ``RunLog.read`` and
    ``AsyncRunLog.read`` drive the same one. Each XREAD reply after ``cursor`` is
    taken; a reply of nothing (the block timed out) asks the log's state whether the
    log ended or vanished under the parked reader."""

    def __init__(self, run_id: str, after_seq: int, state: LogState) -> None:
        check_read_offset(state, run_id, after_seq)
        self.run_id = run_id
        self.cursor = after_seq
        self.going = True

    def take(self, reply: Any) -> list[tuple[int, Chunk]] | None:
        """The chunks the reply brought (None: it brought nothing)."""
        entries = stream_entries(reply)
        if not entries:
            return None
        page = decode_page(entries, self.cursor, self.run_id)
        if page.chunks:
            self.cursor = page.chunks[-1][0]
        self.going = not page.ended
        return page.chunks

    def timed_out(self, state: LogState) -> None:
        self.going = not read_is_over(state, self.run_id, self.cursor)


def check_short_read(stalls: int, run_id: str, cursor: int) -> None:
    """A snapshot read short of the log's known end ``stalls`` times in a row, with no
    chunk gained: past ``SHORT_READ_TRIES`` it is Redis failing, not the log's end."""
    if stalls > SHORT_READ_TRIES:
        raise LogUnavailableError(
            f"the log kept being lost while it was read after seq {cursor}",
            run_id=run_id,
            reason="lost-under-read",
            offset=cursor,
        )


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
