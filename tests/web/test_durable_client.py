"""The official Durable Streams client (``@durable-streams/client`` from npm, in Node)
reads runs of a real fleet: live to their end, closed, and resumed from a saved offset."""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.driver.fleet import Fleet, expected_log
from tests.web.conftest import ApiKeys, WebServer
from tests.web.durable_streams import stream_path
from tests.web.npm_packages import DURABLE_CLIENT, install_packages, run_script
from turnkeeper.web.durable import format_offset

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.15, "seed": 11}


@pytest.fixture(scope="module")
def client_prefix() -> Path:
    return install_packages(DURABLE_CLIENT)


def _read(prefix: Path, **options: Any) -> dict[str, Any]:
    # A hang guard: a live read lasts as long as its run, which a loaded machine slows.
    done = run_script(prefix, "durable_read.mjs", [json.dumps(options)], timeout=420)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert "error" not in result, result
    return result


def _submit(http: httpx.Client, run_id: str) -> dict[str, Any]:
    response = http.post(
        "/runs",
        json={"agent": AGENT, "prompt": "stream me", "run_id": run_id, "session_id": f"s-{run_id}"},
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.slow
def test_the_client_reads_a_live_run_to_its_end(  # noqa: PLR0917 - fixtures
    client_prefix: Path,
    fleet: Fleet,
    web: WebServer,
    api_keys: ApiKeys,
    http: httpx.Client,
    tmp_path: Path,
) -> None:
    run_id = "live ds/1 ü"  # a space, a slash and a non-ASCII letter in the stream URL
    body = _submit(http, run_id)
    token = body["stream_url"].rpartition("token=")[2]
    url = web.base_url + stream_path(run_id)
    key = {"Authorization": f"Bearer {api_keys.alice}"}
    readers = [
        {"url": url, "live": "sse", "headers": key},
        {"url": url, "live": "long-poll", "headers": key},
        {"url": url, "live": True, "params": {"token": token}},  # the browser's way in
    ]
    with ThreadPoolExecutor(len(readers)) as pool:
        results = list(pool.map(lambda options: _read(client_prefix, **options), readers))

    fleet.wait_settled(run_id)
    stored = [chunk for _, chunk in fleet.log_of(run_id)]
    oracle = expected_log(run_id, f"s-{run_id}", AGENT, "stream me", tmp_path / "oracle")
    assert stored == oracle
    for options, result in zip(readers, results, strict=True):
        assert result["items"] == oracle, (options["live"], result["batches"], len(oracle))
        assert result["streamClosed"] is True
        assert result["offset"] == format_offset(len(oracle))
        assert result["batches"][-1]["streamClosed"] is True
        assert all(b["offset"] < after["offset"] for b, after in _pairs(result["batches"]))


def _pairs(batches: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    nonempty = [batch for batch in batches if batch["count"]]
    return list(itertools.pairwise(nonempty))


def test_the_client_reads_a_closed_run_and_resumes_from_a_saved_offset(
    client_prefix: Path,
    fleet: Fleet,
    web: WebServer,
    api_keys: ApiKeys,
    http: httpx.Client,
) -> None:
    run_id = "resumed-ds"
    _submit(http, run_id)
    url = web.base_url + stream_path(run_id)
    key = {"Authorization": f"Bearer {api_keys.alice}"}

    # Stop part-way through the live run, keeping the offset the client was at.
    first = _read(client_prefix, url=url, live="sse", headers=key, stopAfter=3)
    saved = first["offset"]
    assert saved == format_offset(len(first["items"]))
    resumed = _read(client_prefix, url=url, live="long-poll", headers=key, offset=saved)

    fleet.wait_settled(run_id)
    stored = [chunk for _, chunk in fleet.log_of(run_id)]
    assert first["items"] == stored[: len(first["items"])]
    assert resumed["items"] == stored[len(first["items"]) :]
    assert resumed["streamClosed"] is True

    # The closed run, whole: catch-up only, and live (which ends at once with closure).
    for live in (False, True, "sse", "long-poll"):
        whole = _read(client_prefix, url=url, live=live, headers=key)
        assert whole["items"] == stored, live
        assert whole["offset"] == format_offset(len(stored))
        assert whole["streamClosed"] is True, live
    # Resuming a closed run from a saved offset gives exactly the rest.
    for after in (1, len(stored) - 1, len(stored)):
        rest = _read(client_prefix, url=url, live="sse", headers=key, offset=format_offset(after))
        assert rest["items"] == stored[after:], after
        assert rest["streamClosed"] is True


def test_the_client_is_refused_without_access(
    client_prefix: Path, fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client
) -> None:
    _submit(http, "private-ds")
    url = web.base_url + stream_path("private-ds")
    for headers, status in (({}, 401), ({"Authorization": f"Bearer {api_keys.bob}"}, 404)):
        done = run_script(
            client_prefix,
            "durable_read.mjs",
            [json.dumps({"url": url, "headers": headers, "live": False})],
        )
        result = json.loads(done.stdout)
        assert result["error"]["status"] == status, result
