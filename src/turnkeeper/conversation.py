"""A session seen from the Python client: send a message, follow the reply.

    chat = client.session("user-42/chat", agent="claude-code")
    reply = chat.send("write hello.py")
    for seq, chunk in reply:          # the run's events, until its log closes
        ...
    chat.send("now add a test for it")   # continues the agent's own conversation

Each message is a run of the session (docs/architecture.md, "Sessions"): it waits
behind the session's active run, works in the session's workspace and resumes the
agent's conversation. ``AsyncSession`` and ``AsyncReply`` are the same on
``AsyncClient``: ``await chat.send(...)``, ``async for seq, chunk in reply``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypedDict, TypeVar, Unpack

from turnkeeper.chunks import Chunk
from turnkeeper.store.records import Run, TranscriptEntry

SESSION_RUNS_LIMIT = 1000


class SubmitOptions(TypedDict, total=False):
    """The keyword options of ``Client.submit`` (and of ``AsyncClient.submit``)."""

    session_id: str | None
    run_id: str | None
    env: Mapping[str, str] | None
    provider: str | None
    max_attempts: int | None
    timeout: float | None
    key_name: str | None
    from_entry: str | None


class RunFilters(TypedDict, total=False):
    """The keyword options of ``Client.list_runs``."""

    status: str | None
    session_id: str | None
    key_name: str | None
    limit: int


# What a session needs of its client: the client builds sessions, a session never
# builds a client (nor imports one).
class SessionClient(Protocol):
    """The calls a ``Session`` makes (``turnkeeper.client.Client`` has them)."""

    def submit(
        self, agent: str | Mapping[str, Any], prompt: str, **options: Unpack[SubmitOptions]
    ) -> Run: ...
    def require(self, run_id: str) -> Run: ...
    def events(
        self, run_id: str, after: int = 0, *, follow: bool = True
    ) -> Iterator[tuple[int, Chunk]]: ...
    def transcript(self, session_id: str) -> list[TranscriptEntry]: ...
    def list_runs(self, **filters: Unpack[RunFilters]) -> list[Run]: ...


class AsyncSessionClient(Protocol):
    """The calls an ``AsyncSession`` makes (``turnkeeper.client.AsyncClient`` has them)."""

    async def submit(
        self, agent: str | Mapping[str, Any], prompt: str, **options: Unpack[SubmitOptions]
    ) -> Run: ...
    async def require(self, run_id: str) -> Run: ...
    def events(
        self, run_id: str, after: int = 0, *, follow: bool = True
    ) -> AsyncIterator[tuple[int, Chunk]]: ...
    async def transcript(self, session_id: str) -> list[TranscriptEntry]: ...
    async def list_runs(self, **filters: Unpack[RunFilters]) -> list[Run]: ...


ClientT = TypeVar("ClientT", SessionClient, AsyncSessionClient)


@dataclass
class Reply:
    """A message sent: its run, and its events as they come."""

    client: SessionClient
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
class _Conversation(Generic[ClientT]):
    """What both sessions hold, and how a message's submit arguments are made."""

    client: ClientT
    session_id: str
    agent: str | Mapping[str, Any] = "scripted"
    options: dict[str, Any] = field(default_factory=dict)

    def _message(
        self,
        run_id: str | None,
        agent: str | Mapping[str, Any] | None,
        from_entry: str | None,
        options: dict[str, Any],
    ) -> tuple[str | Mapping[str, Any], dict[str, Any]]:
        """The agent and the ``submit`` options of a message: the session's, overridden
        by the message's own."""
        chosen = agent if agent is not None else self.agent
        submit = {"session_id": self.session_id, "run_id": run_id, "from_entry": from_entry}
        return chosen, {**submit, **self.options, **options}


@dataclass
class Session(_Conversation[SessionClient]):
    """One conversation: ``send`` submits its next message with the session's agent and
    options (each ``send`` may override them)."""

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
        chosen, submit = self._message(run_id, agent, from_entry, options)
        return Reply(self.client, self.client.submit(chosen, prompt, **submit))

    def transcript(self) -> list[TranscriptEntry]:
        """The conversation on the active path, root to leaf."""
        return self.client.transcript(self.session_id)

    def runs(self) -> list[Run]:
        """The session's runs, oldest first."""
        newest_first = self.client.list_runs(session_id=self.session_id, limit=SESSION_RUNS_LIMIT)
        return list(reversed(newest_first))


@dataclass
class AsyncReply:
    """``Reply`` on ``AsyncClient``: ``async for seq, chunk in reply``."""

    client: AsyncSessionClient
    run: Run

    def events(self, after: int = 0, *, follow: bool = True) -> AsyncIterator[tuple[int, Chunk]]:
        """As ``Reply.events``, on asyncio."""
        return self.client.events(self.run.run_id, after, follow=follow)

    def __aiter__(self) -> AsyncIterator[tuple[int, Chunk]]:
        return self.events()

    async def refresh(self) -> Run:
        self.run = await self.client.require(self.run.run_id)
        return self.run


@dataclass
class AsyncSession(_Conversation[AsyncSessionClient]):
    """``Session`` on ``AsyncClient``: ``await chat.send(prompt)``."""

    async def send(
        self,
        prompt: str,
        *,
        run_id: str | None = None,
        agent: str | Mapping[str, Any] | None = None,
        from_entry: str | None = None,
        **options: Any,
    ) -> AsyncReply:
        """As ``Session.send``, on asyncio."""
        chosen, submit = self._message(run_id, agent, from_entry, options)
        return AsyncReply(self.client, await self.client.submit(chosen, prompt, **submit))

    async def transcript(self) -> list[TranscriptEntry]:
        return await self.client.transcript(self.session_id)

    async def runs(self) -> list[Run]:
        newest_first = await self.client.list_runs(
            session_id=self.session_id, limit=SESSION_RUNS_LIMIT
        )
        return list(reversed(newest_first))
