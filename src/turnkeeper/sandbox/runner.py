"""Starting an agent journaled, finding a run's journals, and opening a reader on one.

``spawn_journaled`` creates the agent process's journal exclusively (a second start
under the same number fails instead of appending behind an old sentinel), hands the
writer its nonce through a file it deletes before the agent starts (never argv or
environment, which the agent could read), then starts the writer detached and
returns without waiting for it or reading its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from turnkeeper.errors import JournalError, JournalExistsError, SandboxError
from turnkeeper.sandbox.codec import encode_run_id, parse_journal_name
from turnkeeper.sandbox.journal import (
    JOURNAL_EXISTS_EXIT,
    AgentLimits,
    JournalPaths,
    list_argv,
    prepare_argv,
    sentinel_nonce,
    writer_argv,
)
from turnkeeper.sandbox.provider import Sandbox, SandboxRef

log = structlog.get_logger(__name__)


def nonce_for(ref: SandboxRef, run_id: str, secret: str | None) -> str:
    """The sentinel nonce of a run's journals in the sandbox ``ref``."""
    return sentinel_nonce(run_id, secret=secret, sandbox_id=ref.id)


def journal_key(ref: SandboxRef, paths: JournalPaths) -> str:
    """A string naming one agent process's journal, unique across sandboxes."""
    return f"{ref.provider}:{ref.id}:{encode_run_id(paths.run_id)}.{paths.process}"


@dataclass(frozen=True, slots=True)
class JournalHandle:
    """Where a journaled agent process writes; JSON-serializable for the run store."""

    ref: SandboxRef
    paths: JournalPaths

    @property
    def journal_key(self) -> str:
        return journal_key(self.ref, self.paths)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref.to_dict(),
            "run_id": self.paths.run_id,
            "process": self.paths.process,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JournalHandle:
        ref = SandboxRef.from_dict(data["ref"])
        return cls(ref, JournalPaths(ref.journal_dir, str(data["run_id"]), int(data["process"])))


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
    command: str | Sequence[str],
    *,
    secret: str | None = None,
    stdin: bytes = b"",
    process: int | None = None,
) -> JournalHandle:
    """Start ``command`` detached with its output journaled; returns without waiting.

    ``process`` defaults to one past the run's latest journal. Limits come from the
    sandbox spec (journal size, CPU seconds, memory).
    """
    ref = sandbox.ref
    if process is None:
        latest = latest_journal(sandbox, run_id)
        process = 1 if latest is None else latest.process + 1
    paths = JournalPaths(ref.journal_dir, run_id, process)
    nonce = nonce_for(ref, run_id, secret)
    prepared = sandbox.exec(prepare_argv(paths), stdin=nonce.encode() + b"\n" + stdin, timeout=60)
    if prepared.exit_code == JOURNAL_EXISTS_EXIT:
        raise JournalExistsError(run_id=run_id, reason="journal-exists", journal=paths.journal)
    if prepared.exit_code != 0:
        raise JournalError(
            "cannot prepare the journal: " + prepared.stderr.decode(errors="replace")[:500],
            run_id=run_id,
            reason="prepare-failed",
        )
    limits = AgentLimits(
        journal_max_bytes=ref.spec.journal_max_bytes,
        cpu_seconds=ref.spec.cpu_seconds,
        memory_bytes=ref.spec.memory_bytes,
    )
    sandbox.start_detached(writer_argv(paths, command, limits))
    handle = JournalHandle(ref, paths)
    log.info("journal.spawned", run_id=run_id, journal_key=handle.journal_key)
    return handle
