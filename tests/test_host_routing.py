"""The routing decisions of hosts.py, pure: where a takeover goes, and whether a
message that reached one host's worker is sent on, for every view of liveness.

A message must never bounce: whichever worker consumes it, the route it computes
names the holding host or the shared queue, and the holding host never sends on.
"""

from __future__ import annotations

import functools
import itertools
from datetime import UTC, datetime

import pytest

from turnkeeper.config import Settings
from turnkeeper.hosts import takeover_host
from turnkeeper.store.records import Run, RunStatus

HOSTS = ("host-a", "host-b", "host-c")
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _run(provider: str, host: str | None) -> Run:
    return Run(
        run_id="r1",
        seq=1,
        session_id="s1",
        status=RunStatus.RUNNING,
        payload={},
        attempt_id="a2",
        epoch=2,
        owner=None,
        lease_expires_at=None,
        attempt_count=1,
        max_attempts=5,
        deadline=None,
        cancel_requested_at=None,
        sandbox_ref={"sandbox": {"provider": provider, "id": "x"}, "journals": [], "host": host},
        created_at=NOW,
        started_at=NOW,
        finished_at=None,
        updated_at=NOW,
        error=None,
        dispatched_at=NOW,
        pruned_at=None,
        handed_over_at=NOW,
        sandbox_host=host,
    )


@functools.cache
def _settings(here: str, shared: bool) -> Settings:
    return Settings(host_id=here, sandboxes_shared=shared)


def _sent_on(run: Run, here: str, shared: bool, alive: set[str]) -> str | None:
    """What the takeover task on ``here`` does: the host it sends the message on to."""
    host = takeover_host(run, _settings(here, shared), lambda h: h in alive)
    return host if host is not None and host != here else None


@pytest.mark.parametrize("provider", ["local", "bwrap", "ssh"])
@pytest.mark.parametrize("shared", [False, True])
def test_a_takeover_is_sent_on_at_most_once_whoever_consumes_it(
    provider: str, shared: bool
) -> None:
    """Every consumer, every set of live hosts (each consumer may even see another
    one: a beat just missed): the host a message is sent on to does not send it on."""
    views = [set(c) for n in range(len(HOSTS) + 1) for c in itertools.combinations(HOSTS, n)]
    for holder, here, seen_here, seen_there in itertools.product(HOSTS, HOSTS, views, views):
        run = _run(provider, holder)
        target = _sent_on(run, here, shared, seen_here)
        if target is None:
            continue
        assert target == holder, (provider, shared, holder, here)
        assert _sent_on(run, target, shared, seen_there) is None, "never a second hop"
    assert _sent_on(_run("local", "host-a"), "host-b", False, {"host-a"}) == "host-a"
    assert _sent_on(_run("local", "host-a"), "host-b", False, set()) is None
