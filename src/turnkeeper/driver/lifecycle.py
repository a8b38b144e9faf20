"""The chunks the driver itself mints: a run's start and end, and interruption marks.

Like translator output they are pure functions of the run and the journal bytes,
so a replay after a takeover reproduces them exactly and alignment suppresses
them. Nothing here reads a clock, the stderr file or anything else that could
differ between the first writer and a successor.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.chunks import Chunk
from turnkeeper.store.records import Run, RunStatus, storable

INTERRUPTED = "turnkeeper.interrupted"
FRESH_WORKSPACE = "turnkeeper.fresh_workspace"
_FRESH_WORKSPACE = {
    "lost": "the session's workspace was lost: this run starts in a fresh one, and the "
    "agent's files and its own memory of the conversation are gone",
    "expired": "the session was idle longer than TURNKEEPER_SESSION_TTL and its workspace "
    "was removed: this run starts in a fresh one",
    "unreachable": "the session's workspace is out of this worker's reach (another host's "
    "disk, or another sandbox provider): this run starts in a fresh one",
}
OUTCOME_UNKNOWN = "outcome unknown: the sandbox running this tool was lost before it answered"


def run_started(run_id: str, session_id: str) -> Chunk:
    return {"type": "RUN_STARTED", "threadId": session_id, "runId": run_id}


def run_finished(run_id: str, session_id: str) -> Chunk:
    return {"type": "RUN_FINISHED", "threadId": session_id, "runId": run_id}


def run_error(message: str, code: str) -> Chunk:
    """The run's last chunk when it failed. Its message is the one Postgres stores in the
    run's error (``records.storable``: an agent's NUL as ␀), so that a final chunk rebuilt
    from the run (``final_chunk``) is this chunk."""
    return {"type": "RUN_ERROR", "message": storable(message), "code": code}


def final_chunk(run: Run) -> Chunk:
    """The last chunk of a settled run, from its status and error: every ending
    settles the run with the reason and message its final chunk carries."""
    if run.status is RunStatus.COMPLETED:
        return run_finished(run.run_id, run.session_id)
    error: dict[str, Any] = run.error if isinstance(run.error, dict) else {}
    reason = str(error.get("reason", run.status.value))
    return run_error(str(error.get("message", f"the run ended: {reason}")), reason)


def cancelled() -> Chunk:
    return run_error("the run was cancelled", "cancelled")


def interrupted(journal_index: int) -> Chunk:
    """Marks where an agent process's output ends: its sandbox or its process was lost."""
    return {"type": "CUSTOM", "name": INTERRUPTED, "value": {"journal": journal_index}}


def fresh_workspace(reason: str) -> Chunk:
    """Tells a client that the run did not find its session's workspace, and why: what
    the agent made there in earlier runs is gone."""
    message = _FRESH_WORKSPACE.get(reason, f"this run starts in a fresh workspace ({reason})")
    return {
        "type": "CUSTOM",
        "name": FRESH_WORKSPACE,
        "value": {"reason": reason, "message": message},
    }


def outcome_unknown(tool_call_id: str) -> Chunk:
    """The answer recorded for a tool call whose result was lost with its sandbox."""
    return {
        "type": "TOOL_CALL_RESULT",
        "messageId": f"{tool_call_id}-lost",
        "toolCallId": tool_call_id,
        "content": OUTCOME_UNKNOWN,
        "role": "tool",
    }


def exit_failure(exit_code: int, agent_failure: str | None) -> Chunk | None:
    """The RUN_ERROR for a finished agent, or None when it succeeded."""
    if agent_failure is not None:
        return run_error(agent_failure, "agent-error")
    if exit_code != 0:
        return run_error(f"the agent exited with code {exit_code}", "agent-exit")
    return None
