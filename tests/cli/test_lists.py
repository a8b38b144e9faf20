"""``turnkeeper runs`` and ``turnkeeper sessions`` on a real store: every id whole however
long, the HTTP API's filters and pages, and ``runs --json`` the very document that
``GET /runs`` answers an admin key. No worker runs: the runs stay queued (or are
cancelled), so every field is known."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer
from turnkeeper.config import Settings
from turnkeeper.store.store import Store

ECHO: dict[str, Any] = {"command": ["/bin/echo", "hi"], "format": "text"}
LONG = "a-run-whose-id-is-longer-than-a-terminal-is-wide-" + "x" * 51
NEWEST_FIRST = [LONG, "bob-1", "Beta-3", "alpha-2", "alpha-1"]


def _submit(client: httpx.Client, run_id: str, session: str, agent: Any = "scripted") -> None:
    body = {"agent": agent, "prompt": f"prompt of {run_id}", "run_id": run_id}
    response = client.post("/runs", json={**body, "session_id": session})
    assert response.status_code == 201, response.text


@pytest.fixture
def admin(web: WebServer, api_keys: ApiKeys) -> Iterator[httpx.Client]:
    """Five runs of three keys in five sessions, alpha-1 cancelled; the admin's client."""
    with web.http(api_keys.alice) as alice, web.http(api_keys.bob) as bob:
        _submit(alice, "alpha-1", "s-a")
        _submit(alice, "alpha-2", "s-a2", ECHO)
        _submit(alice, "Beta-3", "s-b")
        _submit(bob, "bob-1", "s-bob")
        assert alice.post("/runs/alpha-1/cancel").status_code == 200
    with web.http(api_keys.admin) as client:
        _submit(client, LONG, "s-long")
        yield client


def _cli(fleet: Fleet, *args: str) -> str:
    result = fleet.run_cli(*args)
    assert (result.returncode, result.stderr) == (0, ""), args
    return result.stdout


def _without_now(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "now"}


def test_runs_shows_every_id_whole_and_the_next_page(fleet: Fleet, admin: httpx.Client) -> None:
    """A 100-character id is shown whole on an 80-column terminal (the line is longer
    and the terminal wraps it); the last line names the next page's offset."""
    header = f"{'run':<100}  status   agent      phase  epoch  attempts  owner  lease"

    def row(run_id: str, status: str, agent: str) -> str:
        return f"{run_id:<100}  {status:<7}  {agent:<9}  -      0      0/5       -      -"

    rows = {
        LONG: row(LONG, "queued", "scripted"),
        "bob-1": row("bob-1", "queued", "scripted"),
        "Beta-3": row("Beta-3", "queued", "scripted"),
        "alpha-2": row("alpha-2", "queued", "/bin/echo"),
        "alpha-1": row("alpha-1", "aborted", "scripted"),
    }
    table = "\n".join([header, *(rows[run_id] for run_id in NEWEST_FIRST)])
    assert _cli(fleet, "runs") == f"{table}\nruns 1-5 of 5\n"

    # Each page's columns are as wide as that page's cells.
    first = "\n".join(
        [
            f"{'run':<100}  status  agent     phase  epoch  attempts  owner  lease",
            f"{LONG:<100}  queued  scripted  -      0      0/5       -      -",
            f"{'bob-1':<100}  queued  scripted  -      0      0/5       -      -",
        ]
    )
    assert _cli(fleet, "runs", "--limit", "2") == f"{first}\nruns 1-2 of 5; next page: --offset 2\n"
    short_header = "run      status   agent     phase  epoch  attempts  owner  lease"
    aborted = "alpha-1  aborted  scripted  -      0      0/5       -      -"
    last = f"{short_header}\n{aborted}\nruns 5-5 of 5\n"
    assert _cli(fleet, "runs", "--limit", "2", "--offset", "4") == last
    assert _cli(fleet, "runs", "--offset", "9") == "no runs past offset 9 (of 5)\n"
    assert _cli(fleet, "runs", "--search", "nothing-has-this") == "no runs\n"

    expected = f"{short_header}\n{aborted}\nruns 1-1 of 1\n"
    assert _cli(fleet, "runs", "--status", "aborted", "--key", "alice") == expected


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"status": "queued"},
        {"status": "aborted"},
        {"agent": "/bin/echo"},
        {"agent": "scripted", "search": "ALPHA"},
        {"session_id": "s-b"},
        {"search": "a-3"},
        {"key": "bob"},
        {"key": "alice", "status": "queued", "limit": "1", "offset": "1"},
        {"limit": "2", "offset": "2"},
        {"offset": "9"},
        {"key": "nobody"},
        {"created_since": "2000-01-01T00:00:00Z", "created_until": "2999-01-01T00:00:00+00:00"},
        {"created_until": "2000-01-01T00:00:00+02:00"},
        {"finished_since": "2000-01-01T00:00:00Z", "status": "aborted"},
        {"finished_until": "2999-01-01T00:00:00Z"},
    ],
)
def test_runs_json_is_the_api_listing(
    fleet: Fleet, admin: httpx.Client, params: dict[str, str]
) -> None:
    """The same runs, fields, order, counts and page as ``GET /runs`` with the same
    filters (the CLI is trusted: it sees what an admin key sees); only the clock's
    reading may differ."""

    def option(name: str) -> str:
        return "--session" if name == "session_id" else "--" + name.replace("_", "-")

    args = [arg for name, value in params.items() for arg in (option(name), value)]
    listing = json.loads(_cli(fleet, "runs", "--json", *args))
    answer = admin.get("/runs", params=params)
    assert answer.status_code == 200, answer.text
    assert _without_now(listing) == _without_now(answer.json())
    assert datetime.fromisoformat(listing["now"]).utcoffset() is not None


def test_sessions_lists_the_latest_first(
    fleet: Fleet, admin: httpx.Client, settings: Settings
) -> None:
    url = settings.require_database_url()
    with Store(url, pool_size=1) as store:
        runs = {run_id: store.get_run(run_id) for run_id in NEWEST_FIRST}
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT session_id, created_at, updated_at FROM sessions").fetchall()
    times = {session: (created, updated) for session, created, updated in rows}

    def at(run_id: str) -> datetime:
        run = runs[run_id]
        assert run is not None
        return run.created_at.astimezone(UTC)

    sessions = [
        ("s-long", LONG, "queued", "admin"),
        ("s-bob", "bob-1", "queued", "bob"),
        ("s-b", "Beta-3", "queued", "alice"),
        ("s-a2", "alpha-2", "queued", "alice"),
        ("s-a", "alpha-1", "aborted", "alice"),
    ]
    header = f"session  runs  {'last run':<100}  status   last run at           key"
    lines = [
        f"{session:<7}  1     {run_id:<100}  {status:<7}  {at(run_id):%Y-%m-%d %H:%M:%S}Z  {key}"
        for session, run_id, status, key in sessions
    ]
    assert _cli(fleet, "sessions") == "\n".join([header, *lines, "sessions 1-5 of 5\n"])

    page = "sessions 1-2 of 3; next page: --offset 2\n"
    shown = _cli(fleet, "sessions", "--key", "alice", "--limit", "2")
    assert shown == "\n".join(
        [
            "session  runs  last run  status  last run at           key",
            f"s-b      1     Beta-3    queued  {at('Beta-3'):%Y-%m-%d %H:%M:%S}Z  alice",
            f"s-a2     1     alpha-2   queued  {at('alpha-2'):%Y-%m-%d %H:%M:%S}Z  alice",
            page,
        ]
    )
    searched = _cli(fleet, "sessions", "--search", "S-A", "--offset", "1")
    assert searched == "\n".join(
        [
            "session  runs  last run  status   last run at           key",
            f"s-a      1     alpha-1   aborted  {at('alpha-1'):%Y-%m-%d %H:%M:%S}Z  alice",
            "sessions 2-2 of 2\n",
        ]
    )
    assert _cli(fleet, "sessions", "--key", "nobody") == "no sessions\n"

    listing = json.loads(_cli(fleet, "sessions", "--json", "--search", "s-b"))
    expected = [
        {
            "session_id": session,
            "key_name": key,
            "run_count": 1,
            "last_run_id": run_id,
            "last_status": status,
            "last_run_at": at(run_id).isoformat(),
            "leaf_id": None,  # no run has started: nothing is committed
            "created_at": times[session][0].astimezone(UTC).isoformat(),
            "updated_at": times[session][1].astimezone(UTC).isoformat(),
        }
        for session, run_id, status, key in sessions
        if "s-b" in session
    ]
    assert listing == {
        "sessions": expected,
        "total": 2,
        "total_exact": True,
        "offset": 0,
        "limit": 50,
    }


def test_runs_escapes_what_a_submitter_chose(fleet: Fleet) -> None:
    """An inline command's program is the run's agent in the list: its escape sequence
    is shown, not obeyed."""
    submitted = fleet.run_cli("submit", "--command", "\x1b[31mred x", "--prompt", "hi")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    assert _cli(fleet, "runs") == (
        f"{'run':<{len(run_id)}}  status  agent        phase  epoch  attempts  owner  lease\n"
        f"{run_id}  queued  \\x1b[31mred  -      0      0/5       -      -\n"
        "runs 1-1 of 1\n"
    )
