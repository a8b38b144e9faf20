"""The AG-UI endpoint: ``POST /agui/{agent}`` for ``@ag-ui/client``'s ``HttpAgent``.

The body is AG-UI's ``RunAgentInput``; the answer is ``text/event-stream`` of the
run's log as AG-UI events (docs/api.md, "AG-UI"):

- ``agent`` is a name of the agent catalog, and the request needs a key, as for
  ``POST /runs``; ``threadId`` is the session and ``runId`` the run, so a retried
  POST replays the admission and re-attaches to the same run's stream.
- The prompt is the text of the last message, which must be the user's. The rest
  of ``messages`` is the client's copy of the conversation: the session's own
  transcript is what a follow-up continues. ``tools``, ``context`` and ``state``
  are not passed to the agent.
- ``forwardedProps`` carries only the options the catalog lets a request tighten:
  ``env``, ``provider``, ``timeout`` and ``max_attempts``; anything else is a 400.
- Each event's ``id:`` is its seq, so a POST with ``Last-Event-ID`` resumes the
  stream after it. The stream ends with the run's ``RUN_FINISHED`` or ``RUN_ERROR``;
  a log that cannot be read to its end ends with a ``RUN_ERROR`` of its own.

What a log holds is valid against the AG-UI schemas (translators make it so), but
an ``agui``-format agent writes its own events, and HttpAgent's verifier also
checks their order. :class:`EventGate` lets through only what the verifier
accepts: it closes what is still open before ``RUN_FINISHED`` and turns an event
the verifier would refuse into a ``CUSTOM`` ``turnkeeper.refused_event`` that
carries it, so every seq still reaches the client exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
import structlog
from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from turnkeeper.chunks import Chunk, validate_chunk
from turnkeeper.errors import AgentError, InvalidInputError, RunNotFoundError
from turnkeeper.store.records import Run, check_id
from turnkeeper.web import sse
from turnkeeper.web.auth import Principal, authenticate
from turnkeeper.web.routes import (
    JsonBody,
    SubmitRequest,
    admit,
    counted_events,
    has_lone_surrogate,
    visible_session,
)

if TYPE_CHECKING:
    from turnkeeper.web.state import WebState

log = structlog.get_logger(__name__)

REFUSED_EVENT = "turnkeeper.refused_event"
UNAVAILABLE = "the run's log is unavailable; post again with Last-Event-ID to resume"
MAX_PROBLEMS_SHOWN = 3

# (opener, continuations, closer) of each kind the verifier keeps open.
_TEXT = ("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END")
_TOOL = ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END")
_REASONING = ("REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END")
_SPAN = ("REASONING_START", "REASONING_END")
_STEP = ("STEP_STARTED", "STEP_FINISHED")
_BRACKETS = (
    (_TEXT, "messageId"),
    (_TOOL, "toolCallId"),
    (_REASONING, "messageId"),
    (_SPAN, "messageId"),
    (_STEP, "stepName"),
)
# The client expands these itself, with rules of their own about what closes them;
# no translator of ours writes them.
_UNTRACKED = frozenset(
    {"TEXT_MESSAGE_CHUNK", "TOOL_CALL_CHUNK", "REASONING_MESSAGE_CHUNK", "REASONING_CHUNK"}
)
# Subagent lifecycles are verified against attribution this gate does not track.
_SUBAGENT = frozenset({"SUBAGENT_STARTED", "SUBAGENT_FINISHED", "SUBAGENT_ERROR"})
_TERMINAL = frozenset({"RUN_FINISHED", "RUN_ERROR"})


class ForwardedOptions(BaseModel):
    """What ``forwardedProps`` may carry: the options of ``POST /runs`` that the catalog
    lets a request tighten (``turnkeeper.agents.catalog``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    env: dict[str, str] | None = None
    provider: Literal["local", "bwrap", "ssh"] | None = None
    timeout: float | None = Field(default=None, gt=0)
    max_attempts: int | None = Field(default=None, ge=1)


class EventGate:
    """What of one run's log an AG-UI client is sent, chunk by chunk, in seq order.

    It follows what HttpAgent's verifier follows (which messages, tool calls,
    reasoning messages and spans, and steps are open; whether the run started or
    ended) and answers each chunk with the events to send for it.
    """

    def __init__(self, run_id: str, session_id: str) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.started = False
        self.ended = False
        self._open: dict[tuple[str, ...], dict[str, None]] = {names: {} for names, _ in _BRACKETS}

    def admit(self, chunk: Chunk) -> list[Chunk]:
        """The events to send for ``chunk``: itself, or a stand-in, or (for the end) the
        closes it needs first; nothing once the run has ended."""
        if self.ended:
            return []
        head: list[Chunk] = []
        if not self.started:
            self.started = True
            if chunk.get("type") not in ("RUN_STARTED", "RUN_ERROR"):
                head.append(self._run_started())
            elif chunk["type"] == "RUN_STARTED":
                return [chunk]
        problem = self._problem(chunk)
        if problem is not None:
            return [*head, refused(chunk, problem)]
        kind = chunk["type"]
        if kind in _TERMINAL:
            self.ended = True
            closes = self._closes() if kind == "RUN_FINISHED" else []
            return [*head, *closes, _without_subagents(chunk)]
        self._track(chunk)
        return [*head, _without_subagents(chunk)]

    def failed(self, message: str, code: str) -> list[Chunk]:
        """The end of a stream that cannot go on: a RUN_ERROR, unless the run ended."""
        if self.ended:
            return []
        self.ended = True
        head: list[Chunk] = []
        if not self.started:
            self.started = True
            head.append(self._run_started())
        return [*head, {"type": "RUN_ERROR", "message": message, "code": code}]

    def _run_started(self) -> Chunk:
        return {"type": "RUN_STARTED", "threadId": self.session_id, "runId": self.run_id}

    def _problem(self, chunk: Chunk) -> str | None:
        try:
            validate_chunk(chunk)
        except AgentError as exc:
            return exc.message
        kind = chunk["type"]
        if kind == "RUN_STARTED":
            return "the run has already started"
        if kind in _UNTRACKED:
            return f"{kind} is not passed on: send its START, CONTENT and END events"
        if kind in _SUBAGENT:
            return "subagent lifecycles are not passed on"
        return self._out_of_order(chunk)

    def _out_of_order(self, chunk: Chunk) -> str | None:
        kind = chunk["type"]
        for names, key in _BRACKETS:
            if kind not in names:
                continue
            ident = str(chunk[key])
            is_open = ident in self._open[names]
            if kind == names[0] and is_open:
                return f"{key} {ident!r} is already open"
            if kind != names[0] and not is_open:
                return f"{key} {ident!r} is not open"
        return None

    def _track(self, chunk: Chunk) -> None:
        kind = chunk["type"]
        for names, key in _BRACKETS:
            if kind == names[0]:
                self._open[names][str(chunk[key])] = None
            elif kind == names[-1]:
                self._open[names].pop(str(chunk[key]), None)

    def _closes(self) -> list[Chunk]:
        """Ends for what is still open, innermost kinds first (the verifier refuses a
        RUN_FINISHED while any is open)."""
        out: list[Chunk] = []
        for names, key in reversed(_BRACKETS):
            end = names[-1]
            out.extend({"type": end, key: ident} for ident in reversed(self._open[names]))
            self._open[names].clear()
        return out


def refused(chunk: Chunk, problem: str) -> Chunk:
    """The stand-in for an event the client would refuse: a CUSTOM event holding it."""
    return {"type": "CUSTOM", "name": REFUSED_EVENT, "value": {"reason": problem, "event": chunk}}


def _without_subagents(chunk: Chunk) -> Chunk:
    """``chunk`` without subagent attribution, which the gate does not verify (the client
    checks every tag against its opener's)."""
    if "subagentRunId" not in chunk and chunk.get("type") != "MESSAGES_SNAPSHOT":
        return chunk
    out = {k: v for k, v in chunk.items() if k != "subagentRunId"}
    if isinstance(out.get("messages"), list):
        out["messages"] = [
            {k: v for k, v in m.items() if k != "subagentRunId"} if isinstance(m, dict) else m
            for m in out["messages"]
        ]
    return out


def prompt_of(run_input: Any) -> str:
    """The text of the last message, which must be the user's."""
    messages = run_input.messages
    last = messages[-1] if messages else None
    if last is None or last.role != "user":
        raise InvalidInputError(
            "the last message must be a user message: its text is the run's prompt",
            reason="no-user-message",
        )
    content = last.content
    if isinstance(content, str):
        return content
    kinds = sorted({part.type for part in content if part.type != "text"})
    if kinds:
        raise InvalidInputError(
            f"a user message may hold only text, not {', '.join(kinds)}",
            reason="unsupported-content",
        )
    return "\n".join(part.text for part in content)


def parse_input(body: bytes) -> tuple[Any, ForwardedOptions]:
    """The ``RunAgentInput`` of a request body and its forwarded options, or a 400."""
    from ag_ui.core import RunAgentInput  # noqa: PLC0415 - the models are large; load on use

    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError("the body is not JSON", reason="invalid-request") from exc
    if has_lone_surrogate(document):
        raise InvalidInputError(
            "a string of the body holds a lone UTF-16 surrogate", reason="invalid-request"
        )
    try:
        run_input = RunAgentInput.model_validate(document)
    except ValidationError as exc:
        raise InvalidInputError(
            f"not an AG-UI RunAgentInput: {_problems(exc)}", reason="invalid-request"
        ) from exc
    props = run_input.forwarded_props
    if props is None:
        props = {}
    if not isinstance(props, dict):
        raise InvalidInputError("forwardedProps must be an object", reason="forwarded-props")
    try:
        options = ForwardedOptions.model_validate(props)
    except ValidationError as exc:
        allowed = ", ".join(ForwardedOptions.model_fields)
        raise InvalidInputError(
            f"forwardedProps may carry only {allowed}: {_problems(exc)}",
            reason="forwarded-props",
        ) from exc
    return run_input, options


def _problems(exc: ValidationError) -> str:
    shown = []
    for error in exc.errors()[:MAX_PROBLEMS_SHOWN]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        shown.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(shown)


Caller = Annotated[Principal, Depends(authenticate)]


def agui_router(*, ping_seconds: float) -> APIRouter:
    api = APIRouter()

    @api.post("/agui/{agent}", tags=["agui"], response_class=EventSourceResponse)
    async def agui_run(
        agent: str,
        request: Request,
        principal: Caller,
        _: JsonBody,
        last_event_id: str | None = Header(default=None),
    ) -> EventSourceResponse:
        """Run the catalog's ``agent`` for an AG-UI ``RunAgentInput`` and stream the run
        as AG-UI events (``threadId``: the session, ``runId``: the run)."""
        state: WebState = request.app.state.web
        after = sse.parse_offset(last_event_id, None)
        run_input, options = parse_input(await request.body())
        session_id = check_id(run_input.thread_id, "session_id")
        run_id = check_id(run_input.run_id, "run_id")
        prompt = prompt_of(run_input)
        body = SubmitRequest(
            agent=agent,
            prompt=prompt,
            run_id=run_id,
            session_id=session_id,
            **options.model_dump(exclude_none=True),
        )
        run = await run_in_threadpool(
            _admit_visible, request, principal, body, session_id, run_id, after
        )
        sse.check_start(run, await state.run_log.state(run_id), after)
        gate = EventGate(run.run_id, run.session_id)
        if after > 0:
            # A resume: the gate learns what the client was sent up to ``after``.
            for seq, chunk in await state.run_log.snapshot(run_id):
                if seq > after:
                    break
                gate.admit(chunk)
        source = await counted_events(state, run_id, after, principal.name)
        return EventSourceResponse(
            _frames(gate, source),
            ping=ping_seconds,
            sep="\n",  # HttpAgent splits events on "\n\n" only
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return api


def _admit_visible(  # noqa: PLR0917 - one call site
    request: Request,
    principal: Principal,
    body: SubmitRequest,
    session_id: str,
    run_id: str,
    after: int,
) -> Run:
    """Admit the run, or replay its admission; another tenant's session or run is the
    same 404 as one that does not exist, and so is a resume (``after``) of no run."""
    visible_session(request, principal, session_id)
    existing = request.app.state.web.client.get(run_id)
    hidden = existing is not None and not principal.sees(existing.key_name)
    # A resume of no run is the same 404 as one of another tenant's run: a different
    # answer would tell a caller which run ids other tenants use.
    if hidden or (existing is None and after > 0):
        raise RunNotFoundError(f"no run has the id {run_id!r}", run_id=run_id)
    return admit(request, principal, body)


async def _frames(
    gate: EventGate, source: AsyncGenerator[dict[str, Any], None]
) -> AsyncIterator[dict[str, Any]]:
    """SSE frames of the gate's events: a log chunk's carry its seq as ``id``."""

    def frames(events: list[Chunk], seq: str | None) -> list[dict[str, Any]]:
        out = [{"data": orjson.dumps(event).decode()} for event in events]
        if out and seq is not None:
            out[-1]["id"] = seq  # the closes before a RUN_FINISHED carry none
        return out

    async with contextlib.aclosing(source):
        async for event in source:
            if "id" in event:
                for frame in frames(gate.admit(orjson.loads(event["data"])), event["id"]):
                    yield frame
            elif event.get("event") == "log-error":
                problem = orjson.loads(event["data"])
                message, code = problem["message"], problem["reason"]
                if problem["status"] >= 500:  # Redis's own words stay in the server's log
                    message, code = UNAVAILABLE, "unavailable"
                for frame in frames(gate.failed(message, code), None):
                    yield frame
            if gate.ended:
                return
    for frame in frames(gate.failed("the run's log ended before its end", "log-ended"), None):
        yield frame
