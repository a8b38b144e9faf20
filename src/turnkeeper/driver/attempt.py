"""One attempt's drive of a run: a fresh turn, or the takeover of a run whose owner
died or froze.

The output of a run is a pure function of what Postgres holds (``replay``): a
fresh attempt produces it live; a successor reproduces it from byte 0 (from the
living journal, or from the segments when the sandbox is gone) and the aligner
suppresses what clients already have. The takeover path, in reading order:
``reconciler.reconcile`` hands the run over; ``take_over`` below adopts it (the
attempt counts from here) and fences the log; ``Attempt.drive`` classifies what
survived and replays it (``replay``); ``RunOutput.emit`` aligns it
(``log.alignment``) and appends the rest.

A journal whose writer provably never started (disarmed, then no lock) is no agent
process: the run starts afresh in the next journal, with no mark. An agent process
that is lost (its sandbox gone, dead without a sentinel, silent) is given up, and
the run goes on in a new process when the agent can continue, at most
``max_continuations`` times, in a loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from turnkeeper.agents.spec import PERMISSIONS_OFF, AgentSpec, safe_session_id
from turnkeeper.chunks import Chunk
from turnkeeper.driver import lifecycle
from turnkeeper.driver.conversation import FollowUp
from turnkeeper.driver.ending import end_log
from turnkeeper.driver.feed import JournalFeed
from turnkeeper.driver.output import RunOutput
from turnkeeper.driver.ownership import Ownership
from turnkeeper.driver.placement import PlacedJournal, Placement, Placer, process_index
from turnkeeper.driver.record import TurnRecorder
from turnkeeper.driver.recovery import Recovery, RecoveryFacts, classify
from turnkeeper.driver.replay import (
    Line,
    Replay,
    StoredJournal,
    batches,
    stored_exit,
    with_newlines,
)
from turnkeeper.driver.resilience import (
    SERVICE_RETRY_BUDGET,
    is_transport_error,
    resilient,
    sandbox_retry_policy,
)
from turnkeeper.errors import (
    AgentError,
    AgentVanishedError,
    JournalError,
    JournalStalledError,
    OwnershipLostError,
    RecoveryError,
    SandboxError,
    SandboxUnreachableError,
    ServiceError,
    TurnkeeperError,
)
from turnkeeper.sandbox import AgentCommand, JournalReader, Sandbox, SandboxSpec, stderr_tail
from turnkeeper.sandbox.command import MAX_ARGUMENT_BYTES
from turnkeeper.sandbox.lines import ReadPoint
from turnkeeper.sandbox.runner import disk_verdict
from turnkeeper.store.records import BegunRun, Claim, Run, RunStatus, Verdict
from turnkeeper.workers.failpoints import failpoint
from turnkeeper.workers.lease import LeaseKeeper
from turnkeeper.workers.starts import StartSlot

if TYPE_CHECKING:  # the runtime builds on the driver's stored log
    from turnkeeper.workers.runtime import WorkerRuntime

log = structlog.get_logger(__name__)

_WAKE = 0.25
START_SETTLE_SECONDS = 1.0  # a start slot's longest hold once the agent is spawned
_REPLAY_BATCH = 512
_DEADLINE = "the run passed its deadline"
_MEMORY_LIMIT = "the agent passed its memory limit and was killed"
KILLED = 128 + 9  # the exit status of a process killed by SIGKILL (the OOM killer's signal)
_LOST = {
    "agent-vanished": "the agent process ended without an exit sentinel",
    "journal-stalled": "the agent wrote nothing to its journal in time",
    "sandbox-lost": "the sandbox was lost mid-run and this agent cannot continue",
}


# --- entry: a fresh claim, or a takeover ----------------------------------------------


def run_turn(runtime: WorkerRuntime, run_id: str) -> bool:
    """Claim a queued run and drive it; False when it was not ours to claim."""
    begun = runtime.store.claim_and_begin(run_id, runtime.owner, runtime.settings.lease_ttl)
    if begun is None:
        log.info("run.claim_skipped", run_id=run_id)
        return False
    _own(runtime, begun.claim, begun=begun)
    return True


def take_over(runtime: WorkerRuntime, run_id: str, attempt_id: str, epoch: int) -> bool:
    """Adopt the attempt the reconciler handed ``run_id`` to, and drive it.

    The adoption is a compare-and-set on ``attempt_id`` in the store: the attempt's
    lease starts and it counts only now, so the time the message waited for a free
    slot cost nothing. False when it was not ours: another delivery of the same
    message adopted it, or the run moved on (settled, cancelled, handed over again).
    """
    lease_ttl = runtime.settings.lease_ttl
    claim = runtime.store.adopt_attempt(run_id, attempt_id, runtime.owner, lease_ttl)
    if claim is None:
        log.info("takeover.not_adopted", run_id=run_id, attempt_id=attempt_id, epoch=epoch)
        return False
    _own(runtime, claim)
    return True


def _own(runtime: WorkerRuntime, claim: Claim, *, begun: BegunRun | None = None) -> None:
    """Drive the run ``claim`` owns: a fresh run when ``begun`` (its claim), a takeover
    otherwise."""
    settings = runtime.settings
    bound = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)
    keeper = runtime.lease_keeper(claim).start()
    ownership = Ownership(runtime.store, claim, keeper.lost, settings.lease_ttl)
    # While this process lives and drives the run, it holds the run's owner lock: its
    # death hands the run over at once (docs/architecture.md, "Crash detection").
    owner_locks = runtime.owner_locks()
    if owner_locks is not None:
        owner_locks.hold(claim)
    try:
        # From here on, every append of an earlier attempt is refused by Redis itself.
        # Retried while the lease is held: a Redis down now must not cost the attempt.
        run_log = resilient(runtime.log, SERVICE_RETRY_BUDGET, until=keeper.lost)
        stored_epoch = run_log.fence(claim.run_id, claim.epoch)
        if begun is None:
            failpoint(settings, "adopted", claim.run_id)
        # A fresh claim read its run as it claimed it: a handover since (its lease ran
        # out already) shows in the stored epoch, or fences its first write.
        run = (
            begun.run
            if begun is not None
            else resilient(runtime.store, SERVICE_RETRY_BUDGET, until=keeper.lost).get_run(
                claim.run_id
            )
        )
        if stored_epoch > claim.epoch or run is None or run.attempt_id != claim.attempt_id:
            bound.info("takeover.superseded", stored_epoch=stored_epoch)
            return
        if begun is None:
            _record_log_position(runtime, claim, lambda: run_log.next_seq(claim.run_id))
        Attempt(runtime, claim, run, keeper, ownership, begun=begun).drive()
    except OwnershipLostError as exc:
        # Expected when a successor took over: stop writing, leave the sandbox to it.
        bound.info("attempt.stopped", reason=exc.reason)
    except ServiceError:
        # Retries ran out (a service, or the sandbox's link): not the run's failure. This
        # process lives on, so no crash handover comes: let the lease go, and the next
        # reconcile hands the run to a successor (else, when the lease runs out).
        keeper.stop()
        with suppress(TurnkeeperError):
            runtime.store.release_lease(claim, give_back_attempt=False)
        raise
    except TurnkeeperError as exc:
        if not ownership.held():
            bound.info("attempt.stopped", reason="lease-lost", error=str(exc))
            return
        _fail(runtime, claim, exc)
    finally:
        keeper.stop()
        if owner_locks is not None:
            owner_locks.release(claim)


def _record_log_position(runtime: WorkerRuntime, claim: Claim, next_seq: Callable[[], int]) -> None:
    """Where this takeover begins in the run log, for the run page's takeover mark: the
    log is fenced at this epoch and nothing of it is appended yet, so every chunk from
    ``next_seq()`` on is this attempt's. Best effort, the log's read included: a lost
    read or write loses only the mark, never the attempt."""
    try:
        runtime.store.record_attempt_log_seq(claim, next_seq())
    except TurnkeeperError as exc:
        log.warning("takeover.log_position_lost", run_id=claim.run_id, error=str(exc))


def _fail(runtime: WorkerRuntime, claim: Claim, exc: TurnkeeperError) -> None:
    """A failure that a successor could not fix (a diverged replay, a bad agent spec):
    settle the run failed, then end the log with the reason (``driver/ending.py``)."""
    reason = exc.reason or type(exc).__name__
    bound = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)
    bound.error("run.failed", reason=reason, error=str(exc))
    error = {"reason": reason, "message": exc.message}
    if runtime.store.settle_run(claim, RunStatus.FAILED, error) is Verdict.NOT_OWNER:
        bound.info("attempt.stopped", reason="store-fenced")
        return
    end_log(runtime.log, runtime.store, claim.run_id, claim.epoch)


# --- how an agent process's journal ended ------------------------------------------------


@dataclass(frozen=True)
class Exited:
    """The journal ended at its sentinel: the agent exited with ``exit_code``.
    ``sandbox``: where its stderr and limit counts are read, None when it is gone."""

    journal: PlacedJournal
    exit_code: int
    sentinel_end: int
    sandbox: Sandbox | None


@dataclass(frozen=True)
class Lost:
    """The agent process is lost (``reason``): give it up, then continue or fail."""

    reason: str


Ending = Exited | Lost | None
"""None: the run was settled on the way (cancelled, past its deadline)."""


class Attempt:
    def __init__(
        self,
        runtime: WorkerRuntime,
        claim: Claim,
        run: Run,
        keeper: LeaseKeeper,
        ownership: Ownership,
        *,
        begun: BegunRun | None = None,
    ) -> None:
        self.settings = runtime.settings
        self.begun = begun
        """The claim of a fresh run (None for a takeover): no attempt ran it before."""
        # Retried while the lease is held (``driver/resilience.py``).
        self.store = resilient(runtime.store, SERVICE_RETRY_BUDGET, until=keeper.lost)
        self.run_log = resilient(runtime.log, SERVICE_RETRY_BUDGET, until=keeper.lost)
        self.claim = claim
        self.run = run
        self.keeper = keeper
        self.ownership = ownership
        self.hand_over = runtime.hand_over
        self.start_slot = StartSlot(self.settings.start_concurrency, START_SETTLE_SECONDS)
        payload = run.payload if isinstance(run.payload, dict) else {}
        self.prompt = str(payload.get("prompt", ""))
        branch = payload.get("from_entry")
        self.from_entry = branch if isinstance(branch, str) else None
        self.spec = AgentSpec.from_payload(payload.get("agent", "scripted"))
        self._open_env = partial(runtime.agent_env, claim.run_id, payload, self.spec)
        self._env: dict[str, str] | None = None
        self.replay = Replay(claim.run_id, run.session_id, self.spec.format)
        # A fresh run's slot is the one its claim began (if any): nobody else wrote it.
        self.slot = begun.slot if begun is not None else self.store.get_turn_slot(claim.run_id)
        self.recorder = TurnRecorder(self.store, claim, run.session_id, ownership, self.slot)
        self.output = RunOutput(
            self.store, self.run_log, claim, ownership, first_attempt=begun is not None
        )
        self.place = Placer(
            partial(runtime.provider_to_run, payload.get("provider")),
            self.store,
            ownership,
            claim,
            Placement.of(run),
            provider_named=runtime.provider,
            spec=SandboxSpec(journal_max_bytes=self.settings.journal_max_bytes),
            settings=self.settings,
            max_line_bytes=self.settings.max_line_bytes,
            workspace_of=run.session_id if run.keeps_workspace else None,
        )
        self._workspace_announced = False
        self.facts: RecoveryFacts | None = None
        """What the takeover's classification saw (None for a fresh run)."""
        self.follow_up: FollowUp | None = None
        self.agent_prompt = self.prompt
        """What the agent is given: the prompt, or for an agent that recalls the
        transcript, the prompt with the conversation it follows up."""
        self._log = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)

    # --- entry ------------------------------------------------------------------------

    def drive(self) -> None:
        if self.begun is not None:
            action = Recovery.START
        else:
            self.facts = self._facts()
            action = classify(self.facts)
            self._log.info("takeover.classified", action=action.value)
            failpoint(self.settings, "classified", self.claim.run_id)
        self._emit(self.replay.started())
        if self.begun is not None and self.begun.slot is not None:
            self.recorder.input_recorded(self.begun.input_parent)
        else:
            self._check_branch()
            self.recorder.record_input(self.prompt, from_entry=self.from_entry)
        self.follow_up = FollowUp.of(self.store, self.run, self.recorder.input_parent)
        if self.follow_up is not None and self.spec.recalls_transcript:
            limit = MAX_ARGUMENT_BYTES if self.spec.prompt_as_argument else None
            self.agent_prompt = self.follow_up.prompt(self.prompt, max_bytes=limit)
        try:
            ending = self._recover(action)
            while isinstance(ending, Lost):
                ending = self._give_up(ending.reason)
        finally:  # a spawn that failed before its agent was followed holds one still
            self.start_slot.release()
        if isinstance(ending, Exited):
            self._finish(ending)

    def _recover(self, action: Recovery) -> Ending:
        steps: dict[Recovery, Callable[[], Ending]] = {
            Recovery.ABORT: self._abort_at_takeover,
            Recovery.START: self._start,
            Recovery.ATTACH: self._attach,
            Recovery.FINISH_FROM_SEGMENTS: self._finish_from_segments,
            Recovery.LOST: self._lost_at_takeover,
            Recovery.FAIL: self._fail_at_takeover,
        }
        return steps[action]()

    def _check_branch(self) -> None:
        """Refuse, before its input is recorded, a branch its agent cannot continue from
        now (docs/architecture.md, "Branches"). The submit checked it
        (``Client._check_branch``) outside the admission's session lock, so a message
        admitted in between may have run first and moved the leaf: of what the submit
        saw, whether the entry is still the leaf. An input already recorded was decided
        by an earlier attempt."""
        branch = self.from_entry
        if branch is None:
            return
        session_id = self.run.session_id
        stored, _ = self.store.entry_parent(session_id, self.recorder.input_entry_id)
        if stored:
            return
        entries = self.store.session_entries(session_id)
        entry = next((e for e in entries if e.entry_id == branch), None)
        writer = None if entry is None else self.store.get_run(entry.run_id)
        at_run_end = (
            entry is not None
            and writer is not None
            and writer.status.is_terminal
            and not any(e.parent_id == branch and e.run_id == entry.run_id for e in entries)
        )
        at_leaf = self.store.session_leaf(session_id) == branch
        refusal = self.spec.branch_refusal(at_run_end=at_run_end, at_leaf=at_leaf)
        if refusal is not None:
            raise AgentError(
                refusal,
                run_id=self.claim.run_id,
                attempt_id=self.claim.attempt_id,
                epoch=self.claim.epoch,
                reason="cannot-fork",
            )

    def _facts(self) -> RecoveryFacts:
        sandbox = self.place.resume()
        last = self.place.placement.last
        return RecoveryFacts(
            cancel_requested=self.run.cancel_requested_at is not None,
            journal_finished=last is not None
            and stored_exit(self.store, last.journal_key, self.place.nonce(last)) is not None,
            loss_recorded=last is not None and last.lost is not None,
            sandbox_alive=sandbox is not None,
            journal_present=sandbox is not None
            and last is not None
            and self.place.journal_exists(sandbox, last),
            journal_started=last is not None
            and (
                self.output.stored_end(last.journal_key) > 0
                or (self.slot is not None and self.slot.journal_key == last.journal_key)
            ),
        )

    # --- the recovery actions ----------------------------------------------------------

    def _start(self) -> Ending:
        """Spawn the agent: in the journal recorded for it when that journal is still
        unmade in the sandbox the agent starts in (the journal's exclusive create then
        keeps a late predecessor and this attempt to one agent), else in the next
        journal, once the recorded one is claimed so that its owner, should it go on
        late, starts nothing (``Placer.claim_unstarted``; docs/architecture.md, "Journals
        that never started")."""
        self._check_startable()
        journals = self.place.journals
        count = len(journals)
        last = journals[-1] if journals else None
        if last is None or last.lost is not None:
            sandbox = self.place.resume_or_create()
            self._replay_stored(count)
            command = self._command()
            journal = self.place.new_journal(sandbox)
            self._announce_workspace()
            return self._spawn(sandbox, journal, command)
        recorded = self.place.recorded_to_start_in()
        if (
            recorded is not None
            and last.handle.ref.id == recorded.ref.id
            and not self.place.journal_exists(recorded, last)
            and not self.output.stored_end(last.journal_key)
        ):
            self._replay_stored(count - 1)
            command = self._command()
            self._announce_workspace()
            return self._spawn(recorded, last, command)
        claimed = self.place.claim_unstarted(last)
        if claimed is False:  # its writer ran after all: follow it, as an attach does
            self._log.warning("takeover.reclassified", action="attach", reason="writer-started")
            return self._attach()
        sandbox = recorded or self.place.resume_or_create()
        self._replay_stored(count)
        command = self._command()
        # Proven never started: recorded so, it counts no process (``NEVER_STARTED``).
        journal = self.place.restart(sandbox) if claimed else self.place.new_journal(sandbox)
        self._announce_workspace()
        return self._spawn(sandbox, journal, command)

    def _attach(self) -> Ending:
        sandbox = self.place.resume()
        if sandbox is None:
            return self._gone_since_classified()
        *previous, current = self.place.journals
        self._replay_stored(len(previous))
        if self._never_started(sandbox, current):
            return self._restart(sandbox)
        self.recorder.provider_started(current.journal_key)
        return self._follow(sandbox, current)

    def _gone_since_classified(self) -> Ending:
        """The sandbox the classifier saw alive is gone by the attach (its host reaped it,
        an operator removed it): recover as the classifier does from the same facts with
        the sandbox gone, so that the run goes on exactly as when the loss is seen one
        step earlier (docs/architecture.md, "A loss seen late")."""
        assert self.facts is not None  # noqa: S101 - only a classified takeover attaches
        action = classify(replace(self.facts, sandbox_alive=False, journal_present=False))
        self._log.warning("takeover.reclassified", action=action.value, reason="sandbox-gone")
        return self._recover(action)

    def _finish_from_segments(self) -> Ending:
        """The journal's bytes all made it to the segments: replay them, run nothing."""
        journals = self.place.journals
        self._replay_stored(len(journals) - 1)
        last = journals[-1]
        stored = StoredJournal(
            self.store, last.journal_key, self.place.nonce(last), max_line_bytes=last.max_line_bytes
        )
        self._emit_replayed(stored)
        if stored.exit_code is None or stored.end is None:
            raise RecoveryError("the stored journal lost its sentinel", reason="no-sentinel")
        # The sandbox, when it is still there, says what the exit cannot: the agent's
        # stderr and the limits it hit, for the same error a crash-free run records.
        return Exited(last, stored.exit_code, stored.end, sandbox=self.place.resume())

    def _lost_at_takeover(self) -> Ending:
        """The current process's sandbox or journal is gone: keep what was captured."""
        self._replay_stored(len(self.place.journals))
        return Lost("sandbox-lost")

    def _fail_at_takeover(self) -> Ending:
        """A predecessor gave the process up and decided not to continue: finish that."""
        journals = self.place.journals
        self._replay_stored(len(journals))
        reason = journals[-1].lost
        assert reason is not None  # noqa: S101 - classified as a recorded loss
        self._fail_lost(reason)
        return None

    def _abort_at_takeover(self) -> Ending:
        """A cancel came before this takeover read the run: replay what was stored (its
        turns to the transcript), then abort. Ending the log adds what the replay does
        not make: the closing chunks of a journal whose sentinel was stored, before the
        final chunk (``driver/ending.py``)."""
        self._replay_stored(len(self.place.journals))
        self._abort()
        return None

    def _give_up(self, reason: str) -> Ending:
        """The current agent process is lost: record that (and the process that continues
        the run, when the agent can and the cap allows), then mark the interruption."""
        journals = self.place.journals
        index = len(journals) - 1
        self._log.warning("journal.lost", reason=reason, journal=index)
        if reason == "journal-stalled":
            sandbox_now = self.place.resume()
            if sandbox_now is not None and self._never_started(sandbox_now, journals[index]):
                return self._restart(sandbox_now)
            self.place.disarm(journals[index])
        # Its sandbox may be gone with the process alive in it (a directory removed
        # kills nothing): no other process is recorded or started until it is dead.
        self.place.end_processes(journals[index])
        go_on = (
            self.spec.can_continue
            and self.place.placement.continuations < self.settings.max_continuations
        )
        if go_on:
            self._check_startable()
        sandbox = self.place.resume_or_create() if go_on else None
        journal = self.place.give_up(reason, continue_in=sandbox)
        self._interrupt(process_index(journals, index))
        if sandbox is None or journal is None:
            self._fail_lost(reason)
            return None
        self._log.info("run.continuing", journal=index + 1)
        return self._spawn(sandbox, journal, self._command())

    def _fail_lost(self, reason: str) -> None:
        if self.spec.can_continue:
            code = "continuations-exhausted"
            message = (
                f"the agent process was lost ({reason}) after "
                f"{self.place.placement.continuations} continuation(s), the most "
                "TURNKEEPER_MAX_CONTINUATIONS allows"
            )
        else:
            code, message = reason, _LOST[reason]
        self._close_with(
            lifecycle.run_error(message, code),
            RunStatus.FAILED,
            {"reason": code, "message": message},
        )

    def _abort(self, status: RunStatus = RunStatus.ABORTED, error: Any = None) -> None:
        """Stop the agent and settle: cancelled by default, or a deadline passed. Then end
        the log with what the store holds and the final chunk the settled run's status
        and error call for (``driver/ending.py``)."""
        self.place.stop()
        self.ownership.check()
        cancelled = lifecycle.cancelled()
        self._settle(status, error or {"reason": "cancelled", "message": cancelled["message"]})
        end_log(self.run_log, self.store, self.claim.run_id, self.claim.epoch)

    # --- journals ---------------------------------------------------------------------

    def _command(self) -> AgentCommand:
        """The next agent process's command, with the run's env opened: a continuation
        once one was given up; in a follow-up, the command that resumes the agent's own
        conversation (docs/architecture.md, "Follow-ups")."""
        resumed = self.follow_up.agent_session_id if self.follow_up else None
        if any(journal.given_up for journal in self.place.journals):
            command = self.spec.continuation_command(
                session_id=self.replay.agent_session_id or resumed,
                start_turn=self.replay.turns_completed,
            )
        elif self.follow_up is not None:
            command = self.spec.follow_up_command(session_id=resumed)
        else:
            command = self.spec.start_command()
        return replace(command, env=self._agent_env())

    def _agent_env(self) -> dict[str, str]:
        """The agent's env: its sealed values opened, the worker's own values read
        (``WorkerRuntime.agent_env``), once, when a process is first started."""
        if self._env is None:
            self._env = self._open_env()
        return self._env

    def _check_startable(self) -> None:
        """Ask this worker for what starting an agent process takes (the agent's env
        values, the run's provider), before anything is made or recorded for the process.
        Lacking one fails the run, as it fails a fresh run here (``missing-env``,
        ``env-file``, ``provider-refused``): the operator's contract is that every worker
        has them. Only a start asks: an attach or a finish from segments starts nothing
        and goes on on any worker (docs/architecture.md, "What a takeover needs of its
        worker")."""
        self._agent_env()
        self.place.start_provider()

    def _spawn(self, sandbox: Sandbox, journal: PlacedJournal, command: AgentCommand) -> Ending:
        if not self._take_start_slot():
            return None
        failpoint(self.settings, "before-spawn", self.claim.run_id)
        self._confirm_lease()
        # The store said yes; a pause from here to the journal's prepare outlasts that.
        failpoint(self.settings, "lease-confirmed", self.claim.run_id)
        if self.spec.preset in PERMISSIONS_OFF and self.place.start_provider().name == "local":
            self._log.warning(
                "agent.unbounded",
                preset=self.spec.preset,
                message="the local provider is no security boundary, and this preset turns "
                "the agent's own permission checks off: its tools run as the worker's user",
            )
        started = self.place.spawn(
            sandbox,
            journal,
            command,
            self.agent_prompt.encode(),
            after_prepare=lambda: failpoint(self.settings, "after-prepare", self.claim.run_id),
        )
        # Its journal was made before (a retry, a predecessor): by a writer that ran?
        if not started and self._never_started(sandbox, journal):
            return self._restart(sandbox)
        failpoint(self.settings, "spawned", self.claim.run_id)
        self.recorder.provider_started(journal.journal_key)
        return self._follow(sandbox, journal)

    def _never_started(self, sandbox: Sandbox, journal: PlacedJournal) -> bool:
        """The journal's writer provably never started, and is disarmed so that it never
        will (``runner.never_started``; docs/architecture.md, "Journals that never
        started"). A journal with stored bytes had a writer."""
        if self.output.stored_end(journal.journal_key):
            return False
        return self.place.never_started(sandbox, journal)

    def _restart(self, sandbox: Sandbox) -> Ending:
        """No agent ran in the current journal: record that with the next journal (one
        write) and start the agent there as it would have started, no mark, no
        continuation."""
        self._log.warning("journal.never_started", journal=len(self.place.journals) - 1)
        self._check_startable()
        if not self.place.owns(sandbox):  # read on a shared volume: start in our own
            sandbox = self.place.resume_or_create()
        journal = self.place.restart(sandbox)
        return self._spawn(sandbox, journal, self._command())

    def _follow(self, sandbox: Sandbox, journal: PlacedJournal) -> Ending:
        """Follow the journal to its end. A broken link to the sandbox is no loss: the
        read starts again after the last line (or piece of a long line) consumed, with
        backoff, for at most ``SANDBOX_RETRY_BUDGET`` (``driver/resilience.py``); past
        that the attempt stops as a service error and a successor takes over, the run
        never failed for it."""
        consumed = [ReadPoint()]  # where this attempt's consumed lines end
        try:
            for retry in sandbox_retry_policy():
                with retry:
                    return self._follow_from(sandbox, journal, consumed)
        except JournalError as exc:
            if not is_transport_error(exc):
                raise
            raise SandboxUnreachableError(
                "the journal could not be followed: the sandbox's host is unreachable",
                run_id=self.claim.run_id,
                attempt_id=self.claim.attempt_id,
                epoch=self.claim.epoch,
                reason="sandbox-unreachable",
            ) from exc
        raise AssertionError("unreachable: the retry loop returns or raises")

    def _follow_from(
        self, sandbox: Sandbox, journal: PlacedJournal, consumed: list[ReadPoint]
    ) -> Ending:
        point = consumed[0]
        if point.offset:
            self._log.info(
                "journal.follow_resumed", offset=point.offset, line_start=point.line_start
            )
        reader = JournalReader(
            sandbox,
            journal.handle.paths,
            nonce=self.place.nonce(journal),
            # Inside a long line after one of its pieces, the read goes on cutting that
            # line (docs/architecture.md, "Long lines"), as an uninterrupted one would.
            from_byte=point.offset,
            line_start=point.line_start,
            poll_interval=self.settings.journal_poll_interval,
            # A read resumed after a link failure is no first read: the agent did write.
            first_byte_timeout=self.settings.journal_stall_timeout if not point.offset else None,
            max_bytes=self.settings.journal_max_bytes,
            max_line_bytes=journal.max_line_bytes,
        )
        feed = JournalFeed(reader).start()
        try:
            while True:
                stop = self._stop_asked()
                if stop is not None:
                    feed.stop()
                    stop()
                    return None
                self.ownership.check()
                batch = feed.next_batch(_WAKE)
                self.start_slot.settled(spoke=batch is not None)
                if batch is None:
                    continue
                if batch.lines:
                    self._consume(journal, batch.lines)
                    consumed[0] = consumed[0].after(batch.lines)
                if not batch.ended:
                    continue
                if batch.error is not None:
                    if is_transport_error(batch.error):
                        # Gone, or only out of reach? Only the provider's answer says gone.
                        if self.place.resume() is None:
                            return Lost("sandbox-lost")
                        self._log.warning("journal.link_lost", error=str(batch.error))
                        raise batch.error
                    return Lost(self._loss_reason(batch.error))
                assert batch.exit_code is not None  # noqa: S101 - the reader ended at a sentinel
                assert batch.end_position is not None  # noqa: S101 - set with the exit code
                return Exited(journal, batch.exit_code, batch.end_position, sandbox)
        finally:
            feed.stop()
            self.start_slot.release()

    def _take_start_slot(self) -> bool:
        """Wait for a start slot (``workers/starts.py``), given back as the agent speaks
        (``_follow_from``). A cancel, a deadline or a drain that comes while the turn
        waits is carried out then, before any agent is started (False); a lease lost
        meanwhile raises (and one lost unnoticed, ``_confirm_lease``, after)."""
        while not self.start_slot.take(timeout=_WAKE):
            stop = self._stop_asked()
            if stop is not None:
                self._log.info("start_slot.left")
                stop()
                return False
            self.ownership.check()
        return True

    def _confirm_lease(self) -> None:
        """Start no agent on a lease this attempt may have lost: the store is asked, with
        a renewal, right before every spawn. The heartbeat's word is not enough (a long
        wait for a start slot, a process frozen and woken: its next beat may not have
        come round to say that a successor took the run, which may have run the agent to
        its end already), and neither is this machine's clock: a whole machine paused by
        its hypervisor finds no time passed on any of its clocks, while the database's
        ran on and the lease ran out (docs/architecture.md, "Lease time on a paused
        machine")."""
        self.ownership.check()
        if self.store.renew_lease(self.claim, self.settings.lease_ttl) is not Verdict.DONE:
            self.ownership.lose("lease-lost")

    def _stop_asked(self) -> Callable[[], None] | None:
        """What a cancel, a passed deadline or a drain asks the attempt to do now, in
        that order of precedence; None while nothing does."""
        if self.keeper.cancelled.is_set():
            return self._abort
        if self.keeper.past_deadline.is_set():
            return self._abort_past_deadline
        if self.hand_over.is_set():
            return self._hand_over
        return None

    def _abort_past_deadline(self) -> None:
        error = {"reason": "deadline-exceeded", "message": _DEADLINE}
        self._abort(RunStatus.FAILED, error)

    def _hand_over(self) -> None:
        """A drain's deadline passed (``HostBeacon``): stop driving and let the lease go
        now. The agent goes on writing its journal; the next reconcile hands the run
        to a new attempt, which replays and follows it (on this host's queue, for a
        sandbox on its disk), as after any crash, only sooner."""
        self.keeper.stop()
        self.ownership.confirm(self.store.release_lease(self.claim, give_back_attempt=True))
        self._log.info("attempt.released", reason="drain")

    def _loss_reason(self, error: BaseException) -> str:
        """Why a journal read ended without a sentinel, when that means the agent
        process is lost; any other error is raised."""
        if isinstance(error, JournalStalledError):
            return "journal-stalled"
        if isinstance(error, AgentVanishedError):
            return "agent-vanished"
        if isinstance(error, SandboxError | JournalError) and self.place.resume() is None:
            return "sandbox-lost"
        raise error

    def _finish(self, ending: Exited) -> None:
        """At the sentinel: all bytes stored, the last turn committed, log closed, settled."""
        journal, exit_code = ending.journal, ending.exit_code
        failpoint(self.settings, "after-sentinel", self.claim.run_id)
        sentinel = self.place.sentinel(journal, exit_code)
        # At its own offset, so that bytes a predecessor stored are never stored twice;
        # the journal marked consumed in the same write, or else on its own.
        marked = self.output.write_bytes(
            journal.journal_key,
            ending.sentinel_end - len(sentinel),
            sentinel,
            mark_consumed=self.recorder.consumption_due,
        )
        failpoint(self.settings, "sentinel-stored", self.claim.run_id)
        if not marked:
            self.recorder.mark_consumed(journal.journal_key)
        self._emit(self.replay.closing())
        self.recorder.commit_turn()
        failure = lifecycle.exit_failure(exit_code, self.replay.agent_failure)
        error = None
        if failure is not None:
            paths = journal.handle.paths
            stderr = stderr_tail(ending.sandbox, paths) if ending.sandbox else b""
            limits = _limits_hit(ending.sandbox)
            # The writer's disk watcher left its verdict beside the journal when it
            # stopped the agent (sandbox/disk.py); a successor reads the same file.
            disk = disk_verdict(ending.sandbox, paths) if ending.sandbox else None
            if disk is not None:
                failure = lifecycle.run_error(disk.message, "disk-limit")
                limits = {**limits, **disk.as_limits()}
            elif exit_code == KILLED and limits.get("memory_kills"):
                failure = lifecycle.run_error(_MEMORY_LIMIT, "memory-limit")
            error = {
                "reason": failure["code"],
                "message": failure["message"],
                "exit_code": exit_code,
                "stderr": stderr.decode("utf-8", "replace")[-2000:],
                **({"limits": limits} if limits else {}),
            }
        self._close_with(
            failure or lifecycle.run_finished(self.claim.run_id, self.run.session_id),
            RunStatus.FAILED if failure else RunStatus.COMPLETED,
            error,
        )

    def _close_with(self, final: Chunk, status: RunStatus, error: Any) -> None:
        """Settle, then append the final chunk and close the log: the status is in
        Postgres before any client sees the run end."""
        self.output.check_aligned()
        settled = self._settle(status, error)
        failpoint(self.settings, "settled", self.claim.run_id)
        self.output.emit([final])
        self.output.close()
        if settled:
            try:
                self.place.settled()
            except TurnkeeperError as exc:  # the reaper retries; the run is settled
                self._log.warning("sandbox.destroy_failed", error=str(exc))

    def _settle(self, status: RunStatus, error: Any) -> bool:
        # The heartbeat ends first: a renewal landing just after the settle would be
        # refused (the run is no longer running) and read as a lost lease, and the owner
        # would stop before its final chunk. A lease that runs out meanwhile is the
        # backstop as ever: a handover makes the settle a NOT_OWNER refusal.
        self.keeper.stop()
        failpoint(self.settings, "settling", self.claim.run_id)
        self.ownership.check()
        # The agent's own conversation id, for the session's next run to resume.
        conversation = safe_session_id(self.replay.agent_session_id)
        settled = self.ownership.confirm(
            self.store.settle_run(self.claim, status, error, agent_session_id=conversation)
        )
        self._log.info("run.finished", status=status.value, settled=settled)
        return settled

    # --- replay -----------------------------------------------------------------------

    def _replay_stored(self, count: int) -> None:
        """Re-produce the output of the first ``count`` agent processes from their
        stored bytes, each given-up one followed by its interruption marks."""
        self._announce_workspace()
        for index, journal in enumerate(self.place.journals[:count]):
            self._emit_replayed(
                StoredJournal(
                    self.store,
                    journal.journal_key,
                    self.place.nonce(journal),
                    max_line_bytes=journal.max_line_bytes,
                )
            )
            if journal.given_up:  # a journal that never started ran nothing: no marks
                self._interrupt(process_index(self.place.journals, index))

    def _announce_workspace(self) -> None:
        """The fresh-workspace notice, once, right after ``RUN_STARTED``, as soon as the
        placement recorded it (``replay.stored_chunks`` puts it there too)."""
        reason = self.place.recorded_fresh_workspace
        if reason is not None and not self._workspace_announced:
            self._workspace_announced = True
            self._emit(self.replay.fresh_workspace(reason))

    def _emit_replayed(self, lines: Iterable[Line]) -> None:
        for batch in batches(lines, _REPLAY_BATCH):
            self._emit(self.replay.lines(with_newlines(batch)))

    def _interrupt(self, journal_index: int) -> None:
        """Close what the lost process left open, mark the cut, and answer every tool call
        it made, those whose input it was still streaming included (closed just now)."""
        self.recorder.interrupt()
        self._emit(self.replay.interrupted(journal_index))
        self.recorder.close_interrupted_turn()

    def _consume(self, journal: PlacedJournal, lines: list[Line]) -> None:
        """Journal lines to segments (first), then chunks to the log and the transcript."""
        raw = with_newlines(lines)
        start = lines[0][1] - len(raw[0])
        # The tool request the bytes before recorded goes in the same write.
        pending = self.recorder.pending_tool_request
        if self.output.write_bytes(journal.journal_key, start, b"".join(raw), tool_request=pending):
            self.recorder.tool_request_written()
        failpoint(self.settings, "segment-stored", self.claim.run_id)
        self._emit(self.replay.lines(raw))

    def _emit(self, chunks: list[Chunk]) -> None:
        if chunks:
            self.output.emit(chunks)
            self.recorder.observe(chunks)


def _limits_hit(sandbox: Sandbox | None) -> dict[str, int]:
    """How often the agent's sandbox hit its limits, when it did at all."""
    events = sandbox.limit_events() if sandbox is not None else {}
    hits = {"memory_kills": events.get("oom_kill", 0), "pid_limit_hits": events.get("max", 0)}
    return hits if any(hits.values()) else {}
