"""Django views whose users chat with an agent that turnkeeper runs.

Each user has one conversation, a turnkeeper session of its own. A message is
submitted over turnkeeper's HTTP API with this site's API key; the page follows
the reply through ``events``, which checks that the run is the user's and relays
its event stream. Who the user is comes from the web server in front of Django
(``REMOTE_USER``, as its single sign-on sets it); use ``request.user`` instead in
a site with ``django.contrib.auth``.
"""

import uuid
from collections.abc import Callable, Iterator
from functools import wraps
from urllib.parse import quote

import httpx
from django.conf import settings
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

View = Callable[..., HttpResponse]


def session_of(user: str) -> str:
    """The user's conversation: one turnkeeper session per user of this site."""
    return f"django-chat/{user}"


def turnkeeper() -> httpx.Client:
    return httpx.Client(
        base_url=settings.TURNKEEPER_URL,
        headers={"Authorization": f"Bearer {settings.TURNKEEPER_API_KEY}"},
        timeout=STREAM_TIMEOUT,
    )


def user_required(view: View) -> View:
    @wraps(view)
    def checked(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.META.get("REMOTE_USER"):
            return HttpResponse("sign in first", status=401)
        return view(request, *args, **kwargs)

    return checked


@require_GET
@user_required
def page(request: HttpRequest) -> HttpResponse:
    return render(request, "chat.html")


@require_POST
@user_required
def send(request: HttpRequest) -> HttpResponse:
    """The user's next message: a run of their session, the reply to stream."""
    prompt = request.POST.get("prompt", "")
    if not prompt or len(prompt) > MAX_PROMPT:
        return HttpResponseBadRequest("a prompt, please")
    session = quote(session_of(request.META["REMOTE_USER"]), safe="")
    # The site picks the run id: a retried POST of the same id is the same run.
    body = {"agent": settings.CHAT_AGENT, "prompt": prompt, "run_id": str(uuid.uuid4())}
    with turnkeeper() as client:
        response = client.post(f"/sessions/{session}/runs", json=body)
    if response.status_code != 201:
        return HttpResponse(f"turnkeeper refused the message: {response.text}", status=502)
    return JsonResponse({"run_id": response.json()["run_id"]}, status=201)


@require_GET
@user_required
def events(request: HttpRequest, run_id: str) -> HttpResponse:
    """The reply's events, relayed as turnkeeper sends them (seq ids, an ``end`` event),
    so the browser's EventSource resumes with ``Last-Event-ID`` after a drop."""
    path = f"/runs/{quote(run_id, safe='')}"
    user = request.META["REMOTE_USER"]
    client = turnkeeper()
    run = client.get(path)
    if run.status_code != 200 or run.json()["session_id"] != session_of(user):
        client.close()
        return HttpResponseNotFound("no such message")  # another user's run is none of theirs
    last_event_id = request.headers.get("Last-Event-ID")
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    upstream = client.send(
        client.build_request("GET", f"{path}/events", headers=headers), stream=True
    )
    if upstream.status_code != 200:  # a resume retention cut off (410), say
        upstream.read()
        client.close()
        return HttpResponse(upstream.text, status=upstream.status_code)

    def relay() -> Iterator[bytes]:
        try:
            yield from upstream.iter_raw()
        finally:
            upstream.close()
            client.close()

    response = StreamingHttpResponse(relay(), content_type="text/event-stream")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    return response
