"""A FastAPI app whose users chat with an agent that turnkeeper runs.

Each user has one conversation, a turnkeeper session of its own. A message is
submitted over turnkeeper's HTTP API with this app's API key, and the browser
page follows the reply through this app, which checks that the run is the
user's before it relays the run's event stream. The key never reaches the
browser, and who the users are stays this app's business: here, HTTP Basic
against a table given in the environment.

    TURNKEEPER_URL=http://127.0.0.1:8000 TURNKEEPER_API_KEY=tk_... \\
    CHAT_USERS=ada:lovelace,grace:hopper .venv/bin/uvicorn examples.fastapi_chat.app:app --port 8100
"""

import os
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from pydantic import BaseModel, Field

STATIC = Path(__file__).parent / "static"
REQUIRED = ("TURNKEEPER_URL", "TURNKEEPER_API_KEY", "CHAT_USERS")
# A stream is parked for as long as a reply takes: no read timeout on it.
STREAM_TIMEOUT = httpx.Timeout(30.0, read=None)
UNREACHABLE = "turnkeeper does not answer; is it running at TURNKEEPER_URL?"
RUN_PREFIX = "fastapi-chat-"
"""Every run id of this app starts with it: another app on the same turnkeeper (the
Django example, say) never picks the same id."""


class Message(BaseModel):
    prompt: str = Field(min_length=1, max_length=20_000)
    id: uuid.UUID
    """Picked by the page, once per message: a post sent again is the same run."""


def session_of(user: str) -> str:
    """The user's conversation: one turnkeeper session per user of this app."""
    return f"fastapi-chat/{user}"


def run_id_of(message_id: uuid.UUID) -> str:
    return f"{RUN_PREFIX}{message_id}"


def refused(response: httpx.Response) -> HTTPException:
    """turnkeeper's refusal of a message, as this app answers it."""
    if response.status_code == 409:  # the id names a run of another message
        return HTTPException(409, "that message id is taken; send it with a new one")
    if response.status_code == 429:  # the app's key is over its rate or running limit
        retry = {"Retry-After": response.headers.get("Retry-After", "1")}
        return HTTPException(429, "too many messages; try again shortly", headers=retry)
    return HTTPException(502, f"turnkeeper refused the message: {response.text}")


def create_app(
    turnkeeper_url: str, api_key: str, users: Mapping[str, str], *, agent: str = "scripted"
) -> FastAPI:
    basic = HTTPBasic(realm="chat")

    def current_user(credentials: Annotated[HTTPBasicCredentials, Depends(basic)]) -> str:
        expected = users.get(credentials.username, "")
        given = credentials.password.encode()
        if not expected or not secrets.compare_digest(given, expected.encode()):
            raise HTTPException(401, "unknown user", headers={"WWW-Authenticate": "Basic"})
        return credentials.username

    User = Annotated[str, Depends(current_user)]  # noqa: N806 - a type alias, named as one

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with httpx.AsyncClient(
            base_url=turnkeeper_url, headers=headers, timeout=STREAM_TIMEOUT
        ) as turnkeeper:
            app.state.turnkeeper = turnkeeper
            yield

    app = FastAPI(title="chat", lifespan=lifespan)

    @app.exception_handler(httpx.TransportError)
    async def unreachable(request: Request, exc: httpx.TransportError) -> JSONResponse:
        """A 502 that says so, not a server error, when turnkeeper cannot be reached."""
        return JSONResponse({"detail": UNREACHABLE}, status_code=502)

    def turnkeeper_of(request: Request) -> httpx.AsyncClient:
        client: httpx.AsyncClient = request.app.state.turnkeeper
        return client

    @app.get("/")
    async def page(_: User) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/chat.js")
    async def script(_: User) -> FileResponse:
        return FileResponse(STATIC / "chat.js", media_type="text/javascript")

    @app.post("/messages", status_code=201)
    async def send(message: Message, user: User, request: Request) -> dict[str, str]:
        """The user's next message: a run of their session, the reply to stream."""
        session = quote(session_of(user), safe="")
        body = {"agent": agent, "prompt": message.prompt, "run_id": run_id_of(message.id)}
        response = await turnkeeper_of(request).post(f"/sessions/{session}/runs", json=body)
        if response.status_code != 201:
            raise refused(response)
        return {"run_id": response.json()["run_id"]}

    @app.get("/messages/{run_id}/events")
    async def events(
        run_id: str,
        user: User,
        request: Request,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> StreamingResponse:
        """The reply's events, relayed as turnkeeper sends them (seq ids, an ``end`` event),
        so the browser's EventSource resumes with ``Last-Event-ID`` after a drop."""
        turnkeeper = turnkeeper_of(request)
        path = f"/runs/{quote(run_id, safe='')}"
        run = await turnkeeper.get(path)
        if run.status_code != 200 or run.json()["session_id"] != session_of(user):
            raise HTTPException(404, "no such message")  # another user's run is none of theirs
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        upstream = await turnkeeper.send(
            turnkeeper.build_request("GET", f"{path}/events", headers=headers), stream=True
        )
        if upstream.status_code != 200:  # a resume retention cut off (410), say
            await upstream.aread()
            await upstream.aclose()
            raise HTTPException(upstream.status_code, upstream.text)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for part in upstream.aiter_raw():
                    yield part
            finally:
                await upstream.aclose()

        return StreamingResponse(
            relay(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return app


def users_from(spec: str) -> dict[str, str]:
    """``name:password,name:password`` (CHAT_USERS) as a table."""
    pairs = (item.split(":", 1) for item in spec.split(",") if ":" in item)
    return {name.strip(): password for name, password in pairs}


def app_from_environment() -> FastAPI:
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        raise RuntimeError(f"set {', '.join(missing)}: see examples/README.md")
    return create_app(
        os.environ["TURNKEEPER_URL"],
        os.environ["TURNKEEPER_API_KEY"],
        users_from(os.environ["CHAT_USERS"]),
        agent=os.environ.get("CHAT_AGENT", "scripted"),
    )


def __getattr__(name: str) -> FastAPI:
    """``uvicorn examples.fastapi_chat.app:app``: the app, configured from the environment
    when uvicorn asks for it (importing the module alone reads nothing)."""
    if name == "app":
        return app_from_environment()
    raise AttributeError(name)
