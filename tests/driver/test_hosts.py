"""A fleet on many hosts, simulated on this machine: each host has its own
``TURNKEEPER_HOST_ID``, data dir and sandboxes dir, and real workers.

A takeover of a run whose sandbox is on one host's disk goes to that host and waits
for it while it is alive; once it has been unseen for ``host_dead_after``, any host
takes the run over and finds its sandbox lost. Reaping is each host's own, whoever
runs beat. A drained host hands its runs over without losing or doubling a chunk.
Every log is compared whole with its oracle, or, for a run that lost its sandbox,
its part before the loss.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import (
    Fleet,
    expected_log,
    held_agent,
    host_fleet,
    kill_agents,
    release_held,
    wait_held,
)
from tests.driver.test_sandbox_loss import (
    _assert_consistent,
    _assert_every_call_answered_once,
)
from turnkeeper.config import Settings
from turnkeeper.driver.lifecycle import INTERRUPTED
from turnkeeper.driver.placement import NEVER_STARTED, Placement
from turnkeeper.owner import owner_pid
from turnkeeper.sandbox import SandboxSpec, provider_for
from turnkeeper.store.records import Run, RunStatus, Verdict
from turnkeeper.store.store import Store

LONG: dict[str, Any] = {"preset": "scripted", "turns": 3, "pace": 0.3, "seed": 13}
"""79 lines, 0.3 s apart: it outlives a worker's death, the 8 s before its restart and
the restarted worker's boot, so the takeover follows a living agent."""
PROMPT = "one host holds my sandbox"
TEXT_AGENT: dict[str, Any] = {
    "command": [
        "sh",
        "-c",
        "i=1; while [ $i -le 100 ]; do echo line $i; i=$((i+1)); sleep 0.3; done",
    ],
    "format": "text",
}
"""A plain-text agent, which cannot continue: 100 lines, 0.3 s apart."""

MakeHost = Callable[..., Fleet]


@pytest.fixture
def make_host(settings: Settings, tmp_path: Path) -> Iterator[MakeHost]:
    made: list[Fleet] = []

    def make(host_id: str, **overrides: Any) -> Fleet:
        fleet = host_fleet(settings, tmp_path / "hosts", host_id, **overrides)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.stop()


def _host_of(owner: str) -> str:
    """The host an owner id names (``owner.new_owner``: ``host:pid:token``)."""
    return owner.split(":", 1)[0]


def _wait_held_run(fleet: Fleet, run_id: str, token: str) -> Run:
    """The run once its ``held_agent(..., token, ...)`` holds (a hang guard)."""
    wait_held(token)
    return fleet.client.require(run_id)


def _assert_oracle(
    fleet: Fleet, run: Run, agent: dict[str, Any], prompt: str, workdir: Path
) -> None:
    stored = fleet.log_of(run.run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    oracle = expected_log(run.run_id, run.session_id, agent, prompt, workdir)
    assert [chunk for _, chunk in stored] == oracle


def _assert_one_agent_process(fleet: Fleet, run: Run) -> None:
    """One agent process ran, never given up, and its bytes were stored once. An owner
    killed between a journal's prepare and its writer's start leaves a journal that
    provably never started (``never-started``: disarmed, no agent ran there); the
    successor starts the agent in the next one."""
    assert run.sandbox_ref is not None
    journals = run.sandbox_ref["journals"]
    ran = [journal for journal in journals if journal.get("lost") != NEVER_STARTED]
    assert len(ran) == 1, journals
    assert "lost" not in ran[0]
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT journal_key, byte_start, byte_end FROM segments"
            " WHERE run_id = %s ORDER BY journal_key, byte_start",
            (run.run_id,),
        ).fetchall()
    assert len({r[0] for r in rows}) == 1
    ends = [r[2] for r in rows]
    assert [r[1] for r in rows] == [0, *ends[:-1]], "contiguous from byte 0, no byte twice"


@pytest.mark.slow
def test_a_worker_restarted_on_its_host_resumes_the_run_there(
    make_host: MakeHost, tmp_path: Path
) -> None:
    """The owner's worker on host A is SIGKILLed and restarted 8 s later: its agent
    lived on, and the run resumes on A, never on B, with the agent's exact output."""
    a, b = make_host("host-a"), make_host("host-b")
    a.start_worker()
    a.wait_ready()
    token = secrets.token_hex(8)  # held until its worker is back: nothing ends first
    run = a.client.submit(held_agent(LONG, token, 10), PROMPT)
    owned = _wait_held_run(a, run.run_id, token)
    assert owned.owner is not None
    assert _host_of(owned.owner) == "host-a"
    assert owned.sandbox_host == "host-a"
    b.start_worker()
    b.start_beat()
    b.wait_ready()

    a.signal_worker_of(owned, signal.SIGKILL)
    time.sleep(8)  # the scenario's outage, not a bound: host-a stays alive (60 s)
    a.start_worker()
    release_held(token)
    done = a.wait_settled(run.run_id, timeout=240)

    assert done.status is RunStatus.COMPLETED, (done.error, a.dump_logs(), b.dump_logs())
    attempts = a.attempts(run.run_id)
    assert [(epoch, outcome) for epoch, outcome, _ in attempts] == [
        (1, "superseded"),
        (2, "completed"),
    ], "waiting for the host spent no attempt"
    assert {_host_of(owner) for _, _, owner in attempts} == {"host-a"}
    assert attempts[0][2] != attempts[1][2], "the restarted worker adopted it"
    _assert_oracle(a, done, LONG, PROMPT, tmp_path / "oracle")
    _assert_one_agent_process(a, done)


HOST_DEAD_AFTER = 10.0


@pytest.mark.parametrize("agent", ["scripted", "text"])
@pytest.mark.slow
def test_a_host_gone_for_good_is_declared_dead_and_its_runs_go_on_elsewhere(
    make_host: MakeHost, tmp_path: Path, agent: str
) -> None:
    """Host A's worker and agent are killed and it never beats again: after
    ``host_dead_after`` the run is taken over on B, which finds the sandbox lost. A
    scripted agent continues there; a text agent fails with ``sandbox-lost``."""
    payload = LONG if agent == "scripted" else TEXT_AGENT
    prompt = PROMPT if agent == "scripted" else ""
    a = make_host("host-a", host_dead_after=HOST_DEAD_AFTER)
    b = make_host("host-b", host_dead_after=HOST_DEAD_AFTER)
    a.start_worker()
    a.wait_ready()
    token = secrets.token_hex(8)  # held until the host is gone: nothing ends first
    run = a.client.submit(held_agent(payload, token, 10 if agent == "scripted" else 5), prompt)
    owned = _wait_held_run(a, run.run_id, token)
    b.start_worker()
    b.start_beat()
    b.wait_ready()

    a.signal_worker_of(owned, signal.SIGKILL)
    kill_agents(a)  # the host is gone: its agents with it
    done = b.wait_settled(run.run_id, timeout=240)

    attempts = b.attempts(run.run_id)
    assert [epoch for epoch, _, _ in attempts] == [1, 2], "waiting for host-a spent nothing"
    assert _host_of(attempts[0][2]) == "host-a"
    assert _host_of(attempts[1][2]) == "host-b"
    # B adopted the run only once A had been unseen for host_dead_after (on the
    # database clock): until then its takeover waited for host-a's queue.
    with psycopg.connect(b.settings.require_database_url()) as conn:
        (waited_for_a,) = conn.execute(
            "SELECT a.started_at >= (SELECT max(last_seen) FROM workers"
            " WHERE host_id = 'host-a') + make_interval(secs => %s)"
            " FROM attempts a WHERE a.run_id = %s AND a.epoch = 2",
            (HOST_DEAD_AFTER, run.run_id),
        ).fetchone()
    assert waited_for_a is True, "adopted on host-b only once host-a was declared dead"
    chunks = [chunk for _, chunk in b.log_of(run.run_id)]
    if agent == "scripted":
        assert done.status is RunStatus.COMPLETED, (done.error, b.dump_logs())
        oracle = expected_log(run.run_id, run.session_id, LONG, PROMPT, tmp_path / "oracle")
        chunks = _assert_consistent(b.log_of(run.run_id), oracle)
        _assert_every_call_answered_once(chunks)
        assert chunks[-1] == oracle[-1]
        assert done.sandbox_ref is not None
        journals = done.sandbox_ref["journals"]
        assert [j.get("lost") for j in journals] == ["sandbox-lost", None]
        assert done.sandbox_host == "host-b", "the continuation's sandbox is B's own"
    else:
        assert done.status is RunStatus.FAILED
        assert done.error["reason"] == "sandbox-lost"  # type: ignore[index]
        assert chunks[-1] == {
            "type": "RUN_ERROR",
            "message": "the sandbox was lost mid-run and this agent cannot continue",
            "code": "sandbox-lost",
        }
        assert [c.get("name") for c in chunks].count(INTERRUPTED) == 1
        texts = [c["delta"] for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT"]
        assert texts == [f"line {i}\n" for i in range(1, len(texts) + 1)]


def _settled_with_sandbox(fleet: Fleet, run_id: str) -> Path:
    """A run settled while its sandbox on ``fleet``'s host is still there (its owner
    died between settling and destroying it), and the sandbox's directory."""
    settings = fleet.settings
    provider = provider_for(settings.sandbox_provider, settings)
    ref = provider.create(run_id, SandboxSpec())
    with Store(settings.require_database_url(), pool_size=1) as store:
        payload = {"agent": "scripted", "prompt": ""}
        store.admit_run(run_id, run_id, payload, max_attempts=5, deadline=None)
        claim = store.claim_run(run_id, f"{settings.host_id}:1", 30)
        assert claim is not None
        placement = Placement(ref, [], settings.host_id).to_dict()
        assert store.record_sandbox(claim, placement) is Verdict.DONE
        assert store.settle_run(claim, RunStatus.COMPLETED) is Verdict.DONE
    return Path(ref.root)


def _orphan(fleet: Fleet) -> Path:
    """A sandbox no run names, older than the orphan TTL."""
    settings = fleet.settings
    ref = provider_for(settings.sandbox_provider, settings).create("orphan", SandboxSpec())
    old = time.time() - 3600
    os.utime(ref.root, (old, old))
    return Path(ref.root)


def test_each_host_reaps_its_own_sandboxes_whoever_runs_beat(make_host: MakeHost) -> None:
    """Beat runs on host B; the settled run's sandbox and the orphan on host A's disk are
    destroyed by A's worker (B could not even see them), B's by B's."""
    a = make_host("host-a", orphan_ttl=60.0)
    b = make_host("host-b", orphan_ttl=60.0)
    a.start_worker()
    b.start_worker()
    a.wait_ready()
    b.wait_ready()
    on_a = [_settled_with_sandbox(a, "reap-a"), _orphan(a)]
    on_b = [_settled_with_sandbox(b, "reap-b"), _orphan(b)]
    b.start_beat()

    deadline = time.monotonic() + 120  # a hang guard
    while any(path.exists() for path in on_a + on_b):
        assert time.monotonic() < deadline, (on_a, on_b, a.dump_logs(), b.dump_logs())
        time.sleep(0.2)
    for fleet, run_id in ((a, "reap-a"), (b, "reap-b")):
        run = fleet.wait(run_id, lambda r: "sandbox" not in (r.sandbox_ref or {}), what="reaped")
        assert run.sandbox_ref == {"journals": [], "host": fleet.settings.host_id}

    def destroyed_by(fleet: Fleet) -> set[str]:
        ids = set()
        for path in fleet.logs.glob("worker-*.log"):
            for line in path.read_text(errors="replace").splitlines():
                if '"sandbox.destroyed"' in line:
                    ids.add(json.loads(line)["sandbox"])
        return ids

    assert destroyed_by(a) >= {path.name for path in on_a}
    assert destroyed_by(b) >= {path.name for path in on_b}
    assert not destroyed_by(b) & {path.name for path in on_a}


@pytest.mark.parametrize("pool", [None, "threads"])
@pytest.mark.slow
def test_a_drained_host_hands_its_live_runs_over_and_loses_nothing(
    make_host: MakeHost, tmp_path: Path, pool: str | None
) -> None:
    """``turnkeeper worker --drain`` on host A while two runs are live: the worker stops
    taking runs, hands both over when their time is up, and exits; the worker that
    replaces it on A adopts them. Every log is its oracle, each agent ran once. With
    the threads pool, both runs live in the worker process itself, which announces its
    host and takes its drain orders as a prefork pool process does."""
    a, b = make_host("host-a"), make_host("host-b")
    drained = a.start_worker(concurrency=2, pool=pool)
    a.wait_ready()
    b.start_beat()
    b.wait_ready()
    agents = [{**LONG, "seed": seed} for seed in (21, 22)]
    # Each agent holds after its tenth line until the drain is over: a run that ended
    # on its own before the drain would hand nothing over, however slow the machine.
    tokens = [secrets.token_hex(8) for _ in agents]
    runs = [
        a.client.submit(held_agent(agent, token, 10), PROMPT)
        for agent, token in zip(agents, tokens, strict=True)
    ]
    for run, token in zip(runs, tokens, strict=True):
        wait_held(token)
        owned = a.client.require(run.run_id)
        assert owned.owner is not None
        assert _host_of(owned.owner) == "host-a"

    drain = a.run_cli("worker", "--drain", "--hand-over-after", "1")
    assert drain.returncode == 0, (drain.stdout, drain.stderr, a.dump_logs())
    assert "draining 1 worker(s) on host host-a" in drain.stdout
    assert "host host-a drained" in drain.stdout
    assert drained.poll() is not None, "the drained worker exited"
    a.start_worker(concurrency=2, pool=pool)  # the redeploy
    for token in tokens:
        release_held(token)

    view = json.loads(a.run_cli("hosts", "--json").stdout)
    assert [host["host_id"] for host in view] == ["host-a"]
    assert view[0]["alive"]
    # The drained worker's two pool processes, and any of its successor's already up.
    draining = {(w["main_pid"], w["draining"]) for w in view[0]["workers"]}
    assert (drained.pid, True) in draining
    assert {main for main, flag in draining if not flag} <= {a.procs[-1].pid}

    for run, agent in zip(runs, agents, strict=True):
        done = a.wait_settled(run.run_id, timeout=240)
        assert done.status is RunStatus.COMPLETED, (done.error, a.dump_logs())
        attempts = a.attempts(run.run_id)
        assert [(epoch, outcome) for epoch, outcome, _ in attempts] == [
            (1, "superseded"),
            (2, "completed"),
        ]
        if pool == "threads":  # the turns ran in the worker process itself
            assert owner_pid(attempts[0][2]) == drained.pid
            assert owner_pid(attempts[1][2]) == a.procs[-1].pid
        else:  # in its pool processes
            assert owner_pid(attempts[0][2]) != drained.pid
        assert {_host_of(owner) for _, _, owner in attempts} == {"host-a"}
        _assert_oracle(a, done, agent, PROMPT, tmp_path / f"oracle-{run.run_id}")
        _assert_one_agent_process(a, done)
    released = b"".join(p.read_bytes() for p in a.logs.glob("worker-0.log")).count(
        b'"attempt.released"'
    )
    assert released == 2, "the drained worker let both leases go"


CHAOS_RUNS = 6
CHAOS_LEASE = 6.0
MAX_HITS = Settings.model_fields["max_attempts"].default - 2


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_on_three_hosts(make_host: MakeHost, tmp_path: Path) -> None:
    """Three hosts, six runs, their owners' workers SIGKILLed and restarted on the same
    host a moment later, until every run settles: every log is its oracle, every
    agent ran once, and every attempt of a run ran on the host of its sandbox."""
    rng = random.Random(20261202)
    # The kills are found by each host's crash watcher at once; the lease only has to
    # outlast a loaded machine's starved heartbeat, or a lease lost to load would spend
    # the attempts the kills are allowed (MAX_HITS).
    hosts = {
        name: make_host(name, lease_ttl=CHAOS_LEASE) for name in ("host-a", "host-b", "host-c")
    }
    workers: dict[str, list[subprocess.Popen[bytes]]] = {
        name: [fleet.start_worker(concurrency=2)] for name, fleet in hosts.items()
    }
    hosts["host-c"].start_beat()
    for fleet in hosts.values():
        fleet.wait_ready()
    client = hosts["host-a"].client
    agents: dict[str, tuple[dict[str, Any], str]] = {}
    for index in range(CHAOS_RUNS):
        agent = {"preset": "scripted", "turns": 1 + index % 3, "pace": 0.1, "seed": 40 + index}
        prompt = f"chaos {index}"
        agents[client.submit(agent, prompt).run_id] = (agent, prompt)
    hits: Counter[str] = Counter()
    kills = 0
    deadline = time.monotonic() + 480  # a hang guard
    while not all(client.require(run_id).status.is_terminal for run_id in agents):
        assert time.monotonic() < deadline, "".join(f.dump_logs() for f in hosts.values())
        time.sleep(rng.uniform(1.0, 3.0))
        owned = [client.require(run_id) for run_id in agents]
        # A kill ends a whole worker, both pool processes: each run it holds is hit, so
        # a worker holding a run that took all its hits is spared.
        groups = {
            run.run_id: _group_of(owner_pid(run.owner))
            for run in owned
            if run.status is RunStatus.RUNNING and run.owner
        }
        spared = {group for run_id, group in groups.items() if hits[run_id] >= MAX_HITS}
        targets = [
            run
            for run in owned
            if groups.get(run.run_id) is not None and groups[run.run_id] not in spared
        ]
        if not targets:
            continue
        victim = rng.choice(targets)
        assert victim.owner is not None
        name, pgid = _host_of(victim.owner), groups[victim.run_id]
        assert pgid is not None  # a target's group is known
        proc = next((p for p in workers[name] if p.pid == pgid and p.poll() is None), None)
        if proc is None:
            continue
        for run_id, group in groups.items():
            if group == pgid:
                hits[run_id] += 1
        os.killpg(pgid, signal.SIGKILL)
        proc.wait()
        kills += 1
        time.sleep(rng.uniform(0.0, 3.0))
        workers[name].append(hosts[name].start_worker(concurrency=2))
    assert kills >= 2, "the chaos hit something"
    for run_id, (agent, prompt) in agents.items():
        done = client.require(run_id)
        assert done.status is RunStatus.COMPLETED, (
            run_id,
            done.error,
            f"hit by {hits[run_id]} kills",
            hosts["host-a"].attempt_history(run_id),
        )
        hosts["host-a"].wait_log_closed(run_id)
        _assert_oracle(hosts["host-a"], done, agent, prompt, tmp_path / run_id)
        _assert_one_agent_process(hosts["host-a"], done)
        owners = {_host_of(owner) for _, _, owner in hosts["host-a"].attempts(run_id)}
        assert owners == {done.sandbox_host}, (run_id, owners)


@pytest.mark.slow
def test_on_a_shared_sandboxes_volume_any_host_follows_the_journal(
    make_host: MakeHost, tmp_path: Path
) -> None:
    """``TURNKEEPER_SANDBOXES_SHARED``: both hosts mount one sandboxes dir. Host A's
    worker dies, its agent lives on; B takes the run over at once (A is alive, but no
    takeover needs it) and follows A's journal from the shared dir, exactly. The
    sandbox stays A's: B does not destroy it, A's reap does."""
    shared = {"sandbox_root": tmp_path / "shared-sandboxes", "sandboxes_shared": True}
    a, b = make_host("host-a", **shared), make_host("host-b", **shared)
    a.start_worker()
    a.wait_ready()
    token = secrets.token_hex(8)  # held until its owner is dead: nothing ends first
    run = a.client.submit(held_agent(LONG, token, 10), PROMPT)
    owned = _wait_held_run(a, run.run_id, token)
    b.start_worker()
    b.start_beat()
    b.wait_ready()

    a.signal_worker_of(owned, signal.SIGKILL)
    release_held(token)
    done = b.wait_settled(run.run_id, timeout=240)

    assert done.status is RunStatus.COMPLETED, (done.error, b.dump_logs())
    attempts = b.attempts(run.run_id)
    assert [(epoch, outcome) for epoch, outcome, _ in attempts] == [
        (1, "superseded"),
        (2, "completed"),
    ]
    assert [_host_of(owner) for _, _, owner in attempts] == ["host-a", "host-b"]
    _assert_oracle(b, done, LONG, PROMPT, tmp_path / "oracle")
    _assert_one_agent_process(b, done)
    assert done.sandbox_host == "host-a"
    assert done.sandbox_ref is not None
    root = Path(done.sandbox_ref["sandbox"]["root"])
    assert root.exists(), "B signals nothing of A's: the sandbox waits for A's reap"
    a.start_worker()
    a.wait(run.run_id, lambda r: "sandbox" not in (r.sandbox_ref or {}), 120, "reaped by A")
    assert not root.exists()
