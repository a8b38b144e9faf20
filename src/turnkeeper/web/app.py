"""The ASGI app: submit, status, cancel, transcript, the resumable SSE stream, the dashboard.

``turnkeeper.web:app`` reads the settings when it starts (``uvicorn
turnkeeper.web:app``); ``create_app(settings)`` builds one for tests and for
embedding in another ASGI app. Store and broker calls are synchronous, so their
endpoints run in the threadpool; the stream reads Redis on asyncio.

Access: every route needs ``Authorization: Bearer KEY`` (``turnkeeper keys
create``) except ``/healthz``, the dashboard's pages and files, and a run's
event stream opened with the signed, expiring token its ``stream_url`` carries.
A run belongs to the key that submitted it (``turnkeeper.web.auth``); what a key
may run is the agent catalog's business (``turnkeeper.agents.catalog``). The
design is in ``docs/architecture.md`` ("API access and the server secret").
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnkeeper.config import Settings, load_settings
from turnkeeper.embedded import resolve_services
from turnkeeper.errors import (
    AgentError,
    ApiKeyError,
    AuthenticationError,
    AuthorizationHeaderError,
    ConfigError,
    EmptyPromptError,
    InvalidInputError,
    LogGoneError,
    LogOffsetError,
    MethodNotAllowedError,
    NotPermittedError,
    PromptTooLongError,
    QuotaExceededError,
    RunConflictError,
    RunNotFoundError,
    ServiceError,
    SessionDeletedError,
    SessionNotFoundError,
    TurnkeeperError,
    UnsupportedMediaTypeError,
)
from turnkeeper.logconfig import configure_logging
from turnkeeper.store.records import check_id
from turnkeeper.web.agui import agui_router
from turnkeeper.web.durable import (
    DEFAULT_LONG_POLL_SECONDS,
    DEFAULT_SSE_SECONDS,
    durable_router,
)
from turnkeeper.web.edge import (
    BodyLimit,
    OriginCheck,
    SecurityHeaders,
    TrustedHosts,
    redact_access_log,
)
from turnkeeper.web.fanout import FanOutLimits
from turnkeeper.web.routes import api_router
from turnkeeper.web.state import WebState

log = structlog.get_logger(__name__)

STATIC_DIR = Path(str(files("turnkeeper.web") / "static"))

_STATUS_BY_ERROR: tuple[tuple[type[TurnkeeperError], int], ...] = (
    (AuthenticationError, 401),
    (UnsupportedMediaTypeError, 415),
    (PromptTooLongError, 413),
    (EmptyPromptError, 422),
    (ApiKeyError, 401),  # revoked between the request's lookup and its admission
    (NotPermittedError, 403),
    (MethodNotAllowedError, 405),
    (RunNotFoundError, 404),
    (SessionNotFoundError, 404),
    (QuotaExceededError, 429),
    (LogGoneError, 410),
    (RunConflictError, 409),
    (SessionDeletedError, 409),
    (LogOffsetError, 400),
    (InvalidInputError, 400),
    (AgentError, 400),
    (ConfigError, 400),
    (ServiceError, 503),
)
_NO_CREDENTIAL = frozenset({"missing-key", "missing"})
_HTTP_REASONS = {404: "not-found", 405: "method-not-allowed"}
_UNAVAILABLE = "a service turnkeeper depends on is unavailable; retry later"


def status_of(exc: TurnkeeperError) -> int:
    for kind, status in _STATUS_BY_ERROR:
        if isinstance(exc, kind):
            return status
    return 500


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
    ping_seconds: float = 15.0,
    long_poll_seconds: float = DEFAULT_LONG_POLL_SECONDS,
    sse_seconds: float = DEFAULT_SSE_SECONDS,
    fanout_limits: FanOutLimits | None = None,
) -> FastAPI:
    """The web app on ``settings`` (read from the environment at startup when None).
    ``long_poll_seconds`` and ``sse_seconds`` bound a Durable Streams live read
    (``turnkeeper.web.durable``).

    A server that runs it through ``turnkeeper.web.serve.DrainingServer`` ends its
    event streams cleanly when it shuts down (``app.state.drain_streams``)."""
    edge_settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings
        if resolved is None:
            configure_logging(edge_settings.log_level, edge_settings.log_format)
            resolved, _ = resolve_services(edge_settings, start=False)
        redact_access_log()
        app.state.web = WebState.open(resolved, fanout_limits)
        app.state.drain_streams = app.state.web.fanout.drain
        app.state.web.revocations.start()
        log.info("web.started", namespace=resolved.namespace)
        try:
            yield
        finally:
            await app.state.web.aclose()

    app = FastAPI(
        title="turnkeeper",
        summary="Enqueue AI-agent runs and follow their output, resumably.",
        lifespan=lifespan,
        docs_url=None,  # the interactive docs load scripts from a CDN: the CSP forbids them
        redoc_url=None,
        openapi_url=None,  # served by the API router, behind a key
    )
    # Outermost last: headers on every response, then Host, Origin and body checks.
    app.add_middleware(BodyLimit, max_bytes=edge_settings.max_body_bytes)
    app.add_middleware(OriginCheck)
    app.add_middleware(TrustedHosts, allowed_hosts=edge_settings.trusted_hosts)
    app.add_middleware(_RequestTimer)
    app.add_middleware(SecurityHeaders)
    _install_error_handlers(app)
    app.include_router(api_router(ping_seconds=ping_seconds))
    app.include_router(agui_router(ping_seconds=ping_seconds))
    app.include_router(
        durable_router(
            ping_seconds=ping_seconds,
            long_poll_seconds=long_poll_seconds,
            sse_seconds=sse_seconds,
        )
    )
    _add_dashboard(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TurnkeeperError)
    async def turnkeeper_error(_: Request, exc: TurnkeeperError) -> JSONResponse:
        status = status_of(exc)
        headers: dict[str, str] = {}
        if status >= 500:
            # Database and driver text stays in the log, never in a response.
            log.warning("web.request.failed", error=str(exc))
            unavailable = status == 503
            body = {
                "error": _UNAVAILABLE if unavailable else "internal error",
                "reason": "unavailable" if unavailable else "internal-error",
            }
            return JSONResponse(body, status_code=status)
        if exc.reason == "invalid-value":  # the database refused a value: its words stay here
            log.info("web.request.refused_value", error=str(exc))
            body = {"error": "a value was refused by the store", "reason": exc.reason}
            return JSONResponse(body, status_code=status)
        if status == 401:
            # RFC 6750 §3.1: no error code when no credential came; a header that is not
            # `Bearer KEY` is an invalid request; any other key (malformed, unknown,
            # revoked) an invalid token.
            error: str | None = "invalid_token"
            if exc.reason in _NO_CREDENTIAL:
                error = None
            elif isinstance(exc, AuthorizationHeaderError):
                error = "invalid_request"
            challenge = 'Bearer realm="turnkeeper"' + (f', error="{error}"' if error else "")
            headers["WWW-Authenticate"] = challenge
        if status == 429:
            headers["Retry-After"] = str(exc.fields.get("retry_after", 1))
        if status == 405:
            headers["Allow"] = str(exc.fields.get("allow", "GET, HEAD"))
        body = {"error": exc.message, **{k: str(v) for k, v in exc.context().items()}}
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths, wrong methods, unparsable bodies: in the shape of every other error.
        reason = _HTTP_REASONS.get(exc.status_code, "invalid-request")
        return JSONResponse(
            {"error": str(exc.detail), "reason": reason},
            status_code=exc.status_code,
            headers=exc.headers,
        )

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


def _add_dashboard(app: FastAPI) -> None:
    """The dashboard's pages hold no data: they call the API with the key the user
    gave the login page (kept in sessionStorage)."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    no_store = {"Cache-Control": "no-store"}

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers=no_store)

    @app.get("/login", include_in_schema=False)
    def login_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "login.html", headers=no_store)

    @app.get("/ui/runs/{run_id:path}", include_in_schema=False)
    def run_page(run_id: str) -> FileResponse:
        check_id(run_id, "run_id")
        return FileResponse(STATIC_DIR / "run.html", headers=no_store)

    @app.get("/ui/fleet", include_in_schema=False)
    def fleet_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "fleet.html", headers=no_store)

    @app.get("/ui/sessions/{session_id:path}", include_in_schema=False)
    def session_page(session_id: str) -> FileResponse:
        check_id(session_id, "session_id")
        return FileResponse(STATIC_DIR / "session.html", headers=no_store)
