"""The Python API a web app (or a script) calls to enqueue runs and follow them.

Synchronous and thread-safe, so any framework can call it without an event loop:

    client = Client.from_settings(load_settings())
    run = client.submit("scripted", "tidy the repo", session_id=user.conversation_id)
    for seq, chunk in client.events(run.run_id):
        ...

``submit`` is idempotent by ``run_id``: the same id with the same request returns
the existing run; a different request under that id is a ``RunConflictError``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from celery import Celery
from uuid6 import uuid7

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.output import end_log
from turnkeeper.errors import InvalidInputError, RunNotFoundError
from turnkeeper.log import RunLog
from turnkeeper.store.records import Run, RunStatus, TranscriptEntry
from turnkeeper.store.store import Store
from turnkeeper.tasks import create_app, enqueue_run


class Client:
    def __init__(self, settings: Settings, *, store: Store, log: RunLog, app: Celery) -> None:
        self.settings = settings
        self.store = store
        self.log = log
        self.app = app

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """A client on the settings' servers (both URLs must be set)."""
        return cls(
            settings,
            store=Store(settings.require_database_url(), pool_size=5),
            log=RunLog.from_settings(settings),
            app=create_app(settings),
        )

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
    ) -> Run:
        """Admit a run and enqueue it; idempotent by ``run_id``.

        ``agent`` is a preset name (``scripted``, ``claude-code``, ``codex``) or an
        agent spec (``{"command": [...], "format": ..., "env": {...}}``). ``env``
        adds variables to the agent's minimal environment: nothing else of this
        process's environment reaches it.
        """
        spec = AgentSpec.from_payload(agent if isinstance(agent, str) else dict(agent))
        if env:
            spec = spec.model_copy(update={"env": {**spec.env, **dict(env)}})
            spec = AgentSpec.from_payload(spec.to_payload())  # validate the merged env
        if not isinstance(prompt, str):
            raise InvalidInputError("prompt must be a string", reason="invalid-prompt")
        if provider is not None and provider not in ("local", "bwrap", "ssh"):
            raise InvalidInputError(
                f"unknown sandbox provider {provider!r}; known: local, bwrap, ssh",
                reason="invalid-provider",
            )
        run_id = run_id or str(uuid7())
        payload = {"agent": spec.to_payload(), "prompt": prompt, "provider": provider}
        run, created = self.store.admit_run(
            run_id,
            session_id or run_id,
            payload,
            max_attempts=max_attempts or self.settings.max_attempts,
            deadline=timeout or self.settings.run_timeout,
        )
        if created or run.status is RunStatus.QUEUED:
            enqueue_run(self.app, self.settings, run_id)
            self.store.mark_dispatched(run_id)
        return run

    def get(self, run_id: str) -> Run | None:
        return self.store.get_run(run_id)

    def require(self, run_id: str) -> Run:
        run = self.store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"no run has the id {run_id!r}", run_id=run_id)
        return run

    def cancel(self, run_id: str) -> Run:
        """Abort a queued run at once; a running one stops within one heartbeat."""
        before = self.require(run_id)
        run = self.store.request_cancel(run_id)
        if run is None:
            return self.require(run_id)
        if before.status is RunStatus.QUEUED and run.status is RunStatus.ABORTED:
            # Nobody owns it to end its log: do it here, fenced above any epoch it had.
            self.log.fence(run_id, run.epoch + 1)
            end_log(self.log, run_id, run.epoch + 1, lifecycle.cancelled())
        return run

    def list_runs(
        self, *, status: str | None = None, session_id: str | None = None, limit: int = 50
    ) -> list[Run]:
        return self.store.list_runs(status=status, session_id=session_id, limit=limit)

    # --- output -----------------------------------------------------------------------

    def events(
        self, run_id: str, after: int = 0, *, follow: bool = True
    ) -> Iterator[tuple[int, Chunk]]:
        """The run's chunks after seq ``after``: until the log closes, or what is stored now."""
        self.require(run_id)
        if not follow:
            yield from self.log.snapshot(run_id, after_seq=after)
            return
        yield from self.log.read(run_id, after_seq=after)

    def transcript(self, session_id: str) -> list[TranscriptEntry]:
        return self.store.active_path(session_id)
