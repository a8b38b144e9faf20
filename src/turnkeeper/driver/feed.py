"""A journal read on its own thread, handed to the driver in batches of lines.

The driver writes each batch with one segment insert and one log append, so a
fast agent costs a few round trips per read rather than per line, while a slow
one still gets each line out as soon as it lands. The thread also lets the
driver wake up for a lost lease or a cancel while the reader waits for bytes.

Both the queue between the thread and the driver and a batch are bounded in bytes
as well as in lines, so the pieces of a long line (up to the line cap each) never
pile up in the worker: the reader waits while the driver stores what it has.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from turnkeeper.sandbox import JournalReader

_MAX_BATCH_LINES = 512
_WAIT = 0.05
_MAX_BATCH_BYTES = 4 << 20
_MAX_QUEUED_BYTES = 8 << 20


@dataclass
class Batch:
    lines: list[tuple[bytes, int]] = field(default_factory=list)
    ended: bool = False
    """The reader stopped: at the sentinel (``exit_code`` set) or with ``error``."""
    exit_code: int | None = None
    end_position: int | None = None
    """Just past the sentinel line, when the reader ended at one."""
    error: BaseException | None = None


class JournalFeed:
    def __init__(self, reader: JournalReader) -> None:
        self.reader = reader
        self._queue: queue.Queue[tuple[bytes, int] | Batch] = queue.Queue(maxsize=4096)
        self._room = threading.Condition()
        self._queued_bytes = 0
        self._thread = threading.Thread(
            target=self._pump, name=f"journal-{reader.paths.run_id[:32]}", daemon=True
        )

    def start(self) -> JournalFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop reading at once (kills a follow process); returns when the thread is done."""
        self.reader.stop.set()
        while self._thread.is_alive():
            try:  # unblock a pump waiting on a full queue
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)

    def next_batch(self, timeout: float) -> Batch | None:
        """The lines available now (waiting up to ``timeout`` for the first), or None."""
        try:
            first = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        batch = Batch()
        size = 0
        item: tuple[bytes, int] | Batch | None = first
        try:
            while item is not None:
                if isinstance(item, Batch):
                    batch.ended, batch.exit_code, batch.error = True, item.exit_code, item.error
                    batch.end_position = item.end_position
                    break
                batch.lines.append(item)
                size += len(item[0])
                if len(batch.lines) >= _MAX_BATCH_LINES or size >= _MAX_BATCH_BYTES:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
        finally:
            self._release(size)
        return batch

    def _release(self, size: int) -> None:
        with self._room:
            self._queued_bytes -= size
            self._room.notify_all()

    def _put(self, line: tuple[bytes, int]) -> None:
        """Queue a line once the queue holds less than its byte bound (or nothing)."""
        size = len(line[0])
        stop = self.reader.stop
        with self._room:
            while (
                self._queued_bytes
                and self._queued_bytes + size > _MAX_QUEUED_BYTES
                and not stop.is_set()
            ):
                self._room.wait(_WAIT)
            self._queued_bytes += size
        self._queue.put(line)

    def _pump(self) -> None:
        end = Batch(ended=True)
        try:
            for line in self.reader:
                self._put(line)
            end.exit_code, end.end_position = self.reader.exit_code, self.reader.end_position
        except BaseException as exc:  # noqa: BLE001 - handed to the driver, which decides
            end.error = exc
        if not self.reader.stop.is_set():
            self._queue.put(end)
