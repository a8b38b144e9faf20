"""Reading a journal: complete lines with byte-exact end positions, up to the sentinel.

Two strategies, chosen from the sandbox's capabilities: ``follow`` (a killable
``tail -F`` streamed through ``spawn``; needs background and killable processes) and
``poll`` (bounded ``exec`` reads every interval). Either way the reader:

- starts at any byte offset and yields ``(line, end_position)`` for complete lines;
- with ``max_line_bytes``, hands a longer line out in pieces as it streams
  (``LinePiece``, cut at fixed byte offsets of the line, see ``sandbox/lines.py``),
  so it holds at most that many bytes of an unfinished line (``peak_pending``); a
  reader started at the end of one of a line's pieces is told where that line began
  (``line_start``, from a ``ReadPoint``), and goes on cutting it as one read would;
- stops at this agent process's nonce-checked sentinel and records its exit code, but
  only when it is the journal's final line: the writer appends it last, so a sentinel
  followed by anything is a forgery (the nonce leaked), and the read fails with
  ``invalid-sentinel`` rather than hand the line, and the nonce in it, to clients;
- fails with ``journal-stalled`` when no byte at all arrives within the first-byte bound;
- fails with ``agent-vanished`` when the writer's lock is free twice in a row while the
  journal holds no sentinel: the agent died without one (killed, OOM), and tailing on
  would wait forever;
- stops at once when its ``StopSignal`` is set, from any thread.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Literal

from turnkeeper.errors import (
    AgentVanishedError,
    InvalidSentinelError,
    JournalError,
    JournalStalledError,
    JournalTooLargeError,
    SandboxError,
)
from turnkeeper.logconfig import get_logger
from turnkeeper.sandbox.journal import (
    EXIT_PROBE_BYTES,
    LIVENESS_ALIVE,
    LIVENESS_FREE,
    POLL_READ_BYTES,
    JournalPaths,
    final_exit,
    follow_argv,
    liveness_argv,
    parse_sentinel,
    read_argv,
    size_argv,
    tail_argv,
)
from turnkeeper.sandbox.lines import Line, LinePiece, LineSplitter
from turnkeeper.sandbox.provider import Capabilities, Sandbox

log = get_logger(__name__)

Strategy = Literal["follow", "poll"]

DEFAULT_POLL_INTERVAL = 0.25
DEFAULT_FIRST_BYTE_TIMEOUT = 10.0
DEFAULT_LIVENESS_INTERVAL = 1.0
LIVENESS_MAX_INTERVAL = 16.0  # a long-idle journal's writer is probed this often
_TICK = 0.25
FOLLOW_READ_BYTES = 1 << 20
_SPLIT_BYTES = 1 << 16
_MAX_FOLLOW_RESTARTS = 3
_SENTINEL_SLACK = 256  # the writer's newline and sentinel may follow a full journal
_WRITER_EXIT_WAIT = 30.0  # the writer exits right after its sentinel; a hang guard


def strategy_for(capabilities: Capabilities) -> Strategy:
    if capabilities.background_processes and capabilities.killable_processes:
        return "follow"
    return "poll"


class StopSignal:
    """A stop flag any thread can set and a reader can wait on in ``select``."""

    def __init__(self) -> None:
        self._event = threading.Event()
        # Readers test this plain attribute after every line, where even a method call
        # is a visible cost; ``set`` is the only writer.
        self.stopped = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def set(self) -> None:
        if not self._event.is_set():
            self.stopped = True
            self._event.set()
            with contextlib.suppress(OSError):
                os.write(self._write_fd, b"x")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def fileno(self) -> int:
        return self._read_fd

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> StopSignal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _IdleWatch:
    """What the idle checks of one read remember between ticks.

    The writer's liveness is probed every ``interval`` while no bytes come, and the
    interval doubles after each probe that finds the writer alive, up to
    ``LIVENESS_MAX_INTERVAL``: each probe is a process in the sandbox, and a worker
    holding hundreds of turns whose agents wait on a model would otherwise spend its
    CPU on them (and starve its own heartbeats). A probe that finds the writer gone is
    followed by the second one a base interval later; bytes reset the interval."""

    started: float
    base: float
    last_check: float = field(init=False)
    interval: float = field(init=False)
    strikes: int = 0

    def __post_init__(self) -> None:
        self.last_check = self.started
        self.interval = self.base

    def woke(self) -> None:
        """Bytes came: the writer is alive."""
        self.strikes = 0
        self.interval = self.base

    def probed(self, gone: bool) -> None:
        if gone:
            self.strikes += 1
            self.interval = self.base
        else:
            self.strikes = 0
            self.interval = min(self.interval * 2, max(self.base, LIVENESS_MAX_INTERVAL))


class JournalReader:
    """Iterate once; afterwards ``exit_code`` and ``end_position`` describe the sentinel."""

    def __init__(
        self,
        sandbox: Sandbox,
        paths: JournalPaths,
        *,
        nonce: str,
        from_byte: int = 0,
        line_start: int | None = None,
        stop: StopSignal | None = None,
        strategy: Strategy | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        first_byte_timeout: float | None = DEFAULT_FIRST_BYTE_TIMEOUT,
        liveness_interval: float | None = DEFAULT_LIVENESS_INTERVAL,
        max_bytes: int | None = None,
        max_line_bytes: int | None = None,
    ) -> None:
        if isinstance(from_byte, bool) or not isinstance(from_byte, int) or from_byte < 0:
            raise JournalError(
                f"byte offset must be a non-negative integer, got {from_byte!r}",
                run_id=paths.run_id,
            )
        self.sandbox = sandbox
        self.paths = paths
        self.nonce = nonce
        self.from_byte = from_byte
        self.stop = stop or StopSignal()
        self.strategy: Strategy = strategy or strategy_for(sandbox.capabilities)
        self.poll_interval = poll_interval
        self.first_byte_timeout = first_byte_timeout or None
        self.liveness_interval = liveness_interval
        self.max_bytes = max_bytes
        self.max_line_bytes = max_line_bytes
        try:
            self._splitter = LineSplitter(
                from_byte, max_line_bytes=max_line_bytes, line_start=line_start
            )
        except ValueError as exc:
            raise JournalError(str(exc), run_id=paths.run_id, position=from_byte) from exc
        self._nonce_bytes = nonce.encode()
        self.exit_code: int | None = None
        self.end_position: int | None = None
        self.position = from_byte

    @property
    def peak_pending(self) -> int:
        """The most bytes of an unfinished line this reader held at once."""
        return self._splitter.peak_pending

    def __iter__(self) -> Iterator[Line]:
        splitter = self._splitter
        idle = _IdleWatch(time.monotonic(), self.liveness_interval or 0.0)
        stop = self.stop
        source = self._follow(splitter) if self.strategy == "follow" else self._poll(splitter)
        try:
            for chunk in source:
                if stop.stopped:
                    return
                if not chunk:
                    self._idle_tick(idle, splitter)
                    continue
                idle.woke()
                taken = splitter.take(chunk)
                if taken is not None:
                    lines, sentinel_found, failure = self._screen(splitter, *taken)
                    # The per-line loop is all the Python a line costs: keep it this small.
                    for line, end in lines:
                        self.position = end
                        yield line, end
                        if stop.stopped:
                            return
                    if sentinel_found:
                        if splitter.pending:
                            raise self._forged(splitter.fed_until)
                        self._confirm_final()
                        return
                    if failure is not None:
                        raise failure
                if splitter.max_line_bytes is not None:
                    yield from self._pieces(splitter)
                self._check_size(splitter.fed_until - _SENTINEL_SLACK)
        finally:
            # Closing the source kills a follow process at once, whatever ended the read.
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _pieces(self, splitter: LineSplitter) -> Iterator[Line]:
        """The unfinished line's pieces that are complete now (the line is over the cap)."""
        for piece, end in splitter.pieces():
            if self.stop.stopped:
                return
            self._check_size(end)
            self.position = end
            yield piece, end

    def _idle_tick(self, idle: _IdleWatch, splitter: LineSplitter) -> None:
        """No bytes this tick: fail a read that never started, or whose writer is gone."""
        now = time.monotonic()
        if (
            splitter.received == 0
            and self.first_byte_timeout is not None
            and now - idle.started >= self.first_byte_timeout
        ):
            liveness = self._liveness()
            if (
                liveness is None
                or liveness == LIVENESS_ALIVE
                or (liveness == LIVENESS_FREE and not self._writer_gone())
            ):
                # A silent agent that is running (a slow start), one that already wrote
                # its sentinel (a slow reader), and an unanswered probe are not stalls:
                # wait another bound, never start a second copy next to a live agent.
                idle.started = now
                return
            raise JournalStalledError(
                f"journal delivered no bytes within {self.first_byte_timeout}s",
                run_id=self.paths.run_id,
                reason="journal-stalled",
                journal=self.paths.journal,
                liveness=liveness,
            )
        if self.liveness_interval is not None and now - idle.last_check >= idle.interval:
            idle.last_check = now
            idle.probed(self._writer_gone())
            if idle.strikes >= 2:
                raise AgentVanishedError(
                    "agent process is gone and its journal has no exit sentinel",
                    run_id=self.paths.run_id,
                    reason="agent-vanished",
                    journal=self.paths.journal,
                )

    def _screen(
        self, splitter: LineSplitter, body: bytes, start: int
    ) -> tuple[list[Line], bool, JournalError | None]:
        """The lines of one chunk to hand out, whether this run's sentinel follows
        them, and the error to raise after them (an oversized line, a forged sentinel).

        Equivalent to checking every line in order (sentinel first, then size), but
        done per chunk: a line can only be a sentinel (or a forged one) if it holds
        the nonce, and line ends only grow, so the common chunk costs one search for
        the nonce and no per-line work. A piece of a cut line is never a sentinel: the
        writer's sentinel is a short line of its own.
        """
        lines = splitter.lines(body, start)
        cut = len(lines)  # index of the first line past the size limit, if any
        if self.max_bytes is not None and lines[-1][1] > self.max_bytes + 1:
            cut = bisect.bisect_right(lines, self.max_bytes + 1, key=itemgetter(1))
        if self._nonce_bytes in body:
            for index, (line, end) in enumerate(lines[: cut + 1]):
                if isinstance(line, LinePiece):
                    continue
                try:
                    if self._is_sentinel(line, end):
                        if index < len(lines) - 1:
                            return lines[:index], False, self._forged(lines[-1][1])
                        return lines[:index], True, None
                except InvalidSentinelError as exc:
                    return lines[:index], False, exc
        if cut < len(lines):
            return lines[:cut], False, self._too_large(lines[cut][1])
        return lines, False, None

    def _is_sentinel(self, line: bytes, end: int) -> bool:
        try:
            code = parse_sentinel(line, self.nonce)
        except InvalidSentinelError as exc:
            raise InvalidSentinelError(
                "journal holds a malformed exit sentinel",
                run_id=self.paths.run_id,
                reason="invalid-sentinel",
                position=end,
            ) from exc
        if code is None:
            return False
        self.exit_code, self.end_position = code, end
        log.debug("journal.sentinel", run_id=self.paths.run_id, exit_code=code, position=end)
        return True

    def _forged(self, position: int) -> InvalidSentinelError:
        self.exit_code = self.end_position = None
        return InvalidSentinelError(
            "the journal goes on after its exit sentinel",
            run_id=self.paths.run_id,
            reason="invalid-sentinel",
            position=position,
        )

    def _confirm_final(self) -> None:
        """The sentinel must end the journal: once its writer is gone (it exits right
        after appending it), nothing may follow. A probe that cannot answer (the
        sandbox went away meanwhile) keeps the sentinel, which was the last byte read."""
        end = self.end_position
        deadline = time.monotonic() + _WRITER_EXIT_WAIT
        try:
            while self._liveness() == LIVENESS_ALIVE and time.monotonic() < deadline:
                if self.stop.wait(0.01):
                    return
            size = self.sandbox.exec(size_argv(self.paths), timeout=30)
        except SandboxError as exc:
            log.warning("journal.final_unconfirmed", run_id=self.paths.run_id, error=str(exc))
            return
        text = size.stdout.strip()
        if size.exit_code == 0 and text.isdigit() and int(text) != end:
            raise self._forged(int(text))

    def _check_size(self, end: int) -> None:
        if self.max_bytes is not None and end > self.max_bytes + 1:
            raise self._too_large(end)

    def _too_large(self, end: int) -> JournalTooLargeError:
        return JournalTooLargeError(
            f"journal passed its limit of {self.max_bytes} bytes",
            run_id=self.paths.run_id,
            reason="journal-too-large",
            position=end,
        )

    def _liveness(self) -> int | None:
        """The writer's liveness (``LIVENESS_*``), or None when the probe itself failed."""
        try:
            return self.sandbox.exec(liveness_argv(self.paths), timeout=30).exit_code
        except SandboxError as exc:
            log.warning("journal.liveness_unknown", run_id=self.paths.run_id, error=str(exc))
            return None

    def _writer_gone(self) -> bool:
        """True when the writer's lock is free and no sentinel is in the journal's tail.

        The writer appends the sentinel before its lock is released, so a free lock
        with no sentinel means the writer died; two strikes in a row are required
        because the lock file exists a moment before it is locked.
        """
        try:
            alive = self.sandbox.exec(liveness_argv(self.paths), timeout=30)
            if alive.exit_code != LIVENESS_FREE:
                return False
            tail = self.sandbox.exec(tail_argv(self.paths.journal, EXIT_PROBE_BYTES), timeout=30)
        except SandboxError as exc:
            log.warning("journal.liveness_unknown", run_id=self.paths.run_id, error=str(exc))
            return False
        return final_exit(tail.stdout, self.nonce) is None

    def _follow(self, splitter: LineSplitter) -> Iterator[bytes]:
        """Chunks from ``tail -F``; an empty chunk is an idle tick for the checks above."""
        restarts = 0
        while True:
            proc = self.sandbox.spawn(follow_argv(self.paths, splitter.fed_until))
            try:
                fd = proc.stdout.fileno()
                while True:
                    ready, _, _ = select.select([fd, self.stop.fileno()], [], [], _TICK)
                    if self.stop.is_set():
                        return
                    if fd not in ready:
                        yield b""
                        continue
                    data = os.read(fd, FOLLOW_READ_BYTES)
                    if not data:
                        break
                    restarts = 0
                    yield data
            finally:
                proc.kill()
            restarts += 1
            if restarts > _MAX_FOLLOW_RESTARTS:
                raise JournalError(
                    "the journal follow process keeps ending",
                    run_id=self.paths.run_id,
                    reason="follow-ended",
                )
            log.warning("journal.follow_restarted", run_id=self.paths.run_id, restarts=restarts)
            if self.stop.wait(_TICK):
                return
            yield b""

    def _poll(self, splitter: LineSplitter) -> Iterator[bytes]:
        while not self.stop.is_set():
            result = self.sandbox.exec(
                read_argv(self.paths, splitter.fed_until, POLL_READ_BYTES), timeout=60
            )
            data = result.stdout
            if not data:
                yield data  # an idle tick for the checks in __iter__
            # Split in pipe-sized pieces: many small lists of lines are cheaper to build
            # than one of a whole read (bench/journal_throughput.py).
            for offset in range(0, len(data), _SPLIT_BYTES):
                yield data[offset : offset + _SPLIT_BYTES]
            if len(data) >= POLL_READ_BYTES:
                continue
            if self.stop.wait(self.poll_interval):
                return
