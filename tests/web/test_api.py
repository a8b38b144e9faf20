"""The HTTP API against a real stack: workers, beat, Postgres, Redis, uvicorn."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.driver.fleet import Fleet, expected_log
from tests.web.conftest import ApiKeys, WebServer, stream_tokens
from tests.web.sse_client import iter_events, read_stream

SCRIPTED: dict[str, Any] = {"preset": "scripted", "turns": 2, "pace": 0.01, "seed": 7}


def _submit(http: httpx.Client, run_id: str, agent: dict[str, Any] | None = None) -> dict[str, Any]:
    response = http.post(
        "/runs",
        json={
            "agent": agent or SCRIPTED,
            "prompt": "tidy up",
            "run_id": run_id,
            "session_id": f"s-{run_id}",
        },
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def test_submit_stream_status_transcript_metrics(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, tmp_path: Path
) -> None:
    run_id = "web run/1 ü"  # a slash, a space and a non-ASCII letter travel through every URL
    body = _submit(http, run_id)
    assert body["run_id"] == run_id
    assert body["status"] in {"queued", "running"}
    assert body["stream_url"].startswith(f"/runs/{quote(run_id, safe='')}/events?token=")

    chunks, end = read_stream(http, body["stream_url"])
    oracle = expected_log(run_id, f"s-{run_id}", SCRIPTED, "tidy up", tmp_path / "oracle")
    assert [seq for seq, _ in chunks] == list(range(1, len(oracle) + 1))
    assert [chunk for _, chunk in chunks] == oracle
    assert end.event == "end"
    assert end.chunk == {"last_seq": len(oracle)}

    run = fleet.wait_settled(run_id)
    assert run.status.value == "completed"
    status = http.get(f"/runs/{quote(run_id, safe='')}").json()
    assert (status["status"], status["epoch"], status["attempt_count"]) == ("completed", 1, 1)
    assert status["phase"] == "committed"

    # Idempotent by run_id; a different request under the same id is a conflict.
    assert _submit(http, run_id)["run_id"] == run_id
    conflict = http.post("/runs", json={"agent": "scripted", "prompt": "other", "run_id": run_id})
    assert conflict.status_code == 409
    assert conflict.json()["run_id"] == run_id

    cancelled = http.post(f"/runs/{quote(run_id, safe='')}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "completed"  # the first terminal status wins

    listed = http.get("/runs").json()["runs"]
    assert [r["run_id"] for r in listed] == [run_id]

    transcript = http.get(f"/sessions/{quote('s-' + run_id, safe='')}/transcript").json()
    stored = fleet.client.transcript(f"s-{run_id}")
    assert [e["entry_id"] for e in transcript["entries"]] == [e.entry_id for e in stored]
    assert transcript["entries"]

    assert http.get("/metrics").status_code == 403  # a tenant's key sees no fleet figures
    with web.http(api_keys.admin) as admin:
        metrics = admin.get("/metrics").text
    assert 'turnkeeper_runs{status="completed"} 1.0' in metrics
    assert 'turnkeeper_runs{status="running"} 0.0' in metrics
    for cause in ("crash", "lease", "forced"):
        assert f'turnkeeper_takeovers_total{{cause="{cause}"}} 0.0' in metrics
    assert f"turnkeeper_sse_events_total {float(len(oracle))}" in metrics
    assert http.get("/healthz").json() == {"status": "ok", "database": "ok", "redis": "ok"}
    assert "/runs/{run_id}/events" in http.get("/openapi.json").json()["paths"]

    # The fleet page's data: an admin key's only. The run ran on the worker's host and
    # its sandbox is destroyed, but its placement names it until the reaper forgets it.
    assert http.get("/fleet/hosts").status_code == 403
    with web.http(api_keys.admin) as admin:
        hosts = admin.get("/fleet/hosts").json()["hosts"]
    assert [host["host_id"] for host in hosts] == [fleet.settings.host_id]
    assert hosts[0]["alive"]
    assert hosts[0]["workers"]
    assert not any(w["draining"] for w in hosts[0]["workers"])
    assert [s["run_id"] for s in hosts[0]["sandboxes"]] in ([run_id], [])


def test_resume_from_every_offset_gives_exactly_the_suffix(
    fleet: Fleet, http: httpx.Client
) -> None:
    body = _submit(http, "resume-every-offset")
    fleet.wait_settled("resume-every-offset")
    full = fleet.log_of("resume-every-offset")
    assert len(full) > 20
    url = body["stream_url"]
    for after in range(len(full) + 1):
        by_query, end = read_stream(http, f"{url}&offset={after}")
        assert by_query == full[after:], after
        assert end.chunk == {"last_seq": len(full)}
        # Last-Event-ID (what a reconnecting EventSource sends) wins over ?offset=.
        by_header, _ = read_stream(http, f"{url}&offset=0", headers={"Last-Event-ID": str(after)})
        assert by_header == full[after:], after
    past = http.get(f"{url}&offset={len(full) + 1}")
    assert past.status_code == 400
    assert "past the last seq" in past.json()["error"]


@pytest.mark.slow
def test_reconnecting_client_sees_each_chunk_once_across_a_takeover(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, tmp_path: Path
) -> None:
    fleet.start_worker(concurrency=2)  # someone to take over when the owner dies
    agent = {"preset": "scripted", "turns": 4, "pace": 0.08, "seed": 3}
    run_id = "across-takeover"
    body = _submit(http, run_id, agent)
    seen: list[tuple[int, dict[str, Any]]] = []
    killed = False
    pings = 0
    # Disconnect after every 7 chunks and reconnect with Last-Event-ID, as a browser would.
    while True:
        headers = {"Last-Event-ID": str(seen[-1][0])} if seen else {}
        got = 0
        ended = False
        for item in iter_events(http, body["stream_url"], headers=headers):
            if isinstance(item, str):
                pings += 1
                continue
            if item.event == "end":
                ended = True
                break
            assert item.id is not None
            seen.append((int(item.id), item.chunk))
            got += 1
            if not killed and len(seen) >= 12:
                run = fleet.client.require(run_id)
                fleet.signal_worker_of(run, signal.SIGKILL)
                killed = True
            if got == 7:
                break
        if ended:
            break
    run = fleet.wait_settled(run_id)
    assert (run.status.value, run.epoch) == ("completed", 2)
    oracle = expected_log(run_id, f"s-{run_id}", agent, "tidy up", tmp_path / "oracle")
    assert [seq for seq, _ in seen] == list(range(1, len(oracle) + 1))
    assert [chunk for _, chunk in seen] == oracle
    assert pings > 0  # the takeover left the stream idle long enough for keep-alives
    with web.http(api_keys.admin) as admin:
        metrics = admin.get("/metrics").text
    # Its worker's death handed the run over, not its lease (``tests/driver/
    # test_crash_takeover.py``).
    assert 'turnkeeper_takeovers_total{cause="crash"} 1.0' in metrics
    assert 'turnkeeper_takeovers_total{cause="lease"} 0.0' in metrics
    assert 'turnkeeper_attempts{outcome="superseded"} 1.0' in metrics
    renewals = re.search(r"^turnkeeper_lease_renewals_total (\S+)$", metrics, re.MULTILINE)
    assert renewals is not None
    assert float(renewals.group(1)) > 0, "both owners renewed their leases"
    assert re.search(r"^turnkeeper_refused_appends_total \S+$", metrics, re.MULTILINE)


def test_unknown_run_and_removed_log(fleet: Fleet, web: WebServer, http: httpx.Client) -> None:
    tokens = stream_tokens()
    assert http.get("/runs/nope").status_code == 404
    assert http.post("/runs/nope/cancel").status_code == 404
    missing = http.get(f"/runs/nope/events?token={tokens.issue('nope')}")
    assert missing.status_code == 404
    assert missing.json() == {"error": "no run has the id 'nope'", "run_id": "nope"}

    body = _submit(http, "retained")
    fleet.wait_settled("retained")
    full = fleet.log_of("retained")
    # What retention (or a flush) does to a closed log: it is rebuilt from Postgres.
    for after in (0, 3, len(full)):
        fleet.client.log.delete("retained")
        rebuilt, end = read_stream(http, f"{body['stream_url']}&offset={after}")
        assert rebuilt == full[after:], after
        assert end.chunk == {"last_seq": len(full)}
    # Once its stored output is pruned too, a lost log is gone: 410, never an empty stream.
    fleet.client.store.prune_settled(0, 100)
    fleet.client.log.delete("retained")
    for after in (0, 3, len(full)):
        gone = http.get(f"{body['stream_url']}&offset={after}")
        assert gone.status_code == 410, after
        assert gone.json()["reason"] == "pruned"


def test_the_sentinel_nonce_never_leaves_the_server(
    fleet: Fleet, web: WebServer, http: httpx.Client
) -> None:
    """The nonce lives in the run's placement record for successors, and nowhere else: no
    route, stream, page or log line shows it, nor the placement record at all."""
    run_id = "nonce-run"
    body = _submit(http, run_id)
    _, _ = read_stream(http, body["stream_url"])
    run = fleet.wait_settled(run_id)
    assert run.sandbox_ref is not None
    nonce = run.sandbox_ref["journals"][0]["nonce"]
    assert re.fullmatch("[0-9a-f]{64}", nonce)
    path = quote(run_id, safe="")
    seen = [
        str(body),
        http.get(f"/runs/{path}").text,
        http.get("/runs").text,
        http.get(body["stream_url"]).text,  # the whole stream, the log being closed
        http.get(f"/sessions/s-{run_id}/transcript").text,
        http.get(f"/ui/runs/{path}").text,
        http.get("/metrics").text,
        http.post(f"/runs/{path}/cancel").text,
        fleet.dump_logs(),
    ]
    assert [text for text in seen if nonce in text] == []
    assert [text for text in seen[:8] if "journals" in text or "sandbox_ref" in text] == []
