"""Django views whose users chat with an agent that turnkeeper runs.

Each user has one conversation, a turnkeeper session of its own. A message is
submitted over turnkeeper's HTTP API with this site's API key; the page follows
the reply through ``events``, which checks that the run is the user's and relays
its event stream. Who the user is, is Django's business (``django.contrib.auth``:
the login page, or ``RemoteUserMiddleware`` behind a single sign-on).
"""

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import wraps
from urllib.parse import quote

import httpx
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotFound,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

MAX_PROMPT = 20_000
# A stream is parked for as long as a reply takes: no read timeout on it.
STREAM_TIMEOUT = httpx.Timeout(30.0, read=None)
UNREACHABLE = "turnkeeper does not answer; is it running at TURNKEEPER_URL?"
RUN_PREFIX = "django-chat-"
"""Every run id of this site starts with it: another app on the same turnkeeper (the
FastAPI example, say) never picks the same id."""

View = Callable[..., HttpResponse]


def session_of(user: str) -> str:
    """The user's conversation: one turnkeeper session per user of this site."""
    return f"django-chat/{user}"


def run_id_of(message_id: uuid.UUID) -> str:
    return f"{RUN_PREFIX}{message_id}"


def turnkeeper() -> httpx.Client:
    return httpx.Client(
        base_url=settings.TURNKEEPER_URL,
        headers={"Authorization": f"Bearer {settings.TURNKEEPER_API_KEY}"},
        timeout=STREAM_TIMEOUT,
    )


def signed_in(view: View) -> View:
    """For the page's own requests (``fetch``, ``EventSource``): a 401, not a redirect
    to the login page, when the sign-in is gone."""

    @wraps(view)
    def checked(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.is_authenticated:
            return HttpResponse("sign in first", status=401)
        return view(request, *args, **kwargs)

    return checked


def turnkeeper_answers(view: View) -> View:
    """A 502 that says so, not a server error, when turnkeeper cannot be reached."""

    @wraps(view)
    def checked(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except httpx.TransportError:
            return HttpResponse(UNREACHABLE, status=502)

    return checked


def refused(response: httpx.Response) -> HttpResponse:
    """turnkeeper's refusal of a message, as this site answers it."""
    if response.status_code == 409:  # the id names a run of another message
        return HttpResponse("that message id is taken; send it with a new one", status=409)
    if response.status_code == 429:  # the site's key is over its rate or running limit
        busy = HttpResponse("too many messages; try again shortly", status=429)
        busy["Retry-After"] = response.headers.get("Retry-After", "1")
        return busy
    return HttpResponse(f"turnkeeper refused the message: {response.text}", status=502)


@require_GET
@login_required
def page(request: HttpRequest) -> HttpResponse:
    response = render(request, "chat.html")
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@signed_in
@turnkeeper_answers
def send(request: HttpRequest) -> HttpResponse:
    """The user's next message: a run of their session, the reply to stream."""
    prompt = request.POST.get("prompt", "")
    if not prompt or len(prompt) > MAX_PROMPT:
        return HttpResponseBadRequest("a prompt, please")
    try:  # picked by the page, once per message: a post sent again is the same run
        message_id = uuid.UUID(request.POST.get("id", ""))
    except ValueError:
        return HttpResponseBadRequest("a message id (a UUID), please")
    session = quote(session_of(request.user.get_username()), safe="")
    body = {"agent": settings.CHAT_AGENT, "prompt": prompt, "run_id": run_id_of(message_id)}
    with turnkeeper() as client:
        response = client.post(f"/sessions/{session}/runs", json=body)
    if response.status_code != 201:
        return refused(response)
    return JsonResponse({"run_id": response.json()["run_id"]}, status=201)


@require_GET
@signed_in
@turnkeeper_answers
def events(request: HttpRequest, run_id: str) -> HttpResponse:
    """The reply's events, relayed as turnkeeper sends them (seq ids, an ``end`` event),
    so the browser's EventSource resumes with ``Last-Event-ID`` after a drop."""
    path = f"/runs/{quote(run_id, safe='')}"
    user = request.user.get_username()
    last_event_id = request.headers.get("Last-Event-ID")
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with ExitStack() as opened:  # closed here on every way out but the relay's
        client = opened.enter_context(turnkeeper())
        run = client.get(path)
        if run.status_code != 200 or run.json()["session_id"] != session_of(user):
            return HttpResponseNotFound("no such message")  # another user's run is none of theirs
        upstream = opened.enter_context(client.stream("GET", f"{path}/events", headers=headers))
        if upstream.status_code != 200:  # a resume retention cut off (410), say
            return HttpResponse(upstream.read(), status=upstream.status_code)
        relayed = opened.pop_all()

    def relay() -> Iterator[bytes]:
        with relayed:  # the response and the client, closed when the stream ends or drops
            yield from upstream.iter_raw()

    response = StreamingHttpResponse(relay(), content_type="text/event-stream")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    return response
