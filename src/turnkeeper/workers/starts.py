"""The agent starts of one worker process: a few at a time.

A threads worker holds hundreds of turns, and a burst of runs (a deploy, a backlog,
a takeover of a dead worker's runs) would start them all at once: hundreds of jails
set up side by side on a few cores, while the same process must keep renewing every
lease it holds. On this machine (2 cores), 500 runs started at once left 23 of them
without a renewal for a whole lease (bench/turns_per_worker.py --fleet 500).

So a turn takes a start slot before it spawns its agent and gives it back at the
agent's first output, or after ``settle`` seconds (an agent that thinks before it
speaks is started; it only has not spoken yet), or when the attempt ends, whichever
comes first. At most ``start_concurrency`` turns of a process hold one. A turn waits
for one a short while at a time, so that a cancel, a deadline, a drain or a lost lease
reaches it while it waits (``Attempt._take_start_slot``).
"""

from __future__ import annotations

import threading
import time

_made: dict[int, threading.BoundedSemaphore] = {}
_making = threading.Lock()


def _slots(size: int) -> threading.BoundedSemaphore:
    """This process's slots (one set per size): made under a lock, since the first
    burst of turns asks for them from many threads at once."""
    with _making:
        if size not in _made:
            _made[size] = threading.BoundedSemaphore(size)
        return _made[size]


class StartSlot:
    """One turn's hold on its process's start slots; ``release`` is idempotent."""

    def __init__(self, size: int, settle: float) -> None:
        self._slots = _slots(size)
        self._settle = settle
        self._lock = threading.Lock()
        self.held = False
        self.taken_at = 0.0

    def take(self, timeout: float | None = None) -> bool:
        """Wait for a slot, at most ``timeout`` seconds (None: as long as it takes);
        True once this turn holds one (at once when it held one already)."""
        if self.held:
            return True
        if not self._slots.acquire(timeout=timeout):
            return False
        self.held, self.taken_at = True, time.monotonic()
        return True

    def settled(self, *, spoke: bool) -> None:
        """Called as the turn follows its agent: give the slot back once it spoke or
        ``settle`` seconds passed."""
        if self.held and (spoke or time.monotonic() - self.taken_at >= self._settle):
            self.release()

    def release(self) -> None:
        with self._lock:
            if self.held:
                self.held = False
                self._slots.release()
