"""One attempt's drive of a run: fresh, or taken over from a dead or frozen owner.

The output of a run is a pure function of its journals' bytes: ``RUN_STARTED``,
then for each agent process in order its translated lines (an interrupted one
followed by its interruption marks), then the closing chunks and ``RUN_FINISHED``
or ``RUN_ERROR``. A fresh attempt produces it live; a successor reproduces it
from byte 0 (from the living journal, or from the Postgres segments when the
sandbox is gone) and the aligner suppresses what clients already have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.agents.translator import translator_for
from turnkeeper.chunks import Chunk
from turnkeeper.driver import lifecycle
from turnkeeper.driver.feed import JournalFeed
from turnkeeper.driver.output import RunOutput, end_log
from turnkeeper.driver.record import TurnRecorder
from turnkeeper.driver.recovery import Recovery, RecoveryFacts, classify
from turnkeeper.driver.resilience import resilient
from turnkeeper.errors import (
    AgentVanishedError,
    JournalError,
    JournalExistsError,
    JournalStalledError,
    OwnershipLostError,
    SandboxError,
    TurnkeeperError,
)
from turnkeeper.sandbox import (
    JournalHandle,
    JournalPaths,
    JournalReader,
    Sandbox,
    SandboxRef,
    SandboxSpec,
    exit_sentinel_line,
    nonce_for,
    spawn_journaled,
    stderr_tail,
)
from turnkeeper.sandbox.journal import exists_argv, parse_sentinel
from turnkeeper.sandbox.lines import LineSplitter
from turnkeeper.store.records import Claim, Run, RunStatus
from turnkeeper.workers.failpoints import failpoint
from turnkeeper.workers.lease import LeaseKeeper
from turnkeeper.workers.runtime import WorkerRuntime

log = structlog.get_logger(__name__)

_WAKE = 0.25
Line = tuple[bytes, int]
_DEADLINE = "the run passed its deadline"
_SANDBOX_LOST = "the sandbox was lost mid-run and this agent cannot continue"
_JOURNAL_FAILURES = {
    "agent-vanished": "the agent process ended without an exit sentinel",
    "journal-stalled": "the agent wrote nothing to its journal in time",
    "sandbox-lost": _SANDBOX_LOST,
}


@dataclass
class Placement:
    """Where a run's agent processes live: its sandbox and each process's journal, in order."""

    sandbox: SandboxRef | None = None
    journals: list[JournalHandle] = field(default_factory=list)

    @classmethod
    def of(cls, run: Run, env: Mapping[str, str]) -> Placement:
        """The run's placement, its sandbox given back the env the store never keeps."""
        data = run.sandbox_ref or {}
        sandbox = SandboxRef.from_dict(data["sandbox"]) if data.get("sandbox") else None
        if sandbox is not None:
            sandbox = replace(sandbox, spec=replace(sandbox.spec, env=dict(env)))
        return cls(
            sandbox=sandbox,
            journals=[JournalHandle.from_dict(j) for j in data.get("journals", [])],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "sandbox": self.sandbox.to_dict() if self.sandbox else None,
            "journals": [j.to_dict() for j in self.journals],
        }


class Attempt:
    def __init__(self, runtime: WorkerRuntime, claim: Claim, run: Run, keeper: LeaseKeeper) -> None:
        self.rt = runtime
        self.store = resilient(runtime.store, runtime.settings.lease_ttl)
        self.run_log = resilient(runtime.log, runtime.settings.lease_ttl)
        self.claim = claim
        self.run = run
        self.keeper = keeper
        self.settings = runtime.settings
        payload = run.payload if isinstance(run.payload, dict) else {}
        self.prompt = str(payload.get("prompt", ""))
        self.spec = AgentSpec.from_payload(payload.get("agent", "scripted"))
        self.env = runtime.agent_env(claim.run_id, payload, self.spec)
        self.provider = runtime.provider(payload.get("provider"))
        self.translator = translator_for(self.spec.format, claim.run_id)
        self.slot = self.store.get_turn_slot(claim.run_id)
        self.recorder = TurnRecorder(self.store, claim, run.session_id, keeper.lost, self.slot)
        self.output = RunOutput(
            self.store, self.run_log, claim, keeper.lost, self.run_log.snapshot(claim.run_id)
        )
        self.placement = Placement.of(run, self.env)
        self._log = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)

    # --- entry ------------------------------------------------------------------------

    def drive(self, *, fresh: bool) -> None:
        if fresh:
            action = Recovery.START
        else:
            action = classify(self._facts())
            self._log.info("takeover.classified", action=action.value)
        if action is Recovery.ABORT:
            self._abort()
            return
        self._emit([lifecycle.run_started(self.claim.run_id, self.run.session_id)])
        self.recorder.record_input(self.prompt)
        steps: dict[Recovery, Callable[[], None]] = {
            Recovery.START: self._start,
            Recovery.ATTACH: self._attach,
            Recovery.FINISH_FROM_SEGMENTS: self._finish_from_segments,
            Recovery.CONTINUE: self._continue,
            Recovery.FAIL: self._fail_lost,
        }
        steps[action]()

    def _facts(self) -> RecoveryFacts:
        sandbox = self._resume()
        last = self.placement.journals[-1] if self.placement.journals else None
        journal_present = bool(
            sandbox is not None and last is not None and _journal_exists(sandbox, last.paths)
        )
        return RecoveryFacts(
            phase=self.slot.phase if self.slot else None,
            journal_consumed=bool(self.slot and self.slot.journal_consumed_at),
            sandbox_alive=sandbox is not None,
            journal_present=journal_present,
            has_segments=any(
                self.output.stored_end(j.journal_key) for j in self.placement.journals
            ),
            can_continue=self.spec.can_continue,
            cancel_requested=self.run.cancel_requested_at is not None,
        )

    # --- the recovery actions ----------------------------------------------------------

    def _start(self) -> None:
        """Spawn the agent (reusing a journal recorded but never started)."""
        sandbox = self._resume() or self._create_sandbox()
        last = self.placement.journals[-1] if self.placement.journals else None
        if (
            last is not None
            and last.ref.id == sandbox.ref.id
            and not _journal_exists(sandbox, last.paths)
            and not self.output.stored_end(last.journal_key)
        ):
            handle = last
            self._replay_previous(self.placement.journals[:-1])
        else:
            self._replay_previous(self.placement.journals)
            handle = self._new_journal(sandbox)
        self._spawn(sandbox, handle, self.spec.argv(self.prompt))

    def _attach(self) -> None:
        sandbox = self._resume()
        assert sandbox is not None  # noqa: S101 - the classifier saw it alive
        *previous, current = self.placement.journals
        self._replay_previous(previous)
        self.recorder.provider_started(current.journal_key)
        self._follow(sandbox, current)

    def _finish_from_segments(self) -> None:
        *previous, last = self.placement.journals
        self._replay_previous(previous)
        lines = self._segment_lines(last)
        exit_code = None
        if lines:
            nonce = nonce_for(last.ref, self.claim.run_id, self.rt.secret)
            exit_code = parse_sentinel(lines[-1][0], nonce)
        if exit_code is None:
            self._fail_lost()  # consumed yet no sentinel: the segments are not whole
            return
        self._consume(last, lines[:-1], store_bytes=False)
        self._finish(last, exit_code, lines[-1][1], sandbox=None)

    def _continue(self) -> None:
        """Keep what was captured, mark the interruption, continue in a new process."""
        self._replay_previous(self.placement.journals)
        self._spawn_continuation()

    def _spawn_continuation(self) -> None:
        sandbox = self._resume() or self._create_sandbox()
        handle = self._new_journal(sandbox)
        argv = self.spec.continuation_argv(
            self.prompt,
            session_id=self.translator.session_id,
            start_turn=self.recorder.tracker.turns_completed,
        )
        self._log.info("run.continuing", journal=len(self.placement.journals))
        self._spawn(sandbox, handle, argv)

    def _fail_lost(self) -> None:
        self._replay_previous(self.placement.journals)
        self._close_with(
            lifecycle.run_error(_SANDBOX_LOST, "sandbox-lost"),
            RunStatus.FAILED,
            {"reason": "sandbox-lost"},
        )

    def _abort(
        self,
        final: Chunk | None = None,
        status: RunStatus = RunStatus.ABORTED,
        error: Any = None,
    ) -> None:
        """Stop the agent, end the log with one final chunk, settle: a cancel by default,
        or a deadline passed."""
        if self.placement.sandbox is not None:
            self.provider.destroy(self.placement.sandbox)
        self.output.check_ownership()
        end_log(self.run_log, self.claim.run_id, self.claim.epoch, final or lifecycle.cancelled())
        self._settle(status, error or {"reason": "cancelled"})

    # --- journals ---------------------------------------------------------------------

    def _spawn(self, sandbox: Sandbox, handle: JournalHandle, argv: list[str]) -> None:
        failpoint(self.settings, "before-spawn", self.claim.run_id)
        try:
            spawn_journaled(
                sandbox,
                self.claim.run_id,
                argv,
                secret=self.rt.secret,
                process=handle.paths.process,
            )
        except JournalExistsError:
            self._log.info("journal.already_started", journal=handle.paths.process)
        self.recorder.provider_started(handle.journal_key)
        self._follow(sandbox, handle)

    def _follow(self, sandbox: Sandbox, handle: JournalHandle) -> None:
        reader = JournalReader(
            sandbox,
            handle.paths,
            nonce=nonce_for(handle.ref, self.claim.run_id, self.rt.secret),
            poll_interval=self.settings.journal_poll_interval,
            first_byte_timeout=self.settings.journal_stall_timeout,
            max_bytes=self.settings.journal_max_bytes,
        )
        feed = JournalFeed(reader).start()
        try:
            while True:
                if self.keeper.cancelled.is_set():
                    feed.stop()
                    self._abort()
                    return
                if self.keeper.past_deadline.is_set():
                    feed.stop()
                    reason = {"reason": "deadline-exceeded", "message": _DEADLINE}
                    self._abort(
                        lifecycle.run_error(_DEADLINE, "deadline-exceeded"),
                        RunStatus.FAILED,
                        reason,
                    )
                    return
                self.output.check_ownership()
                batch = feed.next_batch(_WAKE)
                if batch is None:
                    continue
                if batch.lines:
                    self._consume(handle, batch.lines)
                if not batch.ended:
                    continue
                if batch.error is not None:
                    self._journal_failed(batch.error)
                    return
                assert batch.exit_code is not None  # noqa: S101 - the reader ended at a sentinel
                assert batch.end_position is not None  # noqa: S101 - set with the exit code
                self._finish(handle, batch.exit_code, batch.end_position, sandbox)
                return
        finally:
            feed.stop()

    def _journal_failed(self, error: BaseException) -> None:
        """The agent died without a sentinel, never wrote, or its sandbox is gone:
        continue in a new process when the agent can, else fail the run."""
        if isinstance(error, JournalStalledError):
            reason = "journal-stalled"
        elif isinstance(error, AgentVanishedError):
            reason = "agent-vanished"
        elif isinstance(error, SandboxError | JournalError) and self._resume() is None:
            reason = "sandbox-lost"
        else:
            raise error
        self._log.warning("journal.lost", reason=reason, error=str(error))
        if reason == "journal-stalled":
            self._disarm(self.placement.journals[-1])
        self._interrupt(len(self.placement.journals) - 1)
        if self.spec.can_continue:
            self._spawn_continuation()
            return
        self._close_with(
            lifecycle.run_error(_JOURNAL_FAILURES[reason], reason),
            RunStatus.FAILED,
            {"reason": reason},
        )

    def _disarm(self, handle: JournalHandle) -> None:
        """A writer that never started must never start later (a frozen predecessor may
        still be about to launch it): without its nonce file it exits before the agent."""
        sandbox = self._resume()
        if sandbox is not None:
            sandbox.exec(["rm", "-f", "--", handle.paths.nonce_file], timeout=30)

    def _finish(
        self, handle: JournalHandle, exit_code: int, sentinel_end: int, sandbox: Sandbox | None
    ) -> None:
        """At the sentinel: all bytes stored, the last turn committed, log closed, settled."""
        failpoint(self.settings, "after-sentinel", self.claim.run_id)
        sentinel = exit_sentinel_line(
            self.claim.run_id, exit_code, secret=self.rt.secret, sandbox_id=handle.ref.id
        )
        # At its own offset, so that bytes a predecessor stored are never stored twice.
        self.output.write_bytes(handle.journal_key, sentinel_end - len(sentinel), sentinel)
        failpoint(self.settings, "sentinel-stored", self.claim.run_id)
        self.recorder.mark_consumed(handle.journal_key)
        closing = self.translator.finish()
        self._emit(closing)
        self.recorder.commit_turn()
        failure = lifecycle.exit_failure(exit_code, self.translator.failure)
        error = None
        if failure is not None:
            stderr = stderr_tail(sandbox, handle.paths) if sandbox else b""
            error = {
                "reason": failure["code"],
                "message": failure["message"],
                "exit_code": exit_code,
                "stderr": stderr.decode("utf-8", "replace")[-2000:],
            }
        self._close_with(
            failure or lifecycle.run_finished(self.claim.run_id, self.run.session_id),
            RunStatus.FAILED if failure else RunStatus.COMPLETED,
            error,
        )

    def _close_with(self, final: Chunk, status: RunStatus, error: Any) -> None:
        self.output.emit([final])
        self.output.close()
        if self._settle(status, error) and self.placement.sandbox is not None:
            try:
                self.provider.destroy(self.placement.sandbox)
            except TurnkeeperError as exc:  # the reaper retries; the run is settled
                self._log.warning("sandbox.destroy_failed", error=str(exc))

    def _settle(self, status: RunStatus, error: Any) -> bool:
        settled = self.store.settle_run(self.claim, status, error)
        if not settled:
            current = self.store.get_run(self.claim.run_id)
            if current is None or current.attempt_id != self.claim.attempt_id:
                raise OwnershipLostError(
                    "settle refused: another attempt owns the run",
                    run_id=self.claim.run_id,
                    attempt_id=self.claim.attempt_id,
                    epoch=self.claim.epoch,
                    reason="store-fenced",
                )
        self._log.info("run.finished", status=status.value, settled=settled)
        return settled

    # --- replay -----------------------------------------------------------------------

    def _replay_previous(self, journals: Iterable[JournalHandle]) -> None:
        """Re-produce the output of interrupted agent processes from their stored bytes."""
        for index, handle in enumerate(journals):
            self._consume(handle, self._segment_lines(handle), store_bytes=False)
            self._interrupt(index)

    def _interrupt(self, journal_index: int) -> None:
        self.recorder.interrupt()
        marks = self.translator.finish()
        marks.append(lifecycle.interrupted(journal_index))
        marks.extend(lifecycle.outcome_unknown(c) for c in self.recorder.pending_tool_calls)
        self._emit(marks)
        self.recorder.close_interrupted_turn()

    def _segment_lines(self, handle: JournalHandle) -> list[Line]:
        splitter = LineSplitter(0)
        lines: list[Line] = []
        for segment in self.store.segments(handle.journal_key):
            lines.extend(splitter.feed(segment.body))
        return lines

    def _consume(
        self, handle: JournalHandle, lines: list[Line], *, store_bytes: bool = True
    ) -> None:
        """Journal lines to segments (first), then chunks to the log and the transcript."""
        if not lines:
            return
        # Readers hand out lines without their newline; the journal (and so the segments
        # and the text translator) holds them with it.
        raw = [line + b"\n" for line, _ in lines]
        if store_bytes:
            start = lines[0][1] - len(raw[0])
            self.output.write_bytes(handle.journal_key, start, b"".join(raw))
        chunks: list[Chunk] = []
        for line in raw:
            chunks.extend(self.translator.feed(line))
        self._emit(chunks)

    def _emit(self, chunks: list[Chunk]) -> None:
        if chunks:
            self.output.emit(chunks)
            self.recorder.observe(chunks)

    # --- sandboxes --------------------------------------------------------------------

    def _resume(self) -> Sandbox | None:
        ref = self.placement.sandbox
        return None if ref is None else self.provider.resume(ref)

    def _create_sandbox(self) -> Sandbox:
        spec = SandboxSpec(env=self.env, journal_max_bytes=self.settings.journal_max_bytes)
        ref = self.provider.create(self.claim.run_id, spec)
        # Recorded with the first journal, before anything runs in it; a crash before
        # that leaves an empty orphan for the reaper.
        self.placement = Placement(ref, list(self.placement.journals))
        sandbox = self.provider.resume(ref)
        assert sandbox is not None  # noqa: S101 - just created
        return sandbox

    def _new_journal(self, sandbox: Sandbox) -> JournalHandle:
        """The next agent process's journal, recorded before the process starts."""
        process = 1 + sum(1 for j in self.placement.journals if j.ref.id == sandbox.ref.id)
        handle = JournalHandle(
            sandbox.ref, JournalPaths(sandbox.ref.journal_dir, self.claim.run_id, process)
        )
        self.placement.journals.append(handle)
        self._record_placement()
        return handle

    def _record_placement(self) -> None:
        self.output.check_ownership()
        if not self.store.record_sandbox(self.claim, self.placement.to_dict()):
            self.keeper.lost.set()
            self.output.check_ownership()


def _journal_exists(sandbox: Sandbox, paths: JournalPaths) -> bool:
    return sandbox.exec(exists_argv(paths), timeout=30).exit_code == 0
