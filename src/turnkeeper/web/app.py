"""The ASGI app: submit, status, cancel, transcript, the resumable SSE stream, the dashboard.

``turnkeeper.web:app`` reads the settings when it starts (``uvicorn
turnkeeper.web:app``); ``create_app(settings)`` builds one for tests and for
embedding in another ASGI app. Store and broker calls are synchronous, so their
endpoints run in the threadpool; the stream reads Redis on asyncio.

Access: the stream of a run needs the signed, expiring token that ``POST /runs``
and ``GET /runs/{id}`` put in its ``stream_url``. The other endpoints are meant
for the web app's backend and operators on a trusted network; pass ``auth`` (a
FastAPI dependency that raises to refuse) to guard every endpoint with the
app's own authentication instead, tokens then being unneeded.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import structlog
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnkeeper.client import Client
from turnkeeper.config import Settings, load_settings
from turnkeeper.embedded import resolve_services
from turnkeeper.errors import (
    AccessDeniedError,
    AgentError,
    ConfigError,
    InvalidInputError,
    LogGoneError,
    LogOffsetError,
    RunConflictError,
    RunNotFoundError,
    ServiceError,
    TurnkeeperError,
)
from turnkeeper.log import AsyncRunLog, RunLog
from turnkeeper.logconfig import configure_logging
from turnkeeper.store.records import check_id
from turnkeeper.web import sse
from turnkeeper.web.metrics import WebMetrics
from turnkeeper.web.tokens import StreamTokens, server_secret
from turnkeeper.web.views import entry_view, events_path, run_view

log = structlog.get_logger(__name__)

STATIC_DIR = Path(str(files("turnkeeper.web") / "static"))
# Each open stream parks one Redis connection in XREAD BLOCK; past this many, new streams get 503.
MAX_REDIS_CONNECTIONS = 4096

_STATUS_BY_ERROR: tuple[tuple[type[TurnkeeperError], int], ...] = (
    (RunNotFoundError, 404),
    (AccessDeniedError, 403),
    (LogGoneError, 410),
    (RunConflictError, 409),
    (LogOffsetError, 400),
    (InvalidInputError, 400),
    (AgentError, 400),
    (ConfigError, 400),
    (ServiceError, 503),
)


def status_of(exc: TurnkeeperError) -> int:
    for kind, status in _STATUS_BY_ERROR:
        if isinstance(exc, kind):
            return status
    return 500


class SubmitRequest(BaseModel):
    """The body of ``POST /runs``: what ``Client.submit`` takes."""

    model_config = ConfigDict(extra="forbid")

    agent: str | dict[str, Any] = Field(description="A preset name or an agent spec.")
    prompt: str
    session_id: str | None = None
    run_id: str | None = None
    env: dict[str, str] | None = None
    provider: Literal["local", "bwrap", "ssh"] | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=100)
    timeout: float | None = Field(default=None, gt=0)


@dataclass
class WebState:
    """What the endpoints share; built when the app starts, closed when it stops."""

    settings: Settings
    client: Client
    run_log: AsyncRunLog
    tokens: StreamTokens
    metrics: WebMetrics

    @classmethod
    def open(cls, settings: Settings) -> WebState:
        return cls(
            settings=settings,
            client=Client.from_settings(settings),
            run_log=AsyncRunLog.from_settings(settings, max_connections=MAX_REDIS_CONNECTIONS),
            tokens=StreamTokens(server_secret(settings), settings.stream_token_ttl),
            metrics=WebMetrics(settings.require_database_url(), RunLog.from_settings(settings)),
        )

    async def aclose(self) -> None:
        self.client.close()
        self.metrics.close()
        await self.run_log.aclose()


class _RequestTimer:
    """Pure ASGI middleware (streams pass through untouched): latency until the response starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state: WebState | None = getattr(scope["app"].state, "web", None)
                route = getattr(scope.get("route"), "path", "unmatched")
                if state is not None:
                    state.metrics.observe_request(
                        scope["method"], route, message["status"], started
                    )
            await send(message)

        await self.app(scope, receive, timed_send)


def create_app(
    settings: Settings | None = None,
    *,
    auth: Callable[..., Any] | None = None,
    ping_seconds: float = 15.0,
) -> FastAPI:
    """The web app on ``settings`` (read from the environment at startup when None)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings
        if resolved is None:
            loaded = load_settings()
            configure_logging(loaded.log_level, loaded.log_format)
            resolved, _ = resolve_services(loaded, start=False)
        app.state.web = WebState.open(resolved)
        log.info("web.started", namespace=resolved.namespace)
        try:
            yield
        finally:
            await app.state.web.aclose()

    app = FastAPI(
        title="turnkeeper",
        summary="Enqueue AI-agent runs and follow their output, resumably.",
        lifespan=lifespan,
    )
    app.add_middleware(_RequestTimer)
    _install_error_handlers(app)
    api = APIRouter(dependencies=[Depends(auth)] if auth is not None else [])
    _add_run_routes(api, tokens_required=auth is None, ping_seconds=ping_seconds)
    _add_service_routes(api)
    app.include_router(api)
    _add_dashboard(app)
    return app


def _web(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TurnkeeperError)
    async def turnkeeper_error(_: Request, exc: TurnkeeperError) -> JSONResponse:
        status = status_of(exc)
        if status >= 500:
            log.warning("web.request.failed", error=str(exc))
        body = {"error": exc.message, **{k: str(v) for k, v in exc.context().items()}}
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
            problems.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
        return JSONResponse(
            {"error": "; ".join(problems) or "invalid request", "reason": "invalid-request"},
            status_code=400,
        )


def _add_run_routes(api: APIRouter, *, tokens_required: bool, ping_seconds: float) -> None:
    def described(state: WebState, request: Request, run_id: str) -> dict[str, Any]:
        store = state.client.store
        run = state.client.require(run_id)
        view = run_view(run, store.get_turn_slot(run_id), store.database_now())
        token = state.tokens.issue(run_id) if tokens_required else None
        view["stream_url"] = events_path(request.scope.get("root_path", ""), run_id, token)
        return view

    @api.post("/runs", status_code=201, tags=["runs"])
    def submit_run(body: SubmitRequest, request: Request) -> dict[str, Any]:
        """Admit a run and enqueue it; idempotent by ``run_id``. Returns it with its stream URL."""
        state = _web(request)
        for value, what in ((body.run_id, "run_id"), (body.session_id, "session_id")):
            if value is not None:
                check_id(value, what)
        run = state.client.submit(
            body.agent,
            body.prompt,
            session_id=body.session_id,
            run_id=body.run_id,
            env=body.env,
            provider=body.provider,
            max_attempts=body.max_attempts,
            timeout=body.timeout,
        )
        log.info("web.run.submitted", run_id=run.run_id)
        return described(state, request, run.run_id)

    @api.get("/runs", tags=["runs"])
    def list_runs(
        request: Request,
        status: str | None = None,
        session_id: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """The newest runs first, with phase and lease, for operators and the dashboard."""
        state = _web(request)
        store = state.client.store
        runs = state.client.list_runs(status=status, session_id=session_id, limit=limit)
        now = store.database_now()
        views = [run_view(run, store.get_turn_slot(run.run_id), now) for run in runs]
        return {"runs": views, "now": now.isoformat()}

    @api.get("/runs/{run_id:path}/events", tags=["runs"], response_class=EventSourceResponse)
    async def run_events(
        run_id: str,
        request: Request,
        offset: str | None = None,
        token: str | None = None,
        last_event_id: str | None = Header(default=None),
    ) -> EventSourceResponse:
        """The run's chunks as SSE after ``Last-Event-ID`` or ``?offset=``, until the log closes."""
        state = _web(request)
        check_id(run_id, "run_id")
        after = sse.parse_offset(last_event_id, offset)
        if tokens_required:
            state.tokens.verify(token, run_id)
        run = await run_in_threadpool(state.client.require, run_id)
        sse.check_start(run, await state.run_log.state(run_id), after)
        metrics = state.metrics

        async def stream() -> AsyncIterator[dict[str, Any]]:
            metrics.open_streams.inc()
            try:
                async for event in sse.events(
                    state.run_log,
                    run_id,
                    after,
                    on_first_event=metrics.first_event_seconds.observe,
                ):
                    if "id" in event:
                        metrics.events_sent.inc()
                    yield event
            finally:
                metrics.open_streams.dec()

        return EventSourceResponse(
            stream(),
            ping=ping_seconds,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @api.post("/runs/{run_id:path}/cancel", tags=["runs"])
    def cancel_run(run_id: str, request: Request) -> dict[str, Any]:
        """Cancel a run: a queued one at once, a running one within one heartbeat."""
        state = _web(request)
        state.client.cancel(run_id)
        return described(state, request, run_id)

    @api.get("/runs/{run_id:path}", tags=["runs"])
    def get_run(run_id: str, request: Request) -> dict[str, Any]:
        """A run's status, phase, epoch, attempts, owner, lease, and its stream URL."""
        return described(_web(request), request, run_id)

    @api.get("/sessions/{session_id:path}/transcript", tags=["sessions"])
    def transcript(session_id: str, request: Request) -> dict[str, Any]:
        """The session's committed conversation, oldest entry first."""
        entries = _web(request).client.transcript(session_id)
        return {"session_id": session_id, "entries": [entry_view(e) for e in entries]}


def _add_service_routes(api: APIRouter) -> None:
    @api.get("/healthz", tags=["service"])
    def healthz(request: Request) -> JSONResponse:
        """200 when the database and Redis answer, else 503 saying which does not."""
        state = _web(request)
        checks: dict[str, str] = {}
        try:
            state.client.store.database_now()
            checks["database"] = "ok"
        except TurnkeeperError as exc:
            checks["database"] = exc.message
        try:
            state.client.log.client.ping()
            checks["redis"] = "ok"
        except Exception as exc:  # noqa: BLE001 - any Redis failure is reported, not raised
            checks["redis"] = type(exc).__name__
        healthy = all(value == "ok" for value in checks.values())
        return JSONResponse(
            {"status": "ok" if healthy else "unavailable", **checks},
            status_code=200 if healthy else 503,
        )

    @api.get("/metrics", tags=["service"], response_class=Response)
    def metrics(request: Request) -> Response:
        """Prometheus metrics (see turnkeeper.web.metrics for what is and is not covered)."""
        body = generate_latest(_web(request).metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def _add_dashboard(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/ui/runs/{run_id:path}", include_in_schema=False)
    def run_page(run_id: str) -> FileResponse:
        check_id(run_id, "run_id")
        return FileResponse(STATIC_DIR / "run.html", headers={"Cache-Control": "no-store"})
