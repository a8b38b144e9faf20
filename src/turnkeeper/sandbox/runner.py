"""Starting an agent journaled, finding a run's journals, and its stderr afterwards.

``spawn_journaled`` creates the agent process's journal exclusively (a second start
under the same number fails instead of appending behind an old sentinel), hands the
writer its nonce, the agent's environment and its prompt through files (never an
argv or an environment the agent could read; the nonce and environment files are
deleted by the writer before the agent starts), then starts the writer detached and
returns without waiting for it or reading its output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from turnkeeper.errors import JournalError, JournalExistsError, SandboxError
from turnkeeper.logconfig import get_logger
from turnkeeper.sandbox.codec import encode_run_id, parse_journal_name
from turnkeeper.sandbox.command import AgentCommand, check_command, env_file
from turnkeeper.sandbox.disk import DiskVerdict, parse_verdict, watched_launch
from turnkeeper.sandbox.journal import (
    JOURNAL_DISARMED_EXIT,
    JOURNAL_EXISTS_EXIT,
    LIVENESS_NOT_STARTED,
    STDERR_TAIL_BYTES,
    JournalPaths,
    check_nonce,
    claim_argv,
    disarm_argv,
    list_argv,
    liveness_argv,
    new_nonce,
    prepare_argv,
    tail_argv,
    writer_argv,
)
from turnkeeper.sandbox.provider import Sandbox, SandboxRef

log = get_logger(__name__)


def journal_key(ref: SandboxRef, paths: JournalPaths) -> str:
    """A string naming one agent process's journal, unique across sandboxes."""
    return f"{ref.provider}:{ref.id}:{encode_run_id(paths.run_id)}.{paths.process}"


@dataclass(frozen=True, slots=True)
class JournalHandle:
    """One agent process: where it writes and the nonce of its sentinel.

    JSON-serializable for the run's placement record, which is where a successor
    finds the nonce; it is never shown to clients.
    """

    ref: SandboxRef
    paths: JournalPaths
    nonce: str

    def __post_init__(self) -> None:
        check_nonce(self.nonce)

    @property
    def journal_key(self) -> str:
        return journal_key(self.ref, self.paths)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref.to_dict(),
            "run_id": self.paths.run_id,
            "process": self.paths.process,
            "nonce": self.nonce,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JournalHandle:
        nonce = data.get("nonce")
        if not isinstance(nonce, str):
            raise JournalError(
                "the journal record has no sentinel nonce (recorded by an older version)",
                run_id=str(data.get("run_id")),
                reason="no-nonce",
            )
        ref = SandboxRef.from_dict(data["ref"])
        paths = JournalPaths(ref.journal_dir, str(data["run_id"]), int(data["process"]))
        return cls(ref, paths, nonce)


def list_journals(sandbox: Sandbox, run_id: str) -> list[JournalPaths]:
    """Every agent-process journal of ``run_id`` in the sandbox, oldest first."""
    listing = sandbox.exec(list_argv(sandbox.ref.journal_dir), timeout=30)
    if listing.exit_code == 3:
        return []
    if listing.exit_code != 0:
        raise SandboxError("cannot list the journal directory", run_id=run_id, reason="list-failed")
    processes = set()
    for raw in listing.stdout.split(b"\n"):
        name = parse_journal_name(raw.decode("utf-8", errors="replace"))
        if name.kind == "run" and name.run_id == run_id and name.extension == "ndjson":
            processes.add(name.process)
    return [
        JournalPaths(sandbox.ref.journal_dir, run_id, n)
        for n in sorted(p for p in processes if p is not None)
    ]


def latest_journal(sandbox: Sandbox, run_id: str) -> JournalPaths | None:
    journals = list_journals(sandbox, run_id)
    return journals[-1] if journals else None


def spawn_journaled(
    sandbox: Sandbox,
    run_id: str,
    command: AgentCommand | str,
    *,
    prompt: bytes = b"",
    process: int | None = None,
    nonce: str | None = None,
    disk_max_bytes: int | None = None,
    after_prepare: Callable[[], bool] | None = None,
) -> JournalHandle:
    """Start ``command`` detached with its output journaled; returns without waiting.

    ``process`` defaults to one past the run's latest journal, ``nonce`` to a fresh one
    (a caller that records the handle before the start passes the recorded one).
    ``disk_max_bytes`` puts the disk watcher beside the agent (``disk.py``): what the
    agent may hold in its workspace, by the limit of the worker that starts it.
    ``after_prepare`` runs between the journal's creation and the writer's start, for
    the crash tests' failpoints (``workers/failpoints.py``): it may stop the worker
    there or fail as a lost reply, and when it answers True the writer's start is
    skipped, as a start that never reached the sandbox. Either way the journal's
    writer never started (``never_started``).
    """
    ref = sandbox.ref
    check_command(command, prompt, run_id)
    env = command.env if isinstance(command, AgentCommand) else {}
    if process is None:
        latest = latest_journal(sandbox, run_id)
        process = 1 if latest is None else latest.process + 1
    handle = JournalHandle(
        ref, JournalPaths(ref.journal_dir, run_id, process), check_nonce(nonce or new_nonce())
    )
    paths = handle.paths
    environment = env_file(env)
    framed = b"%s\n%d\n%s%s" % (handle.nonce.encode(), len(environment), environment, prompt)
    prepared = sandbox.exec(prepare_argv(paths), stdin=framed, timeout=60)
    if prepared.exit_code == JOURNAL_EXISTS_EXIT:
        raise JournalExistsError(run_id=run_id, reason="journal-exists", journal=paths.journal)
    if prepared.exit_code == JOURNAL_DISARMED_EXIT:
        # Made here, then disarmed before the nonce was written (this prepare was
        # stopped in between): no writer of it may start, as if it were made before.
        raise JournalExistsError(run_id=run_id, reason="journal-disarmed", journal=paths.journal)
    if prepared.exit_code != 0:
        raise JournalError(
            "cannot prepare the journal: " + prepared.stderr.decode(errors="replace")[:500],
            run_id=run_id,
            reason="prepare-failed",
        )
    if after_prepare is not None and after_prepare():
        log.warning("journal.start_skipped", run_id=run_id, journal_key=handle.journal_key)
        return handle
    launch = sandbox.launch(paths, command)
    code = launch.code
    if disk_max_bytes is not None:
        code = watched_launch(
            code, ref.workspace, paths, disk_max_bytes, stop=launch.stop, members=launch.members
        )
    writer = writer_argv(
        paths,
        code,
        journal_max_bytes=ref.spec.journal_max_bytes,
        after_exit=launch.after_exit,
    )
    sandbox.start_detached(writer)
    log.info("journal.spawned", run_id=run_id, journal_key=handle.journal_key)
    return handle


def claim_journal(sandbox: Sandbox, paths: JournalPaths) -> bool:
    """Make the journal of an agent process that must never start, before its prepare:
    True when this made it (every later prepare refuses, so no writer of it can ever
    run), False when it was made before (a prepare came first: ``never_started`` says
    whether a writer ran). Raises ``JournalError`` when it cannot be made."""
    done = sandbox.exec(claim_argv(paths), timeout=30)
    if done.exit_code == 0:
        return True
    if done.exit_code == JOURNAL_EXISTS_EXIT:
        return False
    raise JournalError(
        "cannot claim the journal of an agent process that must not start",
        run_id=paths.run_id,
        reason="claim-failed",
        journal=paths.journal,
    )


def disarm(sandbox: Sandbox, paths: JournalPaths) -> bool:
    """Replace the nonce file with an empty one made exclusively, so that a writer that
    has not read it yet exits before the agent, and a prepare that has not written it
    yet fails (``journal.disarm_argv``); True once that empty file is made.

    False when the nonce is still there or anything else holds its path (``rm``
    refused: an immutable file, a directory the sandbox's host may not write, a failing
    disk; or a prepare wrote it in between): a writer not started yet can still read it
    and start the agent, so the journal is never one that cannot start.
    """
    done = sandbox.exec(disarm_argv(paths), timeout=30)
    if done.exit_code != 0:
        log.warning("journal.disarm_failed", run_id=paths.run_id, nonce_file=paths.nonce_file)
        return False
    return True


def never_started(sandbox: Sandbox, paths: JournalPaths) -> bool:
    """True when the journal's writer never started and never can: its lock file is
    missing, then the process is disarmed (its nonce file is gone), then its lock file
    is found missing still. A disarm that leaves the nonce file answers False: a writer
    that starts later can still read it.

    The writer creates the lock file, takes the lock, then reads and removes the nonce
    file, and only then starts the agent (``journal.writer_argv``). The nonce file is
    replaced by an empty one first, here; a lock file still missing after that means
    that no writer had reached its nonce read when the nonce went, so every writer of
    this journal, started now or later, finds no nonce and exits before the agent. The
    empty file also keeps a prepare stopped before its nonce's write from writing it
    when it goes on (it fails, ``JOURNAL_DISARMED_EXIT``). The check is the other way
    round a race: a writer that creates the lock file just before the probe (it will
    find no nonce) answers False, and the caller treats the process as started.
    Only for a journal nothing was read from (a writer that ran made its lock file).
    """
    if not _lock_missing(sandbox, paths):
        return False  # a writer got that far: never disarm one that may be reading its nonce
    if not disarm(sandbox, paths):
        return False
    return _lock_missing(sandbox, paths)


def _lock_missing(sandbox: Sandbox, paths: JournalPaths) -> bool:
    return bool(sandbox.exec(liveness_argv(paths), timeout=30).exit_code == LIVENESS_NOT_STARTED)


def disk_verdict(sandbox: Sandbox, paths: JournalPaths) -> DiskVerdict | None:
    """Why the disk watcher stopped the agent, or None when it did not (or the sandbox
    cannot say: the run then fails with the agent's exit alone)."""
    try:
        return parse_verdict(sandbox.exec(tail_argv(paths.limit_file, 4096), timeout=30).stdout)
    except SandboxError:
        return None


def stderr_tail(sandbox: Sandbox, paths: JournalPaths, max_bytes: int = STDERR_TAIL_BYTES) -> bytes:
    """The last bytes of the agent's stderr; empty when unreadable (never fails a run)."""
    try:
        return sandbox.exec(tail_argv(paths.stderr, max_bytes), timeout=30).stdout
    except SandboxError:
        return b""
