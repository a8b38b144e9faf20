# ruff: noqa: E501 - the suite's test names, verbatim
"""The official conformance suite (``@durable-streams/server-conformance-tests`` from
npm, run by its own vitest) against run streams: every test that applies to a
read-only JSON stream must pass.

The suite creates and appends to its streams itself; ``tests.web.conformance_harness``
turns those writes into runs and run-log appends, the way the driver writes, and
passes every read to the real app. Which tests do not apply, and why, is in
``NOT_APPLICABLE`` (and in the README).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web.conformance_harness import ConformanceHarness
from tests.web.conftest import ApiKeys
from tests.web.npm_packages import CONFORMANCE_TESTS, install_packages, run_script
from turnkeeper.config import Settings
from turnkeeper.web import create_app
from turnkeeper.web.serve import BackgroundServer

LONG_POLL_SECONDS = 2.0

# The suite's tests of the read side, run against run streams; each must pass.
APPLICABLE: tuple[str, ...] = (
    "Browser Security Headers > should include X-Content-Type-Options: nosniff on GET responses",
    "Browser Security Headers > should include X-Content-Type-Options: nosniff on HEAD responses",
    "Browser Security Headers > should include Cross-Origin-Resource-Policy header on GET responses",
    "Browser Security Headers > should include Cache-Control: no-store on HEAD responses",
    "Browser Security Headers > should include X-Content-Type-Options: nosniff on SSE responses",
    "Browser Security Headers > should include X-Content-Type-Options: nosniff on long-poll responses",
    "Browser Security Headers > should include security headers on error responses",
    "Content-Type Validation > should return stream content-type on GET",
    "HEAD Metadata > should return 404 for non-existent stream",
    "Offset Validation and Resumability > should return correct tail offset for offset=now",
    "Offset Validation and Resumability > should return empty JSON array for offset=now on JSON streams",
    "Offset Validation and Resumability > should support offset=now with long-poll mode (waits for data)",
    "Offset Validation and Resumability > should support offset=now with SSE mode",
    "Offset Validation and Resumability > should return 404 for offset=now on non-existent stream",
    "Offset Validation and Resumability > should return 404 for offset=now with long-poll on non-existent stream",
    "Offset Validation and Resumability > should return 404 for offset=now with SSE on non-existent stream",
    "Offset Validation and Resumability > should support offset=now with SSE on empty stream",
    "Offset Validation and Resumability > should reject malformed offset (contains comma)",
    "Offset Validation and Resumability > should reject offset with spaces",
    "Protocol Edge Cases > should reject empty offset parameter",
    "Protocol Edge Cases > should reject multiple offset parameters",
    "Long-Poll Edge Cases > should require offset parameter for long-poll",
    "Long-Poll Edge Cases > should return Stream-Cursor, Stream-Up-To-Date and Stream-Next-Offset on 204 timeout",
    "Caching and ETag > should generate ETag on GET responses",
    "Caching and ETag > should return 304 Not Modified for matching If-None-Match",
    "SSE Mode > should return text/event-stream content-type for SSE requests",
    "SSE Mode > should accept live=sse query parameter for application/json",
    "SSE Mode > should require offset parameter for SSE mode",
    "SSE Mode > JSON SSE catch-up pairs every data event with a control event",
    "SSE Mode > should send control events with offset",
    "SSE Mode > should generate streamCursor in SSE control events",
    "SSE Mode > should handle cursor collision with jitter in SSE mode",
    "SSE Mode > should wrap JSON data in arrays for SSE and produce valid JSON",
    "SSE Mode > should handle SSE for empty stream with correct offset",
    "SSE Mode > should send upToDate flag in SSE control events when caught up",
    "SSE Mode > should prevent CRLF injection - carriage return only attack vectors",
    "SSE Mode > should handle JSON payloads with embedded newlines safely",
    "SSE Mode > should generate unique, monotonically increasing offsets in SSE mode",
    "SSE Mode > should NOT include Stream-SSE-Data-Encoding header for application/json streams",
    "JSON Mode > should allow PUT with empty array body (creates empty stream)",
    "JSON Mode > should wrap single JSON value in array",
    "JSON Mode > should concatenate multiple appends into single array",
    "JSON Mode > should preserve JSON structure and nesting",
    "JSON Mode > should work with client json() iterator",
    "Stream Closure > HEAD with Stream Closure > head-closed-stream: HEAD returns Stream-Closed: true header",
    "Stream Closure > HEAD with Stream Closure > head-open-stream-no-closed-header: HEAD on open stream does NOT have Stream-Closed header",
    "Stream Closure > Read Closed Streams (Catch-up) > read-closed-stream-partial-no-closed: Partial read of closed stream does NOT include Stream-Closed",
    "Stream Closure > Long-poll with Stream Closure > longpoll-closed-stream-immediate: No wait when closed stream at tail, returns immediately",
    "Stream Closure > Long-poll with Stream Closure > longpoll-closed-returns-204-with-header: Returns 204 with Stream-Closed: true",
    "Stream Closure > SSE with Stream Closure > sse-closed-stream-control-event: Final control event has streamClosed: true",
    "Stream Closure > SSE with Stream Closure > sse-closed-stream-no-cursor: streamCursor omitted when streamClosed is true",
    "Stream Closure > SSE with Stream Closure > sse-closed-stream-connection-closes: Connection closes after final event",
    "Stream Closure > Edge Cases > offset-now-on-closed-stream: offset=now on closed stream returns Stream-Closed: true",
    "Property-Based Tests (fast-check) > Offset Validation Properties > should reject offsets with invalid characters",
)


@pytest.fixture
def harness(settings: Settings, api_keys: ApiKeys) -> Iterator[str]:
    app = create_app(
        settings, ping_seconds=0.5, long_poll_seconds=LONG_POLL_SECONDS, sse_seconds=5.0
    )
    front = ConformanceHarness(app, settings, key=api_keys.alice, key_name="alice")
    server = BackgroundServer.start(front)  # type: ignore[arg-type]
    try:
        yield server.base_url
    finally:
        server.stop()


def _run_suite(base_url: str, pattern: str, out: Path) -> dict[str, Any]:
    prefix = install_packages(CONFORMANCE_TESTS)
    vitest = prefix / "node_modules" / "vitest" / "vitest.mjs"
    done = run_script(
        prefix,
        "conformance.test.mjs",
        [],
        timeout=1800,
        env={
            "DURABLE_STREAMS_URL": base_url,
            "DURABLE_STREAMS_LONG_POLL_MS": str(int(LONG_POLL_SECONDS * 1000)),
        },
        command=[
            "node",
            str(vitest),
            "run",
            "--reporter=json",
            f"--outputFile={out}",
            "--testTimeout=60000",
            # The suite bounds some reads by wall clock (2 s for an SSE answer, its
            # own code): on a machine this loaded they can run out, so a test that
            # fails is run again, up to 3 times, before it counts as failed.
            "--retry=3",
            "-t",
            pattern,
        ],
    )
    assert out.exists(), done.stderr[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_the_read_side_conformance_tests_pass(harness: str, tmp_path: Path) -> None:
    # vitest matches -t against a test's describe titles and its own, joined by spaces.
    names = "|".join(re.escape(name.replace(" > ", " ")) for name in APPLICABLE)
    report = _run_suite(harness, f"^(?:{names})$", tmp_path / "report.json")
    outcomes = {
        " > ".join([*test["ancestorTitles"], test["title"]]): (
            test["status"],
            " ".join(test.get("failureMessages", []))[:2000],
        )
        for suite in report["testResults"]
        for test in suite["assertionResults"]
        if test["status"] != "skipped"
    }
    assert sorted(outcomes) == sorted(APPLICABLE)  # every one ran, and nothing else
    failed = {name: message for name, (status, message) in outcomes.items() if status != "passed"}
    assert failed == {}
