"""A session seen from the Python client: send a message, follow the reply.

    chat = client.session("user-42/chat", agent="claude-code")
    reply = chat.send("write hello.py")
    for seq, chunk in reply:          # the run's events, until its log closes
        ...
    chat.send("now add a test for it")   # continues the agent's own conversation

Each message is a run of the session (docs/architecture.md, "Sessions"): it waits
behind the session's active run, works in the session's workspace and resumes the
agent's conversation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from turnkeeper.chunks import Chunk
from turnkeeper.store.records import Run, TranscriptEntry

if TYPE_CHECKING:  # the client builds sessions; a session never builds a client
    from turnkeeper.client import Client


@dataclass
class Reply:
    """A message sent: its run, and its events as they come."""

    client: Client
    run: Run

    def events(self, after: int = 0, *, follow: bool = True) -> Iterator[tuple[int, Chunk]]:
        """The run's chunks after seq ``after``, until its log closes (or what is stored
        now, without ``follow``)."""
        return self.client.events(self.run.run_id, after, follow=follow)

    def __iter__(self) -> Iterator[tuple[int, Chunk]]:
        return self.events()

    def refresh(self) -> Run:
        self.run = self.client.require(self.run.run_id)
        return self.run


@dataclass
class Session:
    """One conversation: ``send`` submits its next message with the session's agent and
    options (each ``send`` may override them)."""

    client: Client
    session_id: str
    agent: str | Mapping[str, Any] = "scripted"
    options: dict[str, Any] = field(default_factory=dict)

    def send(
        self,
        prompt: str,
        *,
        run_id: str | None = None,
        agent: str | Mapping[str, Any] | None = None,
        from_entry: str | None = None,
        **options: Any,
    ) -> Reply:
        """Submit ``prompt`` as the session's next message; idempotent by ``run_id``.
        ``from_entry``: the earlier entry it follows instead of the latest (a branch)."""
        run = self.client.submit(
            agent if agent is not None else self.agent,
            prompt,
            session_id=self.session_id,
            run_id=run_id,
            from_entry=from_entry,
            **{**self.options, **options},
        )
        return Reply(self.client, run)

    def transcript(self) -> list[TranscriptEntry]:
        """The conversation on the active path, root to leaf."""
        return self.client.transcript(self.session_id)

    def runs(self) -> list[Run]:
        """The session's runs, oldest first."""
        return list(reversed(self.client.list_runs(session_id=self.session_id, limit=1000)))
