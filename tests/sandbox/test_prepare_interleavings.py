"""A prepare stopped between its steps, a successor's claim or disarm run meanwhile: the
prepare, let go, must not lead to an agent (docs/architecture.md, "Journals that never
started", the table of interleavings).

The real prepare (``journal.prepare_argv``) is held at one of its steps by a FIFO put
where it is about to create a file (it opens the FIFO for writing, and a FIFO's open
waits for a reader; ``set -C`` refuses only existing regular files). Held at the
stderr file, it has made the journal and not written its nonce yet; held at the
environment file, it has written the nonce. The test runs, meanwhile, what a successor
runs in that sandbox: ``claim_journal`` then ``never_started`` (``Placer.claim_unstarted``,
and the attach's check), or the stall's ``disarm``; then it lets the prepare go on by
reading the FIFO and putting a regular file with what it read in its place.
"""

from __future__ import annotations

import shlex
import threading
import time
from pathlib import Path

import pytest

from turnkeeper.errors import JournalExistsError
from turnkeeper.sandbox import AgentCommand, JournalPaths, Sandbox, spawn_journaled
from turnkeeper.sandbox.journal import LIVENESS_FREE, LIVENESS_NOT_STARTED, liveness_argv
from turnkeeper.sandbox.runner import claim_journal, disarm, never_started

RUN = "run-1"
AGENT = AgentCommand(("/bin/sh", "-c", "echo ran >> ran.txt; echo the agent ran"))


def _hold_at(sandbox: Sandbox, path: str) -> None:
    done = sandbox.exec(["/bin/sh", "-c", f"umask 077 && mkfifo -- {shlex.quote(path)}"])
    assert done.exit_code == 0, done.stderr


def _let_go(sandbox: Sandbox, path: str) -> None:
    """Read the held prepare's write to its end, then leave a regular file with those
    bytes where the FIFO was (the writer reads the environment file later)."""
    fifo, kept = shlex.quote(path), shlex.quote(path + ".kept")
    done = sandbox.exec(["/bin/sh", "-c", f"cat -- {fifo} > {kept} && mv -f -- {kept} {fifo}"])
    assert done.exit_code == 0, done.stderr


def _wait_made(sandbox: Sandbox, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sandbox.exec(["test", "-e", path]).exit_code != 0:
        assert time.monotonic() < deadline, f"{path} never made"
        time.sleep(0.02)


@pytest.mark.parametrize("probe", ["claim", "disarm"])
@pytest.mark.parametrize("held_at", ["stderr", "env"])
def test_a_prepare_held_between_its_steps_starts_no_agent_after_a_claim_or_disarm(
    sandbox: Sandbox, held_at: str, probe: str
) -> None:
    paths = JournalPaths(sandbox.ref.journal_dir, RUN, 1)
    fifo = paths.stderr if held_at == "stderr" else paths.env_file
    sandbox.exec(["mkdir", "-p", paths.directory])
    _hold_at(sandbox, fifo)
    outcome: list[object] = []

    def prepare_and_start() -> None:
        try:
            outcome.append(spawn_journaled(sandbox, RUN, AGENT, process=1))
        except JournalExistsError as exc:
            outcome.append(exc)

    owner = threading.Thread(target=prepare_and_start, daemon=True)
    owner.start()
    # The journal is made; the prepare waits at the FIFO, its nonce not written (stderr)
    # or written (env).
    _wait_made(sandbox, paths.journal)
    assert owner.is_alive()
    if probe == "claim":
        assert claim_journal(sandbox, paths) is False  # made before: the prepare's
        assert never_started(sandbox, paths) is True
    else:
        assert disarm(sandbox, paths) is True
    _let_go(sandbox, fifo)
    owner.join(timeout=120)
    assert not owner.is_alive()
    if held_at == "stderr":
        # Its nonce file was taken before it could write it: it refuses, as a prepare
        # whose journal was made before, and nothing starts a writer.
        assert [(type(e), getattr(e, "reason", None)) for e in outcome] == [
            (JournalExistsError, "journal-disarmed")
        ]
        assert sandbox.exec(liveness_argv(paths)).exit_code == LIVENESS_NOT_STARTED
    else:
        # Its nonce went before its writer read it: the writer took the lock, found no
        # nonce, and exited before the agent.
        assert [type(e).__name__ for e in outcome] == ["JournalHandle"]
        deadline = time.monotonic() + 60
        while sandbox.exec(liveness_argv(paths)).exit_code != LIVENESS_FREE:
            assert time.monotonic() < deadline, "the writer never ended"
            time.sleep(0.05)
    assert Path(paths.journal).read_bytes() == b""
    assert not (Path(sandbox.ref.workspace) / "ran.txt").exists()
