"""Durable Streams reads of run logs over HTTP: headers, offsets, live modes, refusals.

Logs are written with the driver's own ``RunLog`` scripts (``tests.web.durable_streams``)
so each test knows the exact chunks; the web app is real (uvicorn, Postgres, Redis).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI

from tests.web.conftest import ApiKeys, WebServer, stream_tokens
from tests.web.durable_streams import LogWriter, chunk, stream_path, submit_run
from turnkeeper.config import Settings
from turnkeeper.log.keys import stream_slots_key
from turnkeeper.store.store import Store
from turnkeeper.web import create_app
from turnkeeper.web.durable import format_offset
from turnkeeper.web.state import web_client_names

JSON = "application/json"


@pytest.fixture
def durable_web(settings: Settings, api_keys: ApiKeys) -> Iterator[WebServer]:
    """The web app alone (runs stay queued), with a short long-poll and SSE lifetime."""
    app: FastAPI = create_app(settings, ping_seconds=0.5, long_poll_seconds=1.0, sse_seconds=3.0)
    server = WebServer.start_app(app)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def alice(durable_web: WebServer, api_keys: ApiKeys) -> Iterator[httpx.Client]:
    with durable_web.http(api_keys.alice) as client:
        yield client


def _sse_events(http: httpx.Client, url: str) -> list[tuple[str, Any]]:
    """(event, parsed data) of an SSE response until the server ends it; comments skipped."""
    return list(_iter_sse(http, url))


def _iter_sse(http: httpx.Client, url: str) -> Iterator[tuple[str, Any]]:
    with http.stream("GET", url) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream"
        event, data = "message", []
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if line == "":
                if data:
                    yield event, json.loads("\n".join(data))
                event, data = "message", []
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


def _stream_headers(response: httpx.Response) -> dict[str, str]:
    return {
        name: response.headers[name]
        for name in ("stream-next-offset", "stream-up-to-date", "stream-closed")
        if name in response.headers
    }


def test_offsets_are_fixed_width_and_sort_in_log_order() -> None:
    offsets = [format_offset(seq) for seq in (0, 1, 9, 10, 99, 1000, 2**53)]
    assert offsets == sorted(offsets)
    assert {len(offset) for offset in offsets} == {16}
    assert format_offset(10) == "0000000000000010"


def test_head_reports_tail_and_closure_exactly(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "head-run")
    path = stream_path("head-run")
    empty = alice.head(path)
    assert empty.status_code == 200
    assert _stream_headers(empty) == {"stream-next-offset": "0000000000000000"}
    assert empty.headers["content-type"] == JSON
    assert empty.headers["cache-control"] == "no-store"
    assert empty.content == b""

    writer = LogWriter.open(settings, "head-run")
    writer.append(chunk(1), chunk(2), chunk(3))
    open_head = alice.head(path)
    assert _stream_headers(open_head) == {"stream-next-offset": "0000000000000003"}
    writer.close()
    closed = alice.head(path)
    assert _stream_headers(closed) == {
        "stream-next-offset": "0000000000000003",
        "stream-closed": "true",
    }


def test_catch_up_reads_pages_resume_and_end_with_closure(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "catch-up")
    path = stream_path("catch-up")
    writer = LogWriter.open(settings, "catch-up")
    writer.append(*(chunk(n) for n in range(1, 6)))

    whole = alice.get(path)  # no offset: from the start
    assert whole.status_code == 200
    assert whole.headers["content-type"] == JSON
    assert whole.json() == writer.written
    assert _stream_headers(whole) == {
        "stream-next-offset": "0000000000000005",
        "stream-up-to-date": "true",
    }
    assert alice.get(f"{path}?offset=-1").json() == writer.written

    suffix = alice.get(f"{path}?offset={format_offset(2)}")
    assert suffix.json() == writer.written[2:]
    at_tail = alice.get(f"{path}?offset={format_offset(5)}")
    assert at_tail.json() == []
    assert _stream_headers(at_tail) == {
        "stream-next-offset": "0000000000000005",
        "stream-up-to-date": "true",
    }

    now = alice.get(f"{path}?offset=now")
    assert (now.status_code, now.content) == (200, b"[]")
    assert "etag" not in now.headers
    assert _stream_headers(now) == {
        "stream-next-offset": "0000000000000005",
        "stream-up-to-date": "true",
    }

    # An unchanged page is 304 for its ETag; closing the log changes the tail page's ETag.
    etag = at_tail.headers["etag"]
    again = alice.get(f"{path}?offset={format_offset(5)}", headers={"If-None-Match": etag})
    assert (again.status_code, again.content) == (304, b"")
    writer.close()
    closed = alice.get(f"{path}?offset={format_offset(5)}", headers={"If-None-Match": etag})
    assert closed.status_code == 200
    assert closed.json() == []
    assert closed.headers["etag"] != etag
    assert _stream_headers(closed) == {
        "stream-next-offset": "0000000000000005",
        "stream-up-to-date": "true",
        "stream-closed": "true",
    }
    final_page = alice.get(f"{path}?offset={format_offset(3)}")
    assert final_page.json() == writer.written[3:]
    assert final_page.headers["stream-closed"] == "true"


def test_long_poll_waits_for_chunks_then_reports_closure(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "long-poll")
    path = stream_path("long-poll")
    writer = LogWriter.open(settings, "long-poll")
    writer.append(chunk(1))

    ready = alice.get(f"{path}?offset=-1&live=long-poll")
    assert ready.status_code == 200
    assert ready.json() == [chunk(1)]
    assert ready.headers["stream-cursor"].isdigit()

    idle = alice.get(f"{path}?offset={format_offset(1)}&live=long-poll")
    assert idle.status_code == 204  # the long-poll (1 s here) passed without a chunk
    assert _stream_headers(idle) == {
        "stream-next-offset": "0000000000000001",
        "stream-up-to-date": "true",
    }
    # The cursor always moves past the one the client echoed.
    echoed = int(idle.headers["stream-cursor"])
    moved = alice.get(f"{path}?offset={format_offset(1)}&live=long-poll&cursor={echoed}")
    assert int(moved.headers["stream-cursor"]) > echoed

    writer.append(chunk(2))
    woken = alice.get(f"{path}?offset={format_offset(1)}&live=long-poll")
    assert woken.status_code == 200
    assert woken.json() == [chunk(2)]

    writer.close()
    eof = alice.get(f"{path}?offset={format_offset(2)}&live=long-poll")
    assert eof.status_code == 204
    assert _stream_headers(eof) == {
        "stream-next-offset": "0000000000000002",
        "stream-up-to-date": "true",
        "stream-closed": "true",
    }


def test_sse_sends_data_and_control_events_until_closed(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "sse-run")
    path = stream_path("sse-run")
    writer = LogWriter.open(settings, "sse-run")
    writer.append(chunk(1), chunk(2))
    writer.close()
    events = _sse_events(alice, f"{path}?offset=-1&live=sse")
    assert events == [
        ("data", [chunk(1), chunk(2)]),
        (
            "control",
            {"streamNextOffset": "0000000000000002", "streamClosed": True, "upToDate": True},
        ),
    ]
    resumed = _sse_events(alice, f"{path}?offset={format_offset(1)}&live=sse")
    assert resumed == [
        ("data", [chunk(2)]),
        (
            "control",
            {"streamNextOffset": "0000000000000002", "streamClosed": True, "upToDate": True},
        ),
    ]
    at_end = _sse_events(alice, f"{path}?offset=now&live=sse")
    assert at_end == [
        (
            "control",
            {"streamNextOffset": "0000000000000002", "streamClosed": True, "upToDate": True},
        )
    ]


def test_sse_on_an_open_log_says_up_to_date_then_ends_after_its_lifetime(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "sse-open")
    writer = LogWriter.open(settings, "sse-open")
    writer.append(chunk(1))
    events = _sse_events(alice, f"{stream_path('sse-open')}?offset=-1&live=sse")
    assert [name for name, _ in events] == ["data", "control"]
    assert events[0][1] == [chunk(1)]
    control = events[1][1]
    assert set(control) == {"streamNextOffset", "streamCursor", "upToDate"}
    assert (control["streamNextOffset"], control["upToDate"]) == ("0000000000000001", True)


def test_reads_need_a_key_or_the_runs_token(
    settings: Settings, durable_web: WebServer, api_keys: ApiKeys, alice: httpx.Client
) -> None:
    submit_run(alice, "guarded")
    submit_run(alice, "other")
    LogWriter.open(settings, "guarded").append(chunk(1))
    path = stream_path("guarded")
    with durable_web.http() as anonymous:
        for method in ("GET", "HEAD"):
            refused = anonymous.request(method, path)
            assert refused.status_code == 401, method
            assert refused.headers["www-authenticate"] == 'Bearer realm="turnkeeper"'
        tokens = stream_tokens()
        by_token = anonymous.get(f"{path}?token={tokens.issue('guarded')}")
        assert by_token.json() == [chunk(1)]
        # A token is one run's: another run's token opens nothing here.
        stolen = anonymous.get(f"{path}?token={tokens.issue('other')}")
        assert stolen.status_code == 401
        assert stolen.json()["reason"] == "forged"
        expired = anonymous.get(f"{path}?token={tokens.issue('guarded', ttl=-1)}")
        assert expired.status_code == 401
    with durable_web.http(api_keys.bob) as bob:
        for method in ("GET", "HEAD"):
            hidden = bob.request(method, path)
            assert hidden.status_code == 404, method
        assert bob.get(path).json() == {"error": "no run has the id 'guarded'", "run_id": "guarded"}
        assert bob.get(stream_path("nope")).status_code == 404
    with durable_web.http(api_keys.admin) as admin:
        assert admin.get(path).json() == [chunk(1)]


def test_writes_are_refused_with_405(
    settings: Settings, durable_web: WebServer, api_keys: ApiKeys, alice: httpx.Client
) -> None:
    submit_run(alice, "read-only")
    writer = LogWriter.open(settings, "read-only")
    writer.append(chunk(1))
    path = stream_path("read-only")
    attempts = [
        ("PUT", {"Content-Type": JSON}, b"[]"),
        ("POST", {"Content-Type": JSON}, b'[{"type":"CUSTOM"}]'),
        ("POST", {"Stream-Closed": "true"}, b""),
        ("DELETE", {}, b""),
        ("PATCH", {"Content-Type": JSON}, b"{}"),
    ]
    for method, headers, body in attempts:
        refused = alice.request(method, path, headers=headers, content=body)
        assert refused.status_code == 405, (method, refused.text)
        assert refused.headers["allow"] == "GET, HEAD"
        assert refused.json()["reason"] == "read-only-stream"
    with durable_web.http() as anonymous:
        assert anonymous.post(path, content=b"[]").status_code == 401
    with durable_web.http(api_keys.bob) as bob:
        assert bob.delete(path).status_code == 404
    assert alice.get(path).json() == writer.written  # nothing changed
    assert "stream-closed" not in alice.head(path).headers


def test_trimmed_offsets_are_gone(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "trimmed")
    writer = LogWriter.open(settings, "trimmed", max_chunks=3)
    writer.append(*(chunk(n) for n in range(1, 7)))  # keeps seqs 4..6
    path = stream_path("trimmed")
    for offset in ("-1", format_offset(0), format_offset(2)):
        for live in ("", "&live=long-poll", "&live=sse"):
            gone = alice.get(f"{path}?offset={offset}{live}")
            assert gone.status_code == 410, (offset, live)
            assert gone.json()["reason"] == "trimmed"
    kept = alice.get(f"{path}?offset={format_offset(3)}")
    assert kept.json() == writer.written[3:]


@pytest.mark.parametrize(
    "offset",
    [
        "",
        "0",
        "1",
        "-1 ",
        "-2",
        "+000000000000001",
        "000000000000001",  # 15 digits
        "00000000000000001",  # 17 digits
        "000000000000000\u0663",  # an Arabic-Indic digit
        "\uff10" * 15 + "\uff11",  # fullwidth digits
        "0000000000000001,2",
        "0000000000000001 ",
        "NOW",
        "9999999999999999",  # past 2**53
        "0000000000000099",  # past the tail
        "../../etc/passwd",
    ],
)
def test_hostile_offsets_are_400(
    settings: Settings, durable_web: WebServer, alice: httpx.Client, offset: str
) -> None:
    submit_run(alice, "hostile")
    LogWriter.open(settings, "hostile").append(chunk(1), chunk(2))
    for live in ({}, {"live": "long-poll"}, {"live": "sse"}):
        refused = alice.get(stream_path("hostile"), params={"offset": offset, **live})
        assert refused.status_code == 400, (offset, live, refused.text)


def test_bad_live_modes_and_cursors(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "params")
    LogWriter.open(settings, "params").append(chunk(1))
    path = stream_path("params")
    assert alice.get(f"{path}?offset=-1&live=websocket").status_code == 400
    assert alice.get(f"{path}?live=long-poll").status_code == 400  # live needs an offset
    assert alice.get(f"{path}?live=sse").status_code == 400
    for cursor in ("abc", "-5", "1" * 40, "\u0663"):
        answered = alice.get(f"{path}?offset=-1&live=long-poll&cursor={cursor}")
        assert answered.status_code == 200, cursor
        assert answered.headers["stream-cursor"].isdigit()
        assert len(answered.headers["stream-cursor"]) < 16


def test_many_long_polls_count_against_the_keys_streams(
    settings: Settings, api_keys: ApiKeys
) -> None:
    """A key can park no more long-polls than it may open streams: the rest are 429."""
    capped = settings.model_copy(update={"max_streams_per_key": 2})
    server = WebServer.start_app(create_app(capped, long_poll_seconds=30.0))
    try:
        with server.http(api_keys.alice) as alice:
            submit_run(alice, "many")
            writer = LogWriter.open(capped, "many")
            path = f"{stream_path('many')}?offset=-1&live=long-poll"
            answers: list[int] = []
            pollers = [
                threading.Thread(target=lambda: answers.append(alice.get(path).status_code))
                for _ in range(2)
            ]
            for poller in pollers:
                poller.start()
            _wait_for_slots(capped, "alice", 2)
            refused = alice.get(path)
            assert refused.status_code == 429
            writer.append(chunk(1))
            for poller in pollers:
                poller.join()
            assert answers == [200, 200]
            assert alice.get(path).status_code == 200  # the slots were given back
    finally:
        server.stop()


def _wait_for_slots(settings: Settings, key_name: str, count: int, *, fewest: bool = True) -> None:
    """Wait until ``key_name`` holds at least (``fewest``) or exactly ``count`` open streams."""
    writer = LogWriter.open(settings, "slot-probe")
    key = stream_slots_key(settings.namespace, key_name)
    deadline = time.monotonic() + 120
    while True:
        held = writer.log.client.zcard(key)
        if held >= count if fewest else held == count:
            return
        assert time.monotonic() < deadline, f"{key_name} holds {held} streams, not {count}"
        time.sleep(0.02)


def test_revoking_the_key_ends_its_sse_reads_and_refuses_the_reconnect(
    settings: Settings, api_keys: ApiKeys
) -> None:
    with Store(settings.require_database_url(), pool_size=1) as store:
        carol = store.create_key("carol")
    # A lifetime far past the hang guard below: only the revocation can end this read.
    server = WebServer.start_app(create_app(settings, ping_seconds=0.5, sse_seconds=600.0))
    try:
        with server.http(carol) as client:
            submit_run(client, "revoked-sse")
            LogWriter.open(settings, "revoked-sse").append(chunk(1))
            url = f"{stream_path('revoked-sse')}?offset=-1&live=sse"
            seen: list[tuple[str, Any]] = []
            reading = threading.Thread(target=lambda: seen.extend(_iter_sse(client, url)))
            reading.start()
            deadline = time.monotonic() + 120
            while len(seen) < 2:  # the read is open and caught up: revoke now
                assert time.monotonic() < deadline, "the SSE read never started"
                time.sleep(0.02)
            with Store(settings.require_database_url(), pool_size=1) as store:
                store.revoke_key("carol")
            reading.join(120)
            assert not reading.is_alive(), "the revoked key's SSE read went on"
            assert [name for name, _ in seen] == ["data", "control"]
            assert seen[0][1] == [chunk(1)]
            refused = client.get(url)
            assert refused.status_code == 401
            _wait_for_slots(settings, "carol", 0, fewest=False)
    finally:
        server.stop()


def test_a_long_poll_parked_across_a_revocation_answers_401_not_the_new_chunks(
    settings: Settings, api_keys: ApiKeys
) -> None:
    """Chunks stored after the key was revoked never reach its parked long-poll."""
    with Store(settings.require_database_url(), pool_size=1) as store:
        dave = store.create_key("dave")
    # A wait far past the hang guard below: only a chunk or the revocation can end it.
    server = WebServer.start_app(create_app(settings, long_poll_seconds=600.0))
    try:
        with server.http(dave) as client:
            submit_run(client, "revoked-poll")
            writer = LogWriter.open(settings, "revoked-poll")
            url = f"{stream_path('revoked-poll')}?offset=-1&live=long-poll"
            answers: list[httpx.Response] = []
            poller = threading.Thread(target=lambda: answers.append(client.get(url)))
            poller.start()
            _wait_for_slots(settings, "dave", 1)  # parked
            with Store(settings.require_database_url(), pool_size=1) as store:
                store.revoke_key("dave")
            writer.append(chunk(1))  # stored after the revocation: not dave's any more
            poller.join(120)
            assert not poller.is_alive(), "the revoked key's long-poll went on"
            assert [answer.status_code for answer in answers] == [401]
            assert b"seeded" not in answers[0].content
            _wait_for_slots(settings, "dave", 0, fewest=False)
    finally:
        server.stop()


def test_a_hundred_parked_long_polls_leave_other_reads_answering(
    settings: Settings, api_keys: ApiKeys
) -> None:
    """More parked long-polls than the web's Redis command pool holds do not wedge HEAD
    or a catch-up read of another run: they wait on the run's feed, one parked read in
    Redis for all of them, and none holds a connection of the command pool."""
    roomy = settings.model_copy(update={"max_streams_per_key": 200})
    server = WebServer.start_app(create_app(roomy, long_poll_seconds=600.0))
    parked = 100
    try:
        limits = httpx.Limits(max_connections=parked + 10)
        with (
            server.http(api_keys.alice) as alice,
            httpx.Client(
                base_url=alice.base_url, headers=alice.headers, limits=limits, timeout=300
            ) as pollers_http,
        ):
            submit_run(alice, "parked")
            submit_run(alice, "bystander")
            parked_writer = LogWriter.open(roomy, "parked")
            bystander = LogWriter.open(roomy, "bystander")
            bystander.append(chunk(1))
            url = f"{stream_path('parked')}?offset=-1&live=long-poll"
            answers: list[int] = []
            pollers = [
                threading.Thread(target=lambda: answers.append(pollers_http.get(url).status_code))
                for _ in range(parked)
            ]
            for poller in pollers:
                poller.start()
            _wait_for_slots(roomy, "alice", parked)
            _wait_for(lambda: parked_reads(roomy) == {"feeds": 1, "commands": 0})
            head = alice.head(stream_path("bystander"))
            read = alice.get(f"{stream_path('bystander')}?offset=-1")
            assert (head.status_code, head.headers["stream-next-offset"]) == (200, format_offset(1))
            assert (read.status_code, read.json()) == (200, [chunk(1)])
            parked_writer.append(chunk(1))
            for poller in pollers:
                poller.join(120)
            assert answers == [200] * parked
    finally:
        server.stop()


def parked_reads(settings: Settings) -> dict[str, int]:
    """The web process's connections parked in XREAD, by pool, from CLIENT LIST."""
    names = web_client_names(settings.namespace)
    client = redis.Redis.from_url(settings.require_redis_url())
    try:
        parked = [c.get("name") for c in client.client_list() if c.get("cmd") == "xread"]
    finally:
        client.close()
    return {"feeds": parked.count(names.feeds), "commands": parked.count(names.commands)}


def _wait_for(condition: Callable[[], bool]) -> None:
    for _ in range(600):  # a hang guard
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("never came true")


def _strict_sse_events(raw: bytes) -> list[tuple[str, Any]]:
    """The events of an SSE body, split by the spec's line ends (CRLF, LF, CR) alone:
    a U+2028 or U+0085 is text, not a line end, to a browser's EventSource."""
    text = raw.decode("utf-8")
    events: list[tuple[str, Any]] = []
    event, data = "message", []
    for line in re.split(r"\r\n|\r|\n", text):
        if line == "":
            if data:
                events.append((event, json.loads("\n".join(data))))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    return events


def test_sse_frames_chunks_holding_line_breaks_as_one_event_each(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "sse-breaks")
    hostile = [
        {"type": "TEXT_MESSAGE_CONTENT", "delta": "a\nevent: control\ndata: {}\n\nb"},
        {"type": "TEXT_MESSAGE_CONTENT", "delta": "c\rd\r\ne\u2028f\u2029g\u0085h"},
    ]
    writer = LogWriter.open(settings, "sse-breaks")
    writer.append(*hostile)
    writer.close()
    response = alice.get(f"{stream_path('sse-breaks')}?offset=-1&live=sse")
    assert response.status_code == 200
    assert b"\r" not in response.content
    assert _strict_sse_events(response.content) == [
        ("data", hostile),
        (
            "control",
            {"streamNextOffset": "0000000000000002", "streamClosed": True, "upToDate": True},
        ),
    ]


def test_head_and_get_of_another_tenants_run_answer_as_a_missing_run(
    settings: Settings, durable_web: WebServer, alice: httpx.Client, api_keys: ApiKeys
) -> None:
    submit_run(alice, "alicexx-run")
    LogWriter.open(settings, "alicexx-run").append(chunk(1))
    alice_token = alice.get(f"{stream_path('alicexx-run')}?offset=-1")
    assert alice_token.status_code == 200

    def seen(response: httpx.Response) -> tuple[int, dict[str, str], bytes]:
        headers = {k: v for k, v in response.headers.items() if k not in ("date", "x-request-id")}
        body = response.content.replace(b"alicexx-run", b"ID").replace(b"nobodyx-run", b"ID")
        return response.status_code, headers, body

    with durable_web.http(api_keys.bob) as bob:
        for method in ("HEAD", "GET"):
            other = bob.request(method, stream_path("alicexx-run"))
            missing = bob.request(method, stream_path("nobodyx-run"))
            assert other.status_code == 404
            assert seen(other) == seen(missing)


def test_etags_follow_a_growing_then_closing_log_and_its_end_offsets(
    settings: Settings, durable_web: WebServer, alice: httpx.Client
) -> None:
    submit_run(alice, "etag-run")
    path = stream_path("etag-run")
    writer = LogWriter.open(settings, "etag-run")
    writer.append(chunk(1))
    first = alice.get(f"{path}?offset=-1")
    assert (first.status_code, first.json()) == (200, [chunk(1)])
    same = alice.get(f"{path}?offset=-1", headers={"If-None-Match": first.headers["etag"]})
    assert (same.status_code, same.content) == (304, b"")

    writer.append(chunk(2))  # the log grew: the old tag must not answer 304
    grown = alice.get(f"{path}?offset=-1", headers={"If-None-Match": first.headers["etag"]})
    assert (grown.status_code, grown.json()) == (200, [chunk(1), chunk(2)])
    assert "stream-closed" not in grown.headers

    writer.close()  # closed with no new chunk: the tag changes all the same
    closed = alice.get(f"{path}?offset=-1", headers={"If-None-Match": grown.headers["etag"]})
    assert (closed.status_code, closed.json()) == (200, [chunk(1), chunk(2)])
    assert closed.headers["stream-closed"] == "true"

    for offset in (format_offset(2), "now"):  # the tail of a closed log: EOF, no data
        at_tail = alice.get(f"{path}?offset={offset}")
        assert (at_tail.status_code, at_tail.json()) == (200, [])
        assert _stream_headers(at_tail) == {
            "stream-next-offset": "0000000000000002",
            "stream-up-to-date": "true",
            "stream-closed": "true",
        }
