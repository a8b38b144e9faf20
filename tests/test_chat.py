"""``turnkeeper chat`` driven through a pseudo-terminal against a real fleet: messages
become runs of one session, Ctrl-C cancels the running turn and not the chat, Ctrl-D
leaves it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    """Its heartbeat beats every 300 s: only the cancel's wake-up can stop a turn here
    before the turn ends by itself."""
    fleet = Fleet.create(settings, tmp_path / "logs", heartbeat_interval=300.0, lease_ttl=900.0)
    try:
        fleet.start_worker()
        fleet.wait_ready()
        yield fleet
    finally:
        fleet.stop()


class Terminal:
    """A process on the child side of a pty; what it prints, collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, child = os.openpty()
        self.master = master

        def controlling_terminal() -> None:  # after setsid: the pty is the session's
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            argv,
            stdin=child,
            stdout=child,
            stderr=child,
            env={**env, "COLUMNS": "200", "TERM": "dumb"},
            start_new_session=True,
            preexec_fn=controlling_terminal,  # noqa: PLW1509 - the child's own terminal
        )
        os.close(child)
        self.output = b""
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.output += data

    def text(self) -> str:
        with self._lock:
            return self.output.decode(errors="replace")

    def wait_for(self, needle: str, count: int = 1, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout  # a hang guard, not a timing assertion
        while self.text().count(needle) < count:
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, f"no {count}x {needle!r} in:\n{self.text()}"
            time.sleep(0.05)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())


def test_a_chat_through_a_pseudo_terminal(fleet: Fleet) -> None:
    term = Terminal([sys.executable, "-m", "turnkeeper", "chat", "tty-chat"], fleet.env)
    try:
        term.wait_for("you> ")
        term.type("tidy up\n")
        term.wait_for("● finished")
        term.wait_for("you> ", 2)
        term.type("and the notes\n")
        term.wait_for("● run", 2)
        term.type("\x03")  # Ctrl-C: the turn, not the chat
        term.wait_for("● cancelling the turn")
        term.wait_for("● error: the run was cancelled")
        term.wait_for("you> ", 3)
        term.type("one more\n")
        term.wait_for("● finished", 2)
        term.wait_for("you> ", 4)
        term.type("\x04")  # Ctrl-D: the end of input leaves the chat
        assert term.proc.wait(timeout=60) == 0, term.text()
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
        os.close(term.master)
    runs = list(reversed(fleet.client.list_runs(session_id="tty-chat")))
    assert [r.status for r in runs] == [RunStatus.COMPLETED, RunStatus.ABORTED, RunStatus.COMPLETED]
    prompts = [r.payload["prompt"] for r in runs]
    assert prompts == ["tidy up", "and the notes", "one more"]
    inputs = [e for e in fleet.client.transcript("tty-chat") if e.kind == "user"]
    assert [e.body["prompt"] for e in inputs] == prompts, "one conversation, cancel included"
