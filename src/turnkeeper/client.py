"""The Python API a web app (or a script) calls to enqueue runs and follow them.

Synchronous and thread-safe, so any framework can call it without an event loop:

    client = Client.from_settings(load_settings())
    run = client.submit("scripted", "tidy the repo", session_id=user.conversation_id)
    for seq, chunk in client.events(run.run_id):
        ...
    reply = client.session(user.conversation_id, agent="claude-code").send("go on")

``submit`` is idempotent by ``run_id``: the same id with the same request returns
the existing run; a different request under that id is a ``RunConflictError``.

The client talks to the store directly, so it is trusted: it may run any agent and
see every run. ``key_name`` submits on behalf of an API key (the run then belongs
to that key's tenant and counts against its ``max_running``). Env values are
sealed before they reach the store (``turnkeeper.envelope``), which needs the
server secret.

``AsyncClient`` is the same surface on asyncio, for FastAPI and Starlette apps:

    async with AsyncClient.from_settings(load_settings()) as client:
        run = await client.submit("scripted", "tidy the repo")
        async for seq, chunk in client.events(run.run_id):
            ...
"""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar, Unpack

from uuid6 import uuid7

from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.conversation import AsyncSession, RunFilters, Session, SubmitOptions
from turnkeeper.envelope import EnvSealer
from turnkeeper.errors import (
    AgentError,
    InvalidInputError,
    LogUnavailableError,
    RunConflictError,
    RunNotFoundError,
)
from turnkeeper.log import AsyncRunLog, LogOrigin, RunLog
from turnkeeper.logconfig import configure_library_logging, get_logger
from turnkeeper.secret import ServerSecret
from turnkeeper.store.records import Run, RunStatus, TranscriptEntry, check_id
from turnkeeper.store.store import Store

if TYPE_CHECKING:
    from celery import Celery

    from turnkeeper.agents.spec import AgentSpec
    from turnkeeper.driver.replay import StoredLog

log = get_logger(__name__)


class Client:
    """What a run is driven and followed through: the store, the log and the broker.

    Only ``submit`` sends a message, so the Celery app is made on its first use, not
    here (``app``): a script that follows or cancels runs in a loop loads neither Celery
    nor what a worker drives a turn with (bench/cli_start.py)."""

    def __init__(
        self, settings: Settings, *, store: Store, log: RunLog, app: Celery | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self.log = log
        if log.source is None:  # a lost log is rebuilt from the store, never read as empty
            log.source = _StoredLogSource(store)
        self._app = app
        self._app_lock = threading.Lock()
        self._sealer: EnvSealer | None = None
        self._sealer_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """A client on the settings' servers: the URLs they name, else the embedded
        servers ``turnkeeper dev`` runs in their data directory, found as the CLI
        finds them (a ConfigError says how to start them when none run)."""
        configure_library_logging(settings.log_format)
        if settings.uses_embedded:  # else nothing to look up, nor its modules to load
            from turnkeeper.embedded import resolve_services  # noqa: PLC0415

            settings, _ = resolve_services(settings, start=False)
        return cls(
            settings,
            store=Store(settings.require_database_url(), pool_size=5),
            log=RunLog.from_settings(settings),
        )

    @property
    def app(self) -> Celery:
        """The Celery app that enqueues runs (``queues.broker_app``), made on first use."""
        with self._app_lock:
            if self._app is None:
                from turnkeeper.queues import broker_app  # noqa: PLC0415 - loads Celery

                self._app = broker_app(self.settings)
            return self._app

    @classmethod
    def from_urls(
        cls, database_url: str, redis_url: str, broker_url: str | None = None, **settings: Any
    ) -> Client:
        return cls.from_settings(
            Settings(
                database_url=database_url, redis_url=redis_url, broker_url=broker_url, **settings
            )
        )

    def close(self) -> None:
        self.store.close()
        self.log.client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def sealer(self) -> EnvSealer:
        """Seals env values; built on first use, as only runs with env need the secret."""
        with self._sealer_lock:
            if self._sealer is None:
                secret = ServerSecret.require(self.settings, "to submit a run with env values")
                self._sealer = EnvSealer(secret)
            return self._sealer

    # --- runs -------------------------------------------------------------------------

    def submit(
        self,
        agent: str | Mapping[str, Any],
        prompt: str,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        env: Mapping[str, str] | None = None,
        provider: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        key_name: str | None = None,
        from_entry: str | None = None,
    ) -> Run:
        """Admit a run and enqueue it; idempotent by ``run_id``.

        ``agent`` is a preset name (``scripted``, ``claude-code``, ``codex``) or an
        agent spec (``{"command": [...], "format": ..., "env": {...}}``). ``env``
        adds variables to the agent's minimal environment: nothing else of this
        process's environment reaches it. ``key_name`` submits on behalf of that
        API key. ``from_entry``: an earlier entry of the session's transcript the
        run's input follows (a branch: a retry, an edited message), refused with
        ``cannot-fork`` where the agent cannot continue its conversation from there.
        A prompt the agent can never be given (``AgentSpec.check_prompt``) is a
        ``PromptError``, and no run is admitted.
        """
        from turnkeeper.agents.spec import AgentSpec  # noqa: PLC0415 - only submit needs it
        from turnkeeper.queues import enqueue_run  # noqa: PLC0415 - loads Celery

        app = self.app  # made before the run is admitted: a run is admitted to be sent
        spec = AgentSpec.from_payload(agent if isinstance(agent, str) else dict(agent))
        merged_env = {**spec.env, **dict(env or {})}
        if env:
            spec = spec.model_copy(update={"env": merged_env})
            spec = AgentSpec.from_payload(spec.to_payload())  # validate the merged env
        if not isinstance(prompt, str):
            raise InvalidInputError("prompt must be a string", reason="invalid-prompt")
        spec.check_prompt(prompt)  # a prompt the agent can never be given makes no run
        if provider is not None and provider not in ("local", "bwrap", "ssh"):
            raise InvalidInputError(
                f"unknown sandbox provider {provider!r}; known: local, bwrap, ssh",
                reason="invalid-provider",
            )
        run_id = run_id or str(uuid7())
        # Env values are stored sealed, apart from the spec, never in plaintext.
        unsealed = spec.model_copy(update={"env": {}}).to_payload()
        payload: dict[str, Any] = {"agent": unsealed, "prompt": prompt, "provider": provider}
        if from_entry is not None:
            self._check_branch(spec, session_id or run_id, from_entry, key_name)
            payload["from_entry"] = from_entry
        if merged_env:
            payload["env"] = self.sealer.seal(run_id, merged_env)
        run, created = self.store.admit_run(
            run_id,
            session_id or run_id,
            payload,
            max_attempts=max_attempts or self.settings.max_attempts,
            deadline=timeout or self.settings.run_timeout,
            key_name=key_name,
        )
        if created or run.status is RunStatus.QUEUED:
            enqueue_run(app, self.settings, run_id, store=self.store)
            self.store.mark_dispatched(run_id)
        return run

    def _check_branch(
        self, spec: AgentSpec, session_id: str, from_entry: str, key_name: str | None
    ) -> None:
        """Refuse a branch from an entry the session does not hold, or from which the
        agent cannot continue its own conversation (``AgentSpec.branch_refusal``)."""
        check_id(from_entry, "from_entry")
        exists, tenant = self.store.session_tenant(check_id(session_id, "session_id"))
        if exists and tenant != key_name:  # as admission refuses it, learning nothing
            raise RunConflictError(
                f"session {session_id!r} is taken; choose another session id",
                reason="session-taken",
            )
        entries = self.store.session_entries(session_id)
        entry = next((e for e in entries if e.entry_id == from_entry), None)
        if entry is None:
            raise InvalidInputError(
                f"session {session_id!r} has no entry {from_entry!r}", reason="unknown-entry"
            )
        runs = self.list_runs(session_id=session_id, limit=1000)
        settled = all(run.status.is_terminal for run in runs)
        writer = next((run for run in runs if run.run_id == entry.run_id), None)
        ends_its_run = (
            writer is not None
            and writer.status.is_terminal
            and not any(e.parent_id == from_entry and e.run_id == entry.run_id for e in entries)
        )
        at_leaf = settled and self.store.session_leaf(session_id) == from_entry
        refusal = spec.branch_refusal(at_run_end=ends_its_run, at_leaf=at_leaf)
        if refusal is not None:
            raise AgentError(refusal, reason="cannot-fork")

    def session(
        self, session_id: str, agent: str | Mapping[str, Any] = "scripted", **options: Any
    ) -> Session:
        """A conversation: ``session(id).send(prompt)`` submits its next message with
        ``agent`` and the ``submit`` options given here, and returns the reply to follow."""
        return Session(self, check_id(session_id, "session_id"), agent, dict(options))

    def get(self, run_id: str) -> Run | None:
        return self.store.get_run(run_id)

    def require(self, run_id: str) -> Run:
        run = self.store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"no run has the id {run_id!r}", run_id=run_id)
        return run

    def cancel(self, run_id: str) -> Run:
        """Abort a run. One nobody drives (queued, behind its session, awaiting adoption,
        or whose owner's lease ran out) is settled here at once; a driven one is
        announced to its owner, which stops its agent and settles it within about a
        second (docs/architecture.md, "Cancelling a run")."""
        before = self.require(run_id)
        run = self.store.request_cancel(run_id)
        if run is None:
            return self.require(run_id)
        if before.status is RunStatus.QUEUED and run.status is RunStatus.ABORTED:
            self._end_unowned_log(run)
        elif run.status is RunStatus.RUNNING:
            for settled in self.store.expire_exhausted(1, run_id=run_id):
                self._end_unowned_log(settled)
                return settled
        return run

    def _end_unowned_log(self, run: Run) -> None:
        """End the log of a run settled without an owner, fenced above any epoch it had:
        what the store holds and the log lacks, then the final chunk its settled status
        and error call for, as a rebuild makes it (``driver/ending.py``). A log someone
        else ended meanwhile stays as that one ended it."""
        # Only a cancel ends a log: loaded here, not with the client.
        from turnkeeper.driver.ending import end_unowned_log  # noqa: PLC0415

        try:
            end_unowned_log(self.log, self.store, run)
        except LogUnavailableError as exc:
            # The run is settled: the cancel took, and an error would say it did not. The
            # reaper ends the log once Redis is back (``reconciler._end_open_logs``).
            log.warning("run.log_end_deferred", run_id=run.run_id, error=str(exc))

    def list_runs(
        self,
        *,
        status: str | None = None,
        session_id: str | None = None,
        key_name: str | None = None,
        agent: str | None = None,
        search: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Run]:
        """The newest runs first; of one key's tenant when ``key_name`` is given; of one
        agent (a preset or an inline command's program); whose id holds ``search``."""
        return self.store.list_runs(
            status=status,
            session_id=session_id,
            key_name=key_name,
            agent=agent,
            search=search,
            limit=limit,
            offset=offset,
        )

    # --- output -----------------------------------------------------------------------

    def events(
        self, run_id: str, after: int = 0, *, follow: bool = True
    ) -> Iterator[tuple[int, Chunk]]:
        """The run's chunks after seq ``after``: until the log closes, or what is stored now.

        A log Redis lost is rebuilt from the store first; one that cannot be (its run
        was pruned) raises LogGoneError, never an empty iteration."""
        self.require(run_id)
        if not follow:
            yield from self.log.snapshot(run_id, after_seq=after)
            return
        yield from self.log.read(run_id, after_seq=after)

    def transcript(self, session_id: str) -> list[TranscriptEntry]:
        return self.store.active_path(session_id)


class _StoredLogSource:
    """``driver.replay.StoredLog``, imported when a log is first rebuilt (one Redis lost,
    or the first of a queued run cancelled): reading a log that Redis holds, the usual
    case, needs none of the replay (the agents' translators, the journal format)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._stored: StoredLog | None = None

    def origin(self, run_id: str) -> LogOrigin | None:
        if self._stored is None:
            from turnkeeper.driver.replay import StoredLog  # noqa: PLC0415 - see above

            self._stored = StoredLog(self.store)
        return self._stored.origin(run_id)


_P = ParamSpec("_P")
_R = TypeVar("_R")


class AsyncClient:
    """``Client`` on asyncio: the same methods, awaited; ``events`` is an async iterator.

    It wraps a ``Client`` (``sync``) and shares all its logic: admission, sealing,
    branch checks and cancelling are the sync client's, called on a worker thread
    (``anyio.to_thread``). Why threads, not psycopg's async pool: the store is the one
    place the fencing SQL lives, shared with the workers; an async copy of it would be
    a second place for every invariant to break. Its calls are short (one transaction on
    a pooled connection), so the hop to a thread adds about 0.2 ms at the median
    (``bench/async_client.py``), and anyio's thread limiter bounds how many wait on the
    pool at once. Celery's enqueue is
    sync too. What lasts, the streams, holds no thread: ``events`` reads Redis on
    redis.asyncio (``AsyncRunLog``), with the sync log as its restorer, so a log Redis
    lost is rebuilt from Postgres first, as for ``Client.events``.
    """

    def __init__(self, sync: Client, run_log: AsyncRunLog) -> None:
        self.sync = sync
        self.run_log = run_log
        if run_log.restorer is None:
            run_log.restorer = sync.log

    @classmethod
    def from_settings(cls, settings: Settings) -> AsyncClient:
        """A client on the settings' servers, found as ``Client.from_settings`` finds them."""
        sync = Client.from_settings(settings)
        return cls(sync, AsyncRunLog.from_settings(sync.settings))

    @classmethod
    def from_urls(
        cls, database_url: str, redis_url: str, broker_url: str | None = None, **settings: Any
    ) -> AsyncClient:
        sync = Client.from_urls(database_url, redis_url, broker_url, **settings)
        return cls(sync, AsyncRunLog.from_settings(sync.settings))

    @property
    def settings(self) -> Settings:
        return self.sync.settings

    async def aclose(self) -> None:
        await self.run_log.aclose()
        await self._call(self.sync.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    @staticmethod
    async def _call(function: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        import anyio.to_thread  # noqa: PLC0415 - only the async client hops to threads

        return await anyio.to_thread.run_sync(functools.partial(function, *args, **kwargs))

    # --- runs -------------------------------------------------------------------------

    async def submit(
        self, agent: str | Mapping[str, Any], prompt: str, **options: Unpack[SubmitOptions]
    ) -> Run:
        """As ``Client.submit``: admit a run and enqueue it; idempotent by ``run_id``."""
        return await self._call(self.sync.submit, agent, prompt, **options)

    def session(
        self, session_id: str, agent: str | Mapping[str, Any] = "scripted", **options: Any
    ) -> AsyncSession:
        """As ``Client.session``: ``await session(id).send(prompt)``."""
        return AsyncSession(self, check_id(session_id, "session_id"), agent, dict(options))

    async def get(self, run_id: str) -> Run | None:
        return await self._call(self.sync.get, run_id)

    async def require(self, run_id: str) -> Run:
        return await self._call(self.sync.require, run_id)

    async def cancel(self, run_id: str) -> Run:
        """As ``Client.cancel``."""
        return await self._call(self.sync.cancel, run_id)

    async def list_runs(self, **filters: Unpack[RunFilters]) -> list[Run]:
        """As ``Client.list_runs``: the newest runs first."""
        return await self._call(self.sync.list_runs, **filters)

    # --- output -----------------------------------------------------------------------

    async def events(
        self, run_id: str, after: int = 0, *, follow: bool = True
    ) -> AsyncIterator[tuple[int, Chunk]]:
        """As ``Client.events``: the chunks after seq ``after``, until the log closes
        (``follow``), or what is stored now. One reader follows the run across takeovers:
        a new owner appends after the last chunk the old one landed, never again."""
        await self.require(run_id)
        if not follow:
            for event in await self.run_log.snapshot(run_id, after_seq=after):
                yield event
            return
        async for event in self.run_log.read(run_id, after_seq=after):
            yield event

    async def transcript(self, session_id: str) -> list[TranscriptEntry]:
        return await self._call(self.sync.transcript, session_id)
