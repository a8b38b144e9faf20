"""Where a run's agent processes live, and the plumbing that keeps that record.

The placement record (``runs.sandbox_ref``) names the run's sandbox and, in
order, the journal of each agent process started for the run. The owner writes
it before anything runs where it points, so a successor always finds what it
must replay. It also holds the one decision the journal bytes cannot tell: that
an agent process was given up (``lost``, and why). That decision is recorded
before the process's interruption marks are appended, so every replay re-issues
exactly the marks clients saw, and nothing after them.

Each journal also records the line cap (``max_line_bytes``) its lines are read
with, so that a successor cuts an over-long line exactly where the live read did,
whatever ``TURNKEEPER_MAX_LINE_BYTES`` its own worker has; a journal recorded
without one is read with no cap, as it was when it ran.

Every call to the sandbox here is retried while its host cannot be reached
(``resilience.sandbox_retry_policy``): ``resume`` answers None only when the
provider says the sandbox is gone, never because the link is down.

The record also names the host that made the sandbox (``host``): a ``local`` or
``bwrap`` sandbox is on that host's disk, so only that host resumes it, spawns in it
and destroys it, unless the sandboxes dir is shared, when any host may read it
(``hosts.can_read``, ``hosts.can_spawn``; docs/architecture.md, "Hosts"). Elsewhere
the sandbox is not there: ``resume`` answers None, as for a sandbox that is gone.

A run of a named session starts in its session's workspace (docs/architecture.md,
"Session workspaces"): the sandbox the session's previous run recorded, when this host
can use it, else a fresh one, and then the placement says why (``fresh_workspace``)
so that the run's log says so too. The record that names the run's sandbox names it
as the session's workspace in the same write; such a sandbox outlives the run (its
processes are stopped at a cancel, its journal files removed once it settled).

Every sentinel nonce the driver needs is looked up here (``nonce_of``,
``sentinel_of``): a random one per agent process, drawn when its journal is planned
and kept in the record next to the journal's handle, so a successor reads it there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from turnkeeper import hosts
from turnkeeper.config import Settings
from turnkeeper.driver.ownership import Ownership
from turnkeeper.driver.resilience import is_transport_error, sandbox_retry_policy
from turnkeeper.errors import JournalError, JournalExistsError, SandboxError
from turnkeeper.sandbox import (
    AgentCommand,
    JournalHandle,
    JournalPaths,
    Sandbox,
    SandboxProvider,
    SandboxRef,
    SandboxSpec,
    exit_sentinel_line,
    new_nonce,
    spawn_journaled,
)
from turnkeeper.sandbox.journal import exists_argv, remove_argv
from turnkeeper.sandbox.runner import claim_journal, disarm, never_started
from turnkeeper.store.records import Claim, Run
from turnkeeper.store.store import Store

log = structlog.get_logger(__name__)

LOST_WORKSPACE = "lost"
"""The session's workspace is gone (removed, or destroyed with a cancelled run's)."""
EXPIRED_WORKSPACE = "expired"
"""The reaper destroyed it after the session was idle for ``TURNKEEPER_SESSION_TTL``."""
UNREACHABLE_WORKSPACE = "unreachable"
"""It is on another host's disk, or of another sandbox provider than this run's."""
FRESH_WORKSPACE_REASONS = (LOST_WORKSPACE, EXPIRED_WORKSPACE, UNREACHABLE_WORKSPACE)

NEVER_STARTED = "never-started"
"""The ``lost`` reason of a journal whose writer provably never started (and never
will: disarmed): no agent process ran, so it makes no mark, counts no continuation,
and the run starts afresh in the next journal."""


@dataclass(frozen=True, slots=True)
class PlacedJournal:
    """One agent process of the run: its journal, why it was given up, if it was, and
    the line cap its lines are read with."""

    handle: JournalHandle
    lost: str | None = None
    max_line_bytes: int | None = None

    @property
    def journal_key(self) -> str:
        return self.handle.journal_key

    @property
    def given_up(self) -> bool:
        """An agent process ran here and was given up: its output ends in interruption
        marks and the run goes on as a continuation."""
        return self.lost is not None and self.lost != NEVER_STARTED

    def to_dict(self) -> dict[str, Any]:
        data = self.handle.to_dict()
        if self.lost is not None:
            data["lost"] = self.lost
        if self.max_line_bytes is not None:
            data["max_line_bytes"] = self.max_line_bytes
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlacedJournal:
        lost = data.get("lost")
        cap = data.get("max_line_bytes")
        return cls(
            JournalHandle.from_dict(data),
            str(lost) if lost is not None else None,
            int(cap) if cap is not None else None,
        )


@dataclass
class Placement:
    """The run's sandbox, the host that made it, and its agent processes' journals, in
    the order they ran."""

    sandbox: SandboxRef | None = None
    journals: list[PlacedJournal] = field(default_factory=list)
    host: str | None = None
    """The host (``TURNKEEPER_HOST_ID``) whose worker made ``sandbox``."""
    fresh_workspace: str | None = None
    """Why the run started in a fresh workspace although its session had one
    (``FRESH_WORKSPACE_REASONS``); recorded with the first journal, before the chunk
    that tells clients so."""

    @classmethod
    def of(cls, run: Run) -> Placement:
        data = run.sandbox_ref or {}
        sandbox = SandboxRef.from_dict(data["sandbox"]) if data.get("sandbox") else None
        host = data.get("host")
        fresh = data.get("fresh_workspace")
        return cls(
            sandbox=sandbox,
            journals=[PlacedJournal.from_dict(j) for j in data.get("journals", [])],
            host=str(host) if host is not None else None,
            fresh_workspace=str(fresh) if fresh is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "sandbox": self.sandbox.to_dict() if self.sandbox else None,
            "journals": [j.to_dict() for j in self.journals],
            "host": self.host,
        }
        if self.fresh_workspace is not None:
            data["fresh_workspace"] = self.fresh_workspace
        return data

    @property
    def last(self) -> PlacedJournal | None:
        return self.journals[-1] if self.journals else None

    @property
    def continuations(self) -> int:
        """Agent processes started after the first one was lost (a journal that never
        started is no process)."""
        started = sum(1 for journal in self.journals if journal.lost != NEVER_STARTED)
        return max(0, started - 1)


def process_index(journals: list[PlacedJournal], index: int) -> int:
    """The agent process that journal ``index`` ran, counting from 0: the number its
    interruption marks carry, the same whether journals that never started came before."""
    return sum(1 for journal in journals[:index] if journal.lost != NEVER_STARTED)


def nonce_of(journal: PlacedJournal) -> str:
    """The sentinel nonce of one agent process's journal."""
    return journal.handle.nonce


def sentinel_of(journal: PlacedJournal, exit_code: int) -> bytes:
    """The exact sentinel line that journal ends with when its agent exits with ``exit_code``."""
    return exit_sentinel_line(exit_code, nonce_of(journal))


class Placer:
    """An attempt's hands on its sandbox: every change to the placement is recorded,
    fenced by the attempt, before it takes effect.

    Two providers: the one that made the run's sandbox, by its name, to resume it,
    follow its journal, stop or destroy it (whatever this worker's own configuration:
    reading a jail leaves nobody out of it); and the one the run starts processes in,
    asked for only when a process is to start (``start_provider``), since that is where
    a worker may refuse it (docs/architecture.md, "What a takeover needs of its
    worker")."""

    def __init__(
        self,
        start_provider: Callable[[], SandboxProvider],
        store: Store,
        ownership: Ownership,
        claim: Claim,
        placement: Placement,
        *,
        provider_named: Callable[[str], SandboxProvider],
        spec: SandboxSpec,
        settings: Settings,
        max_line_bytes: int | None = None,
        workspace_of: str | None = None,
    ) -> None:
        """``start_provider``: the provider the run starts its processes in, checked
        against this worker's (it raises when the worker refuses it); ``provider_named``:
        this worker's provider of a name, to act on a sandbox that exists.
        ``workspace_of``: the session whose workspace the run uses (None: the run's
        sandbox is its own, destroyed once it settled)."""
        self.workspace_of = workspace_of
        self._start_provider = start_provider
        self._started_in: SandboxProvider | None = None
        self._provider_named = provider_named
        self.store = store
        self.ownership = ownership
        self.claim = claim
        self.placement = placement
        self.spec = spec
        self.settings = settings
        self.max_line_bytes = max_line_bytes
        self.recorded_fresh_workspace = placement.fresh_workspace
        """``fresh_workspace`` as Postgres holds it: what the run's log may say."""
        self._link = sandbox_retry_policy()

    @property
    def journals(self) -> list[PlacedJournal]:
        return self.placement.journals

    def start_provider(self) -> SandboxProvider:
        """The provider new sandboxes are made and agent processes started in: asked of
        the worker on first use, so that a takeover which starts nothing never asks."""
        if self._started_in is None:
            self._started_in = self._start_provider()
        return self._started_in

    def _provider_of(self, ref: SandboxRef) -> SandboxProvider:
        return self._provider_named(ref.provider)

    # --- sandboxes ------------------------------------------------------------------

    def resume(self) -> Sandbox | None:
        """The run's sandbox, or None when it is known to be gone, or is not on this host
        (another host's disk, and no shared sandboxes dir)."""
        ref = self.placement.sandbox
        if ref is None or not hosts.can_read(ref.provider, self.placement.host, self.settings):
            return None
        return self._link(self._provider_of(ref).resume, ref)

    def resume_or_create(self) -> Sandbox:
        """The sandbox to start the next agent process in: the run's own when this host
        made it in the provider this worker starts the run in, else a new one here
        (another host's cgroup and uid are not ours, and a weaker jail than this worker's
        starts nothing). A session's run with no sandbox yet starts in its session's
        workspace."""
        ref = self.placement.sandbox
        if ref is None and self.workspace_of is not None:
            return self._session_workspace(self.workspace_of)
        return self.recorded_to_start_in() or self._create()

    def recorded_to_start_in(self) -> Sandbox | None:
        """The run's recorded sandbox when the next agent process may start in it (made
        here, by the provider this worker starts the run in, and not gone); else None."""
        ref = self.placement.sandbox
        if ref is None or not self._can_start_in(ref):
            return None
        return self.resume()

    def _session_workspace(self, session_id: str) -> Sandbox:
        """The session's workspace when this worker can use it, stopped first (whatever
        an earlier run left running there is no run's any more: only one run of a
        session runs at a time); else a fresh one, and the placement says why."""
        workspace = self.store.session_workspace(session_id)
        if workspace is None:
            return self._create()  # the session's first run
        reason = workspace.gone or LOST_WORKSPACE
        if workspace.sandbox is not None:
            ref = SandboxRef.from_dict(workspace.sandbox)
            provider = self.start_provider()
            usable = ref.provider == provider.name and hosts.can_spawn(
                ref.provider, workspace.host, self.settings
            )
            sandbox = self._link(provider.resume, ref) if usable else None
            if sandbox is not None:
                self._link(provider.stop, ref)
                self.placement = Placement(ref, list(self.placement.journals), workspace.host)
                log.info("workspace.resumed", run_id=self.claim.run_id, sandbox=ref.id)
                return sandbox
            reason = LOST_WORKSPACE if usable else UNREACHABLE_WORKSPACE
        sandbox = self._create()
        self.placement.fresh_workspace = reason
        log.info("workspace.fresh", run_id=self.claim.run_id, reason=reason)
        return sandbox

    def _here(self, ref: SandboxRef) -> bool:
        return hosts.can_spawn(ref.provider, self.placement.host, self.settings)

    def _can_start_in(self, ref: SandboxRef) -> bool:
        return self._here(ref) and ref.provider == self.start_provider().name

    def owns(self, sandbox: Sandbox) -> bool:
        """Whether this worker may start processes in ``sandbox`` (see ``resume_or_create``)."""
        ref = self.placement.sandbox
        return ref is not None and ref.id == sandbox.ref.id and self._can_start_in(ref)

    def _create(self) -> Sandbox:
        provider = self.start_provider()
        # A retry after a lost reply makes a second directory: an orphan for the reaper.
        ref = self._link(provider.create, self.claim.run_id, self.spec)
        # Recorded with the first journal, before anything runs in it; a crash before
        # that leaves an empty orphan for the reaper.
        self.placement = Placement(
            ref,
            list(self.placement.journals),
            self.settings.host_id,
            fresh_workspace=self.placement.fresh_workspace,
        )
        sandbox = self._link(provider.resume, ref)
        assert sandbox is not None  # noqa: S101 - just created
        return sandbox

    def destroy(self) -> None:
        """Destroy the run's sandbox, when this host can: another host's sandbox is
        destroyed by that host's reap once the run is settled (its processes are not
        this host's to signal)."""
        ref = self.placement.sandbox
        if ref is None:
            return
        if not self._here(ref):
            log.info("sandbox.destroy_deferred", run_id=self.claim.run_id, host=self.placement.host)
            return
        self._link(self._provider_of(ref).destroy, ref)

    def stop(self) -> None:
        """End the run's agent (a cancel, a deadline): a session's workspace keeps its
        files, any other sandbox is destroyed."""
        ref = self.placement.sandbox
        if self.workspace_of is None or ref is None:
            self.destroy()
        elif self._here(ref):
            self._link(self._provider_of(ref).stop, ref)

    def end_processes(self, journal: PlacedJournal) -> None:
        """Kill every process of the sandbox ``journal`` ran in, before another agent
        process of the run is recorded or started (docs/architecture.md, "A loss seen
        late"). The sandbox may be gone: a provider calls it gone when its directory is,
        and removing a directory kills nothing, so the provider's ``stop`` finds its
        processes by handles that outlive the directory.

        Raises ``SandboxError`` (``lost-agent-survived``) when the kill cannot be shown to
        have worked: the run fails rather than run a second agent beside the first. A
        sandbox of another host is left to that host (a host judged dead, whose
        processes are not this kernel's to signal), and so is one the placement no
        longer names (a host recorded only for the current sandbox)."""
        ref = journal.handle.ref
        current = self.placement.sandbox
        if current is None or current.id != ref.id or not self._here(ref):
            log.warning("sandbox.lost_not_ended", run_id=self.claim.run_id, sandbox=ref.id)
            return
        try:
            self._link(self._provider_of(ref).stop, ref)
        except SandboxError as exc:
            if is_transport_error(exc):
                raise
            raise SandboxError(
                "the processes of a lost agent process could not be shown dead, so no "
                f"other agent process may start for the run: {exc.message}",
                run_id=self.claim.run_id,
                attempt_id=self.claim.attempt_id,
                epoch=self.claim.epoch,
                reason="lost-agent-survived",
                sandbox=ref.id,
            ) from exc
        log.info("sandbox.lost_ended", run_id=self.claim.run_id, sandbox=ref.id)

    def settled(self) -> None:
        """The run settled: its own sandbox is destroyed; in a session's workspace only
        its journal files go (the segments hold every byte; nothing reads them again)."""
        ref = self.placement.sandbox
        if self.workspace_of is None or ref is None:
            self.destroy()
            return
        sandbox = self.resume() if self._here(ref) else None
        if sandbox is None:
            return
        for journal in self.placement.journals:
            if journal.handle.ref.id == ref.id:
                self._link(sandbox.exec, remove_argv(journal.handle.paths), timeout=30)

    # --- journals ---------------------------------------------------------------------

    def new_journal(self, sandbox: Sandbox) -> PlacedJournal:
        """The next agent process's journal, recorded before the process starts."""
        journal = self._next_journal(sandbox)
        self.placement.journals.append(journal)
        self._record()
        return journal

    def give_up(self, reason: str, *, continue_in: Sandbox | None) -> PlacedJournal | None:
        """Record that the current agent process is lost (``reason``) and, with
        ``continue_in``, the journal of the process that continues the run: one write,
        so a successor finds either both decisions or neither."""
        last = self.placement.journals[-1]
        self.placement.journals[-1] = PlacedJournal(last.handle, reason, last.max_line_bytes)
        journal = None if continue_in is None else self._next_journal(continue_in)
        if journal is not None:
            self.placement.journals.append(journal)
        self._record()
        log.info(
            "journal.given_up",
            run_id=self.claim.run_id,
            reason=reason,
            continued=journal is not None,
        )
        return journal

    def journal_exists(self, sandbox: Sandbox, journal: PlacedJournal) -> bool:
        result = self._link(sandbox.exec, exists_argv(journal.handle.paths), timeout=30)
        return bool(result.exit_code == 0)

    def disarm(self, journal: PlacedJournal) -> None:
        """A writer that never started must never start later (a frozen predecessor may
        still be about to launch it): without its nonce file it exits before the agent.

        Raises ``JournalError`` (``disarm-failed``) when the nonce file stays: the run
        gives the process up only to start another, and two agents would then run."""
        sandbox = self.resume()
        if sandbox is not None and not self._link(disarm, sandbox, journal.handle.paths):
            raise JournalError(
                "cannot remove the nonce file of a journal whose writer has not started: "
                "that writer may still start the agent, so no other agent process may "
                "start for the run",
                run_id=self.claim.run_id,
                attempt_id=self.claim.attempt_id,
                epoch=self.claim.epoch,
                reason="disarm-failed",
                journal=journal.journal_key,
            )

    def claim_unstarted(self, journal: PlacedJournal) -> bool | None:
        """Make sure that no agent of ``journal``, recorded and never seen started, runs
        beside the one about to start in another journal (docs/architecture.md, "Journals
        that never started"): its owner may have stopped between its last renewal and
        its prepare, and may still go on. In its own sandbox the journal is made first
        (``claim_journal``), so a late prepare finds it and refuses; a journal made
        before is disarmed (``never_started``). Then the sandbox's processes are ended.

        True: no writer of it ever ran or ever will. False: a writer got past its lock,
        and its agent is the run's (to follow, not to end). None: its sandbox is gone or
        not readable here, so nothing can be claimed; its processes are ended by what
        survives the directory (``end_processes``: an agent started in a sandbox removed
        before the start was recorded), unless they are another host's."""
        sandbox = self.resume()
        if sandbox is None:
            self.end_processes(journal)
            return None
        paths = journal.handle.paths
        claimed = self._link(claim_journal, sandbox, paths) or self.never_started(sandbox, journal)
        log.info(
            "journal.claimed",
            run_id=self.claim.run_id,
            journal=journal.journal_key,
            claimed=claimed,
        )
        if claimed:
            self.end_processes(journal)
        return claimed

    def never_started(self, sandbox: Sandbox, journal: PlacedJournal) -> bool:
        """Disarm the journal, then True when its writer never took the lock
        (``runner.never_started``): no agent ran there, nor ever will."""
        return bool(self._link(never_started, sandbox, journal.handle.paths))

    def restart(self, sandbox: Sandbox) -> PlacedJournal:
        """Record that the current journal never started (disarmed, ``never_started``
        True) and the journal that starts the process afresh: one write."""
        last = self.placement.journals[-1]
        self.placement.journals[-1] = PlacedJournal(last.handle, NEVER_STARTED, last.max_line_bytes)
        journal = self._next_journal(sandbox)
        self.placement.journals.append(journal)
        self._record()
        log.info("journal.never_started", run_id=self.claim.run_id, journal=last.journal_key)
        return journal

    def spawn(
        self,
        sandbox: Sandbox,
        journal: PlacedJournal,
        command: AgentCommand,
        prompt: bytes,
        *,
        after_prepare: Callable[[], bool] | None = None,
    ) -> bool:
        """Start the journal's agent process; False when its journal was made before
        (a retry whose first try's reply was lost, or a predecessor's)."""
        try:
            # A retry of a start whose reply was lost finds the journal: started before.
            self._link(
                spawn_journaled,
                sandbox,
                self.claim.run_id,
                command,
                prompt=prompt,
                process=journal.handle.paths.process,
                nonce=nonce_of(journal),
                disk_max_bytes=self.settings.sandbox_disk,
                after_prepare=after_prepare,
            )
        except JournalExistsError:
            log.info(
                "journal.already_started",
                run_id=self.claim.run_id,
                journal=journal.journal_key,
            )
            return False
        return True

    def nonce(self, journal: PlacedJournal) -> str:
        return nonce_of(journal)

    def sentinel(self, journal: PlacedJournal, exit_code: int) -> bytes:
        return sentinel_of(journal, exit_code)

    def _next_journal(self, sandbox: Sandbox) -> PlacedJournal:
        process = 1 + sum(1 for j in self.placement.journals if j.handle.ref.id == sandbox.ref.id)
        paths = JournalPaths(sandbox.ref.journal_dir, self.claim.run_id, process)
        # The nonce is drawn here, recorded before the process starts.
        return PlacedJournal(
            JournalHandle(sandbox.ref, paths, new_nonce()), max_line_bytes=self.max_line_bytes
        )

    def _record(self) -> None:
        self.ownership.check()
        recorded = self.store.record_sandbox(
            self.claim, self.placement.to_dict(), keeps_workspace=self.workspace_of is not None
        )
        self.ownership.confirm(recorded)
        self.recorded_fresh_workspace = self.placement.fresh_workspace
