"""The API's routes: runs, their event streams, sessions' transcripts, the service.

Every route but ``/healthz`` and a token-bearing event stream takes the caller's
key (``auth.authenticate``); a run another key owns is a 404, exactly like a
run that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.message
import re
from collections.abc import AsyncGenerator, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import anyio
import structlog
from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError
from sse_starlette import EventSourceResponse

from turnkeeper.agents.spec import AgentSpec, require_prompt
from turnkeeper.errors import (
    InvalidInputError,
    ServiceError,
    SessionNotFoundError,
    TurnkeeperError,
    UnsupportedMediaTypeError,
)
from turnkeeper.hosts import fleet_view
from turnkeeper.log.quota import STREAM_RENEW_SECONDS
from turnkeeper.store.fleet import MAX_MINUTES
from turnkeeper.store.records import (
    Run,
    RunStatus,
    RunWindow,
    check_id,
    check_key_name,
    check_status,
)
from turnkeeper.store.store import Store
from turnkeeper.web import sse
from turnkeeper.web.auth import Principal, authenticate, authorize_stream, require_visible
from turnkeeper.web.fanout import DRAIN_GRACE_SECONDS, is_chunk_frame
from turnkeeper.web.fleet import fleet_page
from turnkeeper.web.views import attempt_views, entry_view, events_path, run_listing, run_view

if TYPE_CHECKING:
    from turnkeeper.web.state import WebState

log = structlog.get_logger(__name__)

MAX_LIST_LIMIT = 1000
MAX_LIST_OFFSET = 10_000_000
_COUNT = re.compile(r"[0-9]{1,7}")

Event = TypeVar("Event")


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names JSON (``application/json``, ``application/*+json``),
    as FastAPI decides whether to read a body as JSON."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def require_json(request: Request) -> None:
    """A body route's check, after its key's: a body FastAPI would not read as JSON is
    a 415 saying so, not a validation error about the bytes it read instead."""
    if not is_json(request.headers.get("content-type")):
        raise UnsupportedMediaTypeError(
            "the request body must be JSON, sent with `Content-Type: application/json`",
            reason="unsupported-media-type",
        )


Caller = Annotated[Principal, Depends(authenticate)]
JsonBody = Annotated[None, Depends(require_json)]


class SessionRunRequest(BaseModel):
    """The body of ``POST /sessions/{session_id}/runs``, a message of the session.
    ``agent`` names an agent of the catalog; an inline spec (an object) needs a key
    created with ``--allow-commands``. The other fields can only tighten what the
    catalog and the settings allow."""

    model_config = ConfigDict(extra="forbid", strict=True)

    agent: str | dict[str, Any] = Field(description="A catalog name, or an inline agent spec.")
    prompt: str
    run_id: str | None = None
    parent_entry_id: str | None = Field(
        default=None,
        description="An earlier transcript entry the message follows instead of the latest "
        "(a branch: a retry, an edited message).",
    )
    env: dict[str, str] | None = None
    provider: Literal["local", "bwrap", "ssh"] | None = None
    max_attempts: int | None = Field(default=None, ge=1)
    timeout: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        """JSON's ``\\ud800`` escapes decode to lone surrogates, which no UTF-8 store,
        log or sandbox can hold: refused here, with every other malformed body."""
        if has_lone_surrogate(data):
            raise PydanticCustomError(
                "lone_surrogate", "a string of the body holds a lone UTF-16 surrogate"
            )
        return data


class SubmitRequest(SessionRunRequest):
    """The body of ``POST /runs``: a run of ``session_id`` (a session of its own when
    None)."""

    session_id: str | None = None


def has_lone_surrogate(value: Any) -> bool:
    """Whether a decoded JSON value holds a string (or key) UTF-8 cannot encode."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            pending += item
    return False


def parse_count(raw: str | None, name: str, *, default: int, most: int) -> int:
    """A query count: ASCII digits only (no signs, spaces, '_' or other scripts' digits)."""
    if raw is None:
        return default
    if _COUNT.fullmatch(raw) is None or not 1 <= int(raw) <= most:
        raise InvalidInputError(
            f"{name} must be an integer from 1 to {most}, got {raw[:20]!r}",
            reason=f"invalid-{name}",
        )
    return int(raw)


def parse_index(raw: str | None, name: str, *, most: int) -> int:
    """A query position: ASCII digits only, from 0 to ``most`` (0 when absent)."""
    if raw is None:
        return 0
    if _COUNT.fullmatch(raw) is None or int(raw) > most:
        raise InvalidInputError(
            f"{name} must be an integer from 0 to {most}, got {raw[:20]!r}",
            reason=f"invalid-{name}",
        )
    return int(raw)


def parse_time(raw: str | None, name: str) -> datetime | None:
    """A query time: ISO 8601 with its zone (``Z`` or an offset); a naive one would be
    read in the database session's zone."""
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw) if len(raw) <= 40 else None
    except ValueError:
        value = None
    if value is None or value.utcoffset() is None:
        raise InvalidInputError(
            f"{name} must be an ISO 8601 time with its zone, got {raw[:40]!r}",
            reason=f"invalid-{name.replace('_', '-')}",
        )
    return value


def api_router(*, ping_seconds: float) -> APIRouter:
    api = APIRouter()
    # The event route first: `/runs/{run_id:path}` would otherwise swallow `.../events`.
    _add_event_route(api, ping_seconds=ping_seconds)
    _add_run_routes(api)
    _add_session_routes(api)
    _add_service_routes(api)
    return api


def _state(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


def _described(request: Request, principal: Principal, run: Run) -> dict[str, Any]:
    state = _state(request)
    store = state.client.store
    view = run_view(
        run,
        store.get_turn_slot(run.run_id),
        store.database_now(),
        _waiting_behind(store, run),
        owners=principal.admin,
    )
    token = state.tokens.issue(run.run_id)
    view["stream_url"] = events_path(request.scope.get("root_path", ""), run.run_id, token)
    return view


def _waiting_behind(store: Store, run: Run) -> int | None:
    return store.waiting_behind(run.run_id) if run.status is RunStatus.QUEUED else None


def _visible_run(request: Request, principal: Principal, run_id: str) -> Run:
    check_id(run_id, "run_id")
    return require_visible(principal, _state(request).client.get(run_id), run_id)


def submit(request: Request, principal: Principal, body: SubmitRequest) -> dict[str, Any]:
    """Admit ``body`` as the principal's run and describe it with its stream URL."""
    return _described(request, principal, admit(request, principal, body))


def admit(request: Request, principal: Principal, body: SubmitRequest) -> Run:
    """Admit ``body`` as the principal's run (the catalog, the key's rights and its rate
    decide) and enqueue it; an identical replay returns the run admitted before."""
    state = _state(request)
    checked = (
        (body.run_id, "run_id"),
        (body.session_id, "session_id"),
        (body.parent_entry_id, "parent_entry_id"),
    )
    for value, what in checked:
        if value is not None:
            check_id(value, what)
    admission = state.catalog.admit(
        body.agent,
        allow_commands=principal.allow_commands,
        env=body.env,
        provider=body.provider,
        timeout=body.timeout,
        max_attempts=body.max_attempts,
    )
    AgentSpec.from_payload(admission.agent).check_prompt(require_prompt(body.prompt))
    state.submit_rate.take(principal.name)  # what would be admitted counts, not refusals
    run = state.client.submit(
        admission.agent,
        body.prompt,
        session_id=body.session_id,
        run_id=body.run_id,
        env=admission.env,
        provider=admission.provider,
        max_attempts=admission.max_attempts,
        timeout=admission.timeout,
        key_name=principal.name,
        from_entry=body.parent_entry_id,
    )
    log.info("web.run.submitted", run_id=run.run_id, key_name=principal.name)
    return run


def _add_run_routes(api: APIRouter) -> None:
    @api.post("/runs", status_code=201, tags=["runs"])
    def submit_run(
        body: SubmitRequest, request: Request, principal: Caller, _: JsonBody
    ) -> dict[str, Any]:
        """Admit a run and enqueue it; idempotent by ``run_id``. Returns it with its stream URL."""
        return submit(request, principal, body)

    @api.get("/runs", tags=["runs"])
    def list_runs(
        request: Request,
        principal: Caller,
        *,
        status: str | None = None,
        session_id: str | None = None,
        agent: str | None = None,
        key: str | None = None,
        search: str | None = None,
        created_since: str | None = None,
        created_until: str | None = None,
        finished_since: str | None = None,
        finished_until: str | None = None,
        limit: str | None = None,
        offset: str | None = None,
    ) -> dict[str, Any]:
        """The newest runs first (the key's own; every run for an admin key), of one
        ``status``, ``session_id``, ``agent`` (a preset, or an inline command's program)
        and ``key`` (an admin key's filter), whose id holds ``search`` (any case),
        created and finished within the given times (ISO 8601, ``since`` included,
        ``until`` not); ``limit`` runs after the first ``offset``, and ``total``, how
        many match (at most 10,000: ``total_exact`` is false past it)."""
        count = parse_count(limit, "limit", default=50, most=MAX_LIST_LIMIT)
        skip = parse_index(offset, "offset", most=MAX_LIST_OFFSET)
        for value, what in ((session_id, "session_id"), (agent, "agent"), (search, "search")):
            if value is not None:
                check_id(value, what)
        if key is not None:
            check_key_name(key)
            if key != principal.name:
                principal.require_admin("the key filter of another key's runs")
        if status is not None:
            check_status(status)
        window = RunWindow(
            created_since=parse_time(created_since, "created_since"),
            created_until=parse_time(created_until, "created_until"),
            finished_since=parse_time(finished_since, "finished_since"),
            finished_until=parse_time(finished_until, "finished_until"),
        )
        filters: dict[str, Any] = {
            "status": status,
            "session_id": session_id,
            "agent": agent,
            "search": search,
            "key_name": key if key is not None else principal.tenant_filter,
            "window": window,
        }
        store = _state(request).client.store
        return run_listing(store, filters, limit=count, offset=skip, owners=principal.admin)

    @api.post("/runs/{run_id:path}/cancel", tags=["runs"])
    def cancel_run(run_id: str, request: Request, principal: Caller) -> dict[str, Any]:
        """Cancel a run: one nobody drives is settled at once; a running one is stopped by
        its owner, which hears of the cancel when it commits."""
        _visible_run(request, principal, run_id)
        return _described(request, principal, _state(request).client.cancel(run_id))

    @api.get("/runs/{run_id:path}", tags=["runs"])
    def get_run(run_id: str, request: Request, principal: Caller) -> dict[str, Any]:
        """A run's status, phase, epoch, owner, lease, its stream URL, its prompt, and
        its attempts (each with where a takeover's attempt began in the log)."""
        run = _visible_run(request, principal, run_id)
        view = _described(request, principal, run)
        view["prompt"] = run.payload.get("prompt") if isinstance(run.payload, dict) else None
        attempts = _state(request).client.store.attempts(run.run_id)
        view["attempts"] = attempt_views(attempts, owners=principal.admin)
        return view

    @api.get("/sessions/{session_id:path}/transcript", tags=["sessions"])
    def transcript(session_id: str, request: Request, principal: Caller) -> dict[str, Any]:
        """The session's committed conversation, oldest entry first."""
        check_id(session_id, "session_id")
        client = _state(request).client
        exists, tenant = client.store.session_tenant(session_id)
        if not exists or not principal.sees(tenant):
            raise SessionNotFoundError(
                f"no session has the id {session_id!r}", session_id=session_id
            )
        entries = client.transcript(session_id)
        return {"session_id": session_id, "entries": [entry_view(e) for e in entries]}


def visible_session(request: Request, principal: Principal, session_id: str) -> bool:
    """Whether the session exists; the same 404 for one of another tenant's as for none."""
    check_id(session_id, "session_id")
    exists, tenant = _state(request).client.store.session_tenant(session_id)
    if exists and not principal.sees(tenant):
        raise SessionNotFoundError(f"no session has the id {session_id!r}", session_id=session_id)
    return exists


def _add_session_routes(api: APIRouter) -> None:
    @api.post("/sessions/{session_id:path}/runs", status_code=201, tags=["sessions"])
    def send(
        session_id: str,
        body: SessionRunRequest,
        request: Request,
        principal: Caller,
        _: JsonBody,
    ) -> dict[str, Any]:
        """A message of the session: a run that continues its conversation, queued
        behind the session's active run (``waiting_behind``); the first one opens the
        session. Idempotent by ``run_id``."""
        visible_session(request, principal, session_id)
        return submit(request, principal, SubmitRequest(**dict(body), session_id=session_id))

    @api.get("/sessions/{session_id:path}", tags=["sessions"])
    def session(session_id: str, request: Request, principal: Caller) -> dict[str, Any]:
        """The session's transcript tree (every entry, oldest first, each with its parent
        and whether it is on the active path, root to leaf) and its runs, oldest first."""
        if not visible_session(request, principal, session_id):
            raise SessionNotFoundError(
                f"no session has the id {session_id!r}", session_id=session_id
            )
        client = _state(request).client
        store = client.store
        active = [entry.entry_id for entry in client.transcript(session_id)]
        on_path = set(active)
        entries = [
            {**entry_view(entry), "active": entry.entry_id in on_path}
            for entry in store.session_entries(session_id)
        ]
        runs = client.list_runs(session_id=session_id, key_name=principal.tenant_filter, limit=1000)
        now = store.database_now()
        return {
            "session_id": session_id,
            "leaf_id": active[-1] if active else None,
            "active_path": active,
            "entries": entries,
            "runs": [
                run_view(
                    run,
                    store.get_turn_slot(run.run_id),
                    now,
                    _waiting_behind(store, run),
                    owners=principal.admin,
                )
                for run in reversed(runs)
            ],
        }


def _add_event_route(api: APIRouter, *, ping_seconds: float) -> None:
    @api.get("/runs/{run_id:path}/events", tags=["runs"], response_class=EventSourceResponse)
    async def run_events(
        run_id: str,
        request: Request,
        offset: str | None = None,
        token: str | None = None,
        last_event_id: str | None = Header(default=None),
    ) -> EventSourceResponse:
        """The run's chunks as SSE after ``Last-Event-ID`` or ``?offset=``, until the log
        closes. Opened with the run's stream token, or with a key that may see the run."""
        state = _state(request)
        check_id(run_id, "run_id")
        after = sse.parse_offset(last_event_id, offset)
        run, principal = await authorize_stream(request, run_id, token)
        sse.check_start(run, await state.run_log.state(run_id), after)
        # Streams count against the caller's key, or the run's owner for a token
        # (a trusted client's run, owned by no key, is not counted).
        charged = principal.name if principal is not None else run.key_name
        if state.fanout.closed:
            raise ServiceError("the web server is shutting down", reason="shutting-down")
        subscription = state.fanout.subscribe(
            run_id, after, on_first_event=state.metrics.first_event_seconds.observe
        )
        return sse.CuttableEventSourceResponse(
            await _counted(state, subscription.frames(), charged, _is_chunk_frame),
            cut=subscription.cut,
            ping=ping_seconds,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            # Under `turnkeeper web`, sse-starlette sees the shutdown too: it lets the
            # fan-out end the stream cleanly before it cancels it.
            shutdown_grace_period=DRAIN_GRACE_SECONDS,
        )


async def counted_events(
    state: WebState, run_id: str, after: int, charged: str | None
) -> AsyncGenerator[dict[str, Any], None]:
    """The run's SSE events after ``after`` (``sse.events``), counted as one of
    ``charged``'s streams (a slot is taken now: 429 past the key's cap) and ended by
    that key's revocation; ``charged`` None: a trusted client's run, not counted.

    For a client that needs the chunks themselves (AG-UI): its own read of the log, on
    the feeds' pool. ``GET /runs/{id}/events`` shares one read per run
    (``turnkeeper.web.fanout``)."""
    source = sse.events(
        state.fanout.feed_log,
        run_id,
        after,
        on_first_event=state.metrics.first_event_seconds.observe,
    )
    return await _counted(state, source, charged, _is_chunk_event)


def _is_chunk_event(event: dict[str, Any] | bytes) -> bool:
    return isinstance(event, dict) and "id" in event


def _is_chunk_frame(event: dict[str, Any] | bytes) -> bool:
    return isinstance(event, bytes) and is_chunk_frame(event)


async def _counted(
    state: WebState,
    source: AsyncGenerator[Event, None],
    charged: str | None,
    is_chunk: Callable[[Any], bool],
) -> AsyncGenerator[Event | dict[str, Any], None]:
    """``source`` counted as one of ``charged``'s streams and ended by its revocation."""
    slot = None if charged is None else (charged, await state.stream_slots.acquire(charged))
    metrics = state.metrics

    async def renew_slot(key_name: str, slot_id: str) -> None:
        while True:
            await asyncio.sleep(STREAM_RENEW_SECONDS)
            await state.stream_slots.renew(key_name, slot_id)

    async def stream() -> AsyncGenerator[Event | dict[str, Any], None]:
        metrics.streams.opened()
        renewer = None if slot is None else asyncio.create_task(renew_slot(*slot))
        try:
            with contextlib.ExitStack() as watching:
                events: AsyncGenerator[Event | dict[str, Any], None] = source
                if charged is not None:
                    revoked = watching.enter_context(state.revocations.watch(charged))
                    events = sse.until_revoked(source, revoked, charged)
                async for event in events:
                    if is_chunk(event):
                        metrics.events_sent.inc()
                    yield event
        finally:
            metrics.streams.closed()
            if renewer is not None:
                renewer.cancel()
            if slot is not None:
                await _release(state, *slot)

    return stream()


async def _release(state: WebState, key_name: str, slot: str) -> None:
    # Shielded: a client that went away cancels the stream, and this runs in its cleanup.
    with anyio.CancelScope(shield=True):
        try:
            await state.stream_slots.release(key_name, slot)
        except TurnkeeperError as exc:  # the slot lapses on its own within a minute
            log.warning("sse.slot.release_failed", key_name=key_name, error=str(exc))


def _add_service_routes(api: APIRouter) -> None:
    @api.get("/healthz", tags=["service"])
    def healthz(request: Request) -> JSONResponse:
        """200 when the database and Redis answer, else 503 saying which does not."""
        state = _state(request)
        checks: dict[str, str] = {}
        try:
            state.client.store.database_now()
            checks["database"] = "ok"
        except TurnkeeperError:
            checks["database"] = "unavailable"
        try:
            state.client.log.client.ping()
            checks["redis"] = "ok"
        except Exception:  # noqa: BLE001 - any Redis failure is reported, not raised
            checks["redis"] = "unavailable"
        healthy = all(value == "ok" for value in checks.values())
        return JSONResponse(
            {"status": "ok" if healthy else "unavailable", **checks},
            status_code=200 if healthy else 503,
        )

    @api.get("/key", tags=["service"])
    def calling_key(principal: Caller) -> dict[str, Any]:
        """The key the request came with: its name and scopes."""
        return {
            "name": principal.name,
            "admin": principal.admin,
            "allow_commands": principal.allow_commands,
            "max_running": principal.max_running,
        }

    @api.get("/metrics", tags=["service"], response_class=Response)
    def metrics(request: Request, principal: Caller) -> Response:
        """Prometheus metrics of the whole fleet (an admin key's; see turnkeeper.web.metrics)."""
        principal.require_admin("/metrics")
        body = generate_latest(_state(request).metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @api.get("/fleet/hosts", tags=["service"])
    def fleet_hosts(request: Request, principal: Caller) -> dict[str, Any]:
        """The fleet's hosts, their worker processes and the sandboxes they hold (an
        admin key's), what `turnkeeper hosts --json` lists, under ``hosts``."""
        principal.require_admin("/fleet/hosts")
        state = _state(request)
        return {"hosts": fleet_view(state.client.store, state.settings)}

    @api.get("/fleet", tags=["service"])
    def fleet(request: Request, principal: Caller, minutes: str | None = None) -> dict[str, Any]:
        """What the fleet page shows (an admin key's): workers, their slots and the runs
        they own with their leases; the queues' depths; runs started and settled, and
        takeovers, per minute over the last ``minutes`` (60 by default); the takeover
        latency histogram; open event streams (see turnkeeper.web.fleet)."""
        principal.require_admin("/fleet")
        window = parse_count(minutes, "minutes", default=60, most=MAX_MINUTES)
        return fleet_page(_state(request), window)

    @api.get("/openapi.json", tags=["service"], include_in_schema=False)
    def openapi(request: Request, _: Caller) -> JSONResponse:
        return JSONResponse(request.app.openapi())
