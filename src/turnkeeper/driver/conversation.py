"""What a follow-up continues: the session's conversation before the run's input.

A run of a session appends its input under the session's leaf; everything from the
root to that parent is the conversation it follows up (docs/architecture.md,
"Follow-ups"). An agent that resumes conversations of its own (Claude Code, Codex)
gets the id the run that wrote that parent reported, when it ran the same agent; the
scripted agent gets the earlier turns in its prompt. Both are read from Postgres, so
a successor makes the same decision and hands the agent the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnkeeper.agents.spec import safe_session_id
from turnkeeper.store.records import Run, TranscriptEntry
from turnkeeper.store.store import Store

HISTORY_HEADING = "Earlier in this conversation:"


@dataclass(frozen=True)
class FollowUp:
    """The conversation a run follows up: its entries, oldest first, and the agent's own
    conversation id to resume, when the run before ran the same agent and said one."""

    history: list[TranscriptEntry]
    agent_session_id: str | None

    @classmethod
    def of(cls, store: Store, run: Run, parent: str | None) -> FollowUp | None:
        """None for a run that starts its session's conversation."""
        if parent is None:
            return None
        history = store.path_to(run.session_id, parent)
        if not history:
            return None
        previous = _last_heard(store, history)
        same_agent = previous is not None and _agent(previous) == _agent(run)
        resumable = safe_session_id(previous.agent_session_id) if previous and same_agent else None
        return cls(history, resumable)

    def prompt(self, prompt: str, *, max_bytes: int | None = None) -> str:
        """The prompt of an agent that recalls the transcript: the new message, then
        what was said before it, one line per message, oldest first.

        ``max_bytes``: what the agent can be given (UTF-8). The new message was checked
        against it at admission; the recalled lines are not, so the oldest are left out
        (and that said) until the whole fits, or, for a message near the limit, it goes
        alone: a long conversation never makes its next message fail. The same history
        gives the same bytes, so a successor's agent is handed exactly what its
        predecessor's was.
        """
        said = [line for entry in self.history for line in _said(entry)]
        head = [prompt, "", HISTORY_HEADING]
        full = "\n".join([*head, *said])
        if max_bytes is None or len(full.encode()) <= max_bytes:
            return full
        budget = max_bytes - len("\n".join(head).encode())
        start, kept_bytes = len(said), 0  # said[start:] is kept, said[:start] left out
        while start > 0:
            line = len(said[start - 1].encode()) + 1
            note = len(_left_out(start - 1).encode()) + 1
            if kept_bytes + line + note > budget:
                break
            start, kept_bytes = start - 1, kept_bytes + line
        cut = "\n".join([*head, _left_out(start), *said[start:]])
        # A message near the limit leaves no room even for the heading and the note: it
        # goes alone, as a first message would (admission checked that it fits).
        return cut if len(cut.encode()) <= max_bytes else prompt


def _left_out(count: int) -> str:
    return f"({count} earlier lines of this conversation left out: too long to recall)"


def _last_heard(store: Store, history: list[TranscriptEntry]) -> Run | None:
    """The latest run on the path that reached its agent's conversation: a run that
    reported no conversation id and recorded nothing but its input (cancelled, or
    failed, before the agent started) is passed over, so the message after it still
    resumes the conversation before it instead of starting a new one."""
    spoke = {entry.run_id for entry in history if entry.kind != "user"}
    for run_id in dict.fromkeys(entry.run_id for entry in reversed(history)):
        run = store.get_run(run_id)
        if run is None or run.agent_session_id is not None or run_id in spoke:
            return run
    return None


def _agent(run: Run) -> Any:
    payload = run.payload if isinstance(run.payload, dict) else {}
    return payload.get("agent", "scripted")


def _said(entry: TranscriptEntry) -> list[str]:
    body = entry.body if isinstance(entry.body, dict) else {}
    if entry.kind == "user":
        return [f"user: {_one_line(body.get('prompt'))}"]
    if entry.kind == "assistant":
        texts = [m.get("text") for m in body.get("messages", []) if isinstance(m, dict)]
        return [f"assistant: {_one_line(text)}" for text in texts if text]
    return []


def _one_line(value: object) -> str:
    return " ".join(str(value or "").split())
