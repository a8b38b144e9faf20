"""Soak: a stream of runs on a real fleet while workers, Redis, Postgres and ssh fail.

For ``--minutes`` the soak keeps ``--runs-in-flight`` runs going on ``--workers``
``turnkeeper worker`` processes (and one beat), a mix of scripted agents and plain
command agents, a share of them on the ssh provider. Meanwhile, at random:

- a worker is SIGKILLed (its whole process group) and started again;
- a worker is SIGSTOPped and SIGCONTed 0.5 to 6 s later: past the lease it is a
  zombie, whose owner writes must all be refused;
- the log's Redis is killed with SIGKILL and restarted empty (no persistence);
- every connection to the soak's database is terminated (``pg_terminate_backend``);
- the ssh link is cut: the test sshd and every session it serves are killed, and
  it is started again 1 to 5 s later.

Worker failures come every 0.4 to 2.0 s (1,500 in 30 minutes at most), half of them
aimed at a worker that owns a run, and only at workers that finished starting
(Celery said "ready"): a SIGKILL only while two have (a frozen one may be
killed too), so the fleet keeps making progress. A
worker that exits by itself (it refuses to start while its ssh host is down) is
started again. Every event is on a timeline; a failed or differing run is reported
with the events around it.

The log lives on a Redis the soak starts itself (``redis-server`` on a free
loopback port, ``--save ''``, no AOF), so it can lose it whole. The Celery broker
stays on the configured Redis (``TURNKEEPER_REDIS_URL``, keys under the soak's
namespace, deleted afterwards): the broker only carries triggers, and a lost
message is the reconciler's business, but a broker restart would test Celery's
reconnection rather than turnkeeper's cache, which is what the Redis restarts are for.

At the end, once the chaos stops and every run settled, every run's log is read
back whole as a client reads it (``Client.log.snapshot``) and compared element by
element with its oracle: the agent run directly in an empty directory, outside
the fleet, its stdout translated and wrapped in the run's first and last chunk
(the oracle of the crash tests, ``tests/driver/fleet.py``). Postgres is the truth
and Redis its cache: when a client reads a settled run's log back empty, the
soak also rebuilds the run's output from the stored segments (``driver/replay.py``)
and says whether the truth survived; the empty read still counts as lost chunks.

    .venv/bin/python bench/soak.py --minutes 30 [--workers 3] [--runs-in-flight 4]
        [--seed N] [--json report.json]

Exit status 1 when any chunk was lost or doubled, any run failed, or a run never
settled. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, for tests.*

from tests.driver.fleet import CELERY_QUIET, FAST, _kill_agents
from tests.sandboxes import release_sandboxes
from tests.sshd import Sshd, sshd_unavailable

from _fleet import BenchFleet, bench_fleet
from turnkeeper.agents.formats import translator_for
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.chunks import Chunk
from turnkeeper.client import Client
from turnkeeper.config import load_settings, plain_postgres_url
from turnkeeper.driver import lifecycle
from turnkeeper.driver.lifecycle import INTERRUPTED
from turnkeeper.driver.placement import Placement, nonce_of
from turnkeeper.driver.replay import Replay, StoredJournal, batches, with_newlines
from turnkeeper.errors import TurnkeeperError
from turnkeeper.logconfig import configure_logging
from turnkeeper.owner import owner_pid
from turnkeeper.store.records import Run, RunStatus

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
LEASE_TTL = 3.0
TIMING = {"lease_ttl": LEASE_TTL, "heartbeat_interval": 1.0, "reconcile_interval": 1.0}
"""The issue's busy-fleet timing: tighter leases turn CPU starvation on a shared
2-core host into takeovers that no failure caused."""
KILL_SHARE = 0.15
"""Of the worker failures, the share that are SIGKILLs (a restart costs seconds of CPU)."""
MIN_UP_FOR_A_KILL = 2
"""A SIGKILL only while at least this many workers have started (else a SIGSTOP)."""
OWNER_SHARE = 0.5
"""Of the worker failures, the share aimed at a worker that owns a run, when one does."""
WORKER_CONCURRENCY = 2
PROMPTS = ["fix the typo in notes", "add a test", "tidy the config", "rename the helper"]
TERMINATE_SQL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(400):  # a hang guard while the server binds
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        time.sleep(0.05)
    raise SystemExit(f"{what} never listened on 127.0.0.1:{port}")


# --- the servers the soak breaks ------------------------------------------------------


class LogRedis:
    """The run log's Redis, owned by the soak: killed with SIGKILL, restarted empty."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        argv += ["--loglevel", "warning", "--protected-mode", "no"]
        with (self.workdir / "redis.log").open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, "redis-server")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- the fleet ------------------------------------------------------------------------


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path
    stopped_until: float | None = None  # monotonic time of its SIGCONT while frozen
    ready: bool = False

    def is_ready(self) -> bool:
        """Once Celery said it consumes (after the worker's own sandbox check)."""
        if not self.ready:
            self.ready = b" ready." in self.log.read_bytes()
        return self.ready


def last_line(log: Path) -> str:
    """What a worker that exited by itself said last (its one-line refusal)."""
    lines = log.read_bytes().decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else "(nothing)"


def start_worker(fleet: BenchFleet) -> Worker:
    proc = fleet.start("worker", "-c", str(WORKER_CONCURRENCY), *CELERY_QUIET)
    return Worker(proc, fleet.log_files[proc.pid])


# --- runs and their oracle ------------------------------------------------------------


@dataclass
class Submitted:
    run_id: str
    agent: dict[str, Any]
    prompt: str
    provider: str
    owner_hits: int = 0  # SIGKILLs and SIGSTOPs of the worker that owned it


def agent_for(rng: random.Random) -> tuple[dict[str, Any], str]:
    """A scripted agent (most runs) or a plain command agent, with its prompt."""
    if rng.random() < 0.7:
        agent = {
            "preset": "scripted",
            "turns": rng.randint(1, 4),
            "pace": 0.05,
            "seed": rng.randint(0, 5),
        }
        return agent, rng.choice(PROMPTS)
    lines = rng.randint(10, 60)
    script = (
        f'i=0; while [ $i -lt {lines} ]; do echo "line $i of {lines}"; i=$((i+1)); sleep 0.1; done'
    )
    return {"command": ["/bin/sh", "-c", script], "format": "text"}, "count"


class Oracle:
    """The crash tests' oracle (``tests/driver/fleet.py: expected_log``), with each
    agent's stdout computed once: the direct run, with no pace (pace only sleeps)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._stdout: dict[str, bytes] = {}

    def stdout(self, agent: dict[str, Any], prompt: str) -> bytes:
        direct = dict(agent, pace=0.0) if "preset" in agent else agent
        if "command" in agent:  # a command agent's sleeps do not change its output
            script = agent["command"][2].replace("sleep 0.1", "true")
            direct = dict(agent, command=[*agent["command"][:2], script])
        key = json.dumps([direct, prompt], sort_keys=True)
        if key not in self._stdout:
            spec = AgentSpec.from_payload(direct)
            cwd = self.workdir / str(len(self._stdout))
            cwd.mkdir(parents=True)
            self._stdout[key] = subprocess.run(
                spec.argv(prompt),
                cwd=cwd,
                capture_output=True,
                check=True,
                timeout=120,
                env={"PATH": os.environ["PATH"], "HOME": str(cwd)},
            ).stdout
        return self._stdout[key]

    def log(self, run: Run, agent: dict[str, Any], prompt: str) -> list[Chunk]:
        spec = AgentSpec.from_payload(agent)
        translator = translator_for(spec.format, run.run_id)
        chunks: list[Chunk] = [lifecycle.run_started(run.run_id, run.session_id)]
        for line in self.stdout(agent, prompt).splitlines(keepends=True):
            chunks.extend(translator.feed(line))
        chunks.extend(translator.finish())
        chunks.append(lifecycle.run_finished(run.run_id, run.session_id))
        return chunks


def truth_of(client: Client, run: Run, output_format: str) -> list[Chunk]:
    """The run's output as Postgres holds it (``driver/replay.py``'s rule): started,
    each journal's lines from its segments, marks or closing chunks, the final chunk."""
    replay = Replay(run.run_id, run.session_id, output_format)
    chunks = replay.started()
    for index, journal in enumerate(Placement.of(run).journals):
        stored = StoredJournal(client.store, journal.journal_key, nonce_of(journal))
        for batch in batches(stored, 256):
            chunks += replay.lines(with_newlines(batch))
        if journal.lost is not None:
            chunks += replay.interrupted(index)
        elif stored.exit_code is not None:
            chunks += replay.closing()
    chunks.append(lifecycle.final_chunk(run))
    return chunks


CONTINUED = "runs_continued_after_a_lost_agent_process"
"""Runs whose log holds interruption marks and otherwise exactly the agent's output."""


def is_interruption(chunk: Chunk) -> bool:
    return chunk.get("type") == "CUSTOM" and chunk.get("name") == INTERRUPTED


def first_difference(got: list[Chunk], want: list[Chunk]) -> int:
    pairs = zip(got, want, strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(got), len(want)))


def canonical(chunk: Chunk) -> str:
    return json.dumps(chunk, sort_keys=True)


# --- the soak -------------------------------------------------------------------------


@dataclass
class Tally:
    events: Counter[str] = field(default_factory=Counter)
    submitted: list[Submitted] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    exit_reasons: Counter[str] = field(default_factory=Counter)  # a self-exit's last line


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.workdir = workdir
        self.tally = Tally()
        self.ssh_enabled = sshd_unavailable() is None
        self.redis = LogRedis(workdir / "log-redis")
        self.sshd = Sshd(workdir / "sshd", max_sessions=200) if self.ssh_enabled else None
        self.workers: list[Worker] = []
        self.unsettled: set[str] = set()
        self.client: Client | None = None
        self.plan: dict[str, float] = {}
        self.ssh_back: float | None = None

    def note(self, kind: str, **detail: Any) -> None:
        """One chaos event on the timeline, on the wall clock (as the store's are)."""
        self.tally.timeline.append({"at": time.time(), "event": kind, **detail})

    # --- chaos ------------------------------------------------------------------------

    def owned_by(self, worker: Worker) -> list[Submitted]:
        """The unsettled runs whose owner is a process of ``worker``."""
        try:
            pids = {worker.proc.pid} | {
                c.pid for c in psutil.Process(worker.proc.pid).children(recursive=True)
            }
        except psutil.Error:
            return []
        owned = []
        for sub in self.in_flight:
            run = self.safe_get(sub.run_id)
            if run is not None and run.owner and owner_pid(run.owner) in pids:
                owned.append(sub)
        return owned

    def victim(self, among: list[Worker]) -> tuple[Worker, list[Submitted]]:
        """Mostly a worker that owns a run, so that most failures hit a run's owner."""
        owners = [(w, owned) for w in among if (owned := self.owned_by(w))]
        if owners and self.rng.random() < OWNER_SHARE:
            return self.rng.choice(owners)
        worker = self.rng.choice(among)
        return worker, self.owned_by(worker)

    def started(self) -> list[Worker]:
        """Workers that finished starting, frozen or not: a worker still starting is
        not the case under test."""
        return [w for w in self.workers if w.is_ready()]

    def targets(self) -> list[Worker]:
        """Workers that are up and running."""
        return [w for w in self.started() if w.stopped_until is None]

    def replace_exited(self, fleet: BenchFleet) -> None:
        """A worker that exited by itself (it refuses to start while its ssh host is
        unreachable) is started again."""
        for index, worker in enumerate(self.workers):
            if worker.proc.poll() is not None:
                said = last_line(worker.log)
                self.note("worker-exited", pid=worker.proc.pid, code=worker.proc.returncode)
                self.tally.events["worker-exited-by-itself"] += 1
                self.tally.exit_reasons[said] += 1
                self.workers[index] = start_worker(fleet)

    def kill_worker(self, fleet: BenchFleet) -> bool:
        """SIGKILL a started worker, a frozen one too (a zombie that never wakes)."""
        up = self.started()
        if not up:
            return False
        victim, owned = self.victim(up)
        index = self.workers.index(victim)
        for sub in owned:
            sub.owner_hits += 1
        self.note("worker-sigkill", pid=victim.proc.pid, runs=[s.run_id for s in owned])
        try:
            os.killpg(victim.proc.pid, signal.SIGKILL)
            os.killpg(victim.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        victim.proc.wait()
        self.workers[index] = start_worker(fleet)
        self.tally.events["worker-sigkill"] += 1
        return True

    def stop_worker(self, now: float) -> bool:
        up = self.targets()
        if not up:
            return False
        victim, owned = self.victim(up)
        for sub in owned:
            sub.owner_hits += 1
        os.killpg(victim.proc.pid, signal.SIGSTOP)
        pause = self.rng.uniform(0.5, 6.0)
        self.note(
            "worker-sigstop",
            pid=victim.proc.pid,
            seconds=round(pause, 1),
            runs=[s.run_id for s in owned],
        )
        victim.stopped_at, victim.stopped_until = now, now + pause
        self.tally.events["worker-sigstop"] += 1
        if pause > LEASE_TTL:
            self.tally.events["worker-zombie (stopped past the lease)"] += 1
        return True

    def wake_workers(self, now: float, *, all_of_them: bool = False) -> None:
        for worker in self.workers:
            if worker.stopped_until is not None and (all_of_them or now >= worker.stopped_until):
                os.killpg(worker.proc.pid, signal.SIGCONT)
                self.note("worker-sigcont", pid=worker.proc.pid)
                worker.stopped_until = None
                self.tally.events["worker-sigcont"] += 1

    def restart_redis(self) -> None:
        self.redis.kill()
        self.note("log-redis-kill")
        time.sleep(self.rng.uniform(0.2, 2.0))
        self.redis.start()
        self.note("log-redis-start")
        self.tally.events["log-redis-restart"] += 1

    def terminate_postgres(self, database_url: str) -> None:
        with psycopg.connect(plain_postgres_url(database_url), autocommit=True) as conn:
            row = conn.execute(TERMINATE_SQL).fetchone()
        self.tally.events["postgres-terminate"] += 1
        self.note("postgres-terminate", backends=int(row[0]) if row else 0)
        self.tally.events["postgres-backends-terminated"] += int(row[0]) if row else 0

    # --- runs -------------------------------------------------------------------------

    @property
    def in_flight(self) -> list[Submitted]:
        return [s for s in self.tally.submitted if s.run_id in self.unsettled]

    def safe_get(self, run_id: str) -> Run | None:
        assert self.client is not None
        for _ in range(50):
            try:
                return self.client.get(run_id)
            except TurnkeeperError:  # the soak's own connections are terminated too
                time.sleep(0.1)
        return None

    def submit(self) -> None:
        assert self.client is not None
        agent, prompt = agent_for(self.rng)
        provider = (
            "ssh" if self.ssh_enabled and self.rng.random() < self.args.ssh_share else "bwrap"
        )
        for _ in range(50):
            try:
                run = self.client.submit(
                    agent, prompt, provider=provider, max_attempts=self.args.max_attempts
                )
                break
            except TurnkeeperError:
                time.sleep(0.1)
        else:
            raise SystemExit("could not submit a run for 5 s")
        self.tally.submitted.append(Submitted(run.run_id, agent, prompt, provider))
        self.unsettled.add(run.run_id)

    def refresh(self) -> None:
        for run_id in list(self.unsettled):
            run = self.safe_get(run_id)
            if run is not None and run.status.is_terminal:
                self.unsettled.discard(run_id)

    # --- main -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        overrides: dict[str, Any] = {
            **FAST,
            **TIMING,
            "redis_url": self.redis.url,
            "broker_url": load_settings().redis_url or "",
            "max_attempts": args.max_attempts,
        }
        if not overrides["broker_url"]:
            raise SystemExit("the broker is the configured Redis: set TURNKEEPER_REDIS_URL")
        self.redis.start()
        try:
            if self.sshd is not None:
                self.sshd.start()
                overrides.update(self.sshd.settings(), sandbox_provider="ssh")
            return self.run_fleet(overrides)
        finally:  # whatever failed: nothing of the soak outlives it
            self.redis.kill()
            if self.sshd is not None:
                self.sshd.cut()

    def run_fleet(self, overrides: dict[str, Any]) -> dict[str, Any]:
        with bench_fleet(self.workdir / "data", **overrides) as fleet:
            logs = self.workdir / "logs"
            logs.mkdir()
            fleet.env["TURNKEEPER_LOG_LEVEL"] = "INFO"
            fleet.env["TURNKEEPER_LOG_FORMAT"] = "json"
            fleet.logs = logs
            self.client = Client.from_settings(fleet.settings)
            try:
                return self.drive(fleet, fleet.settings.require_database_url())
            finally:
                fleet.stop()
                self.client.close()
                _kill_agents(fleet.settings.sandboxes_dir)
                if self.sshd is not None:
                    _kill_agents(self.sshd.root)
                release_sandboxes(fleet.settings)
                broker = redis.Redis.from_url(overrides["broker_url"])
                for key in broker.scan_iter(match=f"{fleet.settings.namespace}*", count=1000):
                    broker.delete(key)
                broker.close()

    def drive(self, fleet: BenchFleet, database_url: str) -> dict[str, Any]:
        args = self.args
        self.workers = [start_worker(fleet) for _ in range(args.workers)]
        fleet.beat()
        started = time.monotonic()
        end = started + args.minutes * 60
        rng = self.rng
        self.plan = {
            "worker": started + 3.0,
            "postgres": started + rng.uniform(5, 15),
            "redis": started + rng.uniform(20, 60),
            "ssh": started + rng.uniform(10, 30),
            "progress": started + 10.0,
            "refresh": started,
        }
        while (now := time.monotonic()) < end:
            self.wake_workers(now)
            if now >= self.plan["refresh"]:
                self.refresh()
                while len(self.unsettled) < args.runs_in_flight:
                    self.submit()
                self.plan["refresh"] = now + 1.0
            self.chaos_step(now, fleet, database_url)
            if now >= self.plan["progress"]:
                self.progress(now - started)
                self.plan["progress"] = now + 10.0
            time.sleep(0.1)
        self.wake_workers(time.monotonic(), all_of_them=True)
        if self.sshd is not None and self.ssh_back is not None:
            self.sshd.start()
            self.note("sshd-start")
        chaos_seconds = time.monotonic() - started
        print(f"[{chaos_seconds:6.0f}s] chaos over; waiting for {len(self.unsettled)} runs")
        settle_deadline = time.monotonic() + args.settle_timeout  # a hang guard
        while self.unsettled and time.monotonic() < settle_deadline:
            time.sleep(1.0)
            self.refresh()
        return self.check(chaos_seconds)

    def chaos_step(self, now: float, fleet: BenchFleet, database_url: str) -> None:
        """Whatever failure is due now: a worker every 0.4 to 2.0 s (about a sixth of them
        SIGKILLs), Postgres every 5 to 15 s, Redis every 40 to 80 s, ssh every 20 to 40 s."""
        rng, plan = self.rng, self.plan
        self.replace_exited(fleet)
        if now >= plan["worker"]:
            if rng.random() < KILL_SHARE and len(self.started()) >= MIN_UP_FOR_A_KILL:
                done = self.kill_worker(fleet)
            else:
                done = self.stop_worker(now)
            # none up to hit: try again soon, so the rate holds while workers start
            plan["worker"] = now + (rng.uniform(0.4, 2.0) if done else 0.3)
        if now >= plan["postgres"]:
            self.terminate_postgres(database_url)
            plan["postgres"] = now + rng.uniform(5, 15)
        if now >= plan["redis"]:
            self.restart_redis()
            plan["redis"] = now + rng.uniform(40, 80)
        if self.sshd is None:
            return
        if self.ssh_back is None and now >= plan["ssh"]:
            cut = self.sshd.cut()
            self.tally.events["ssh-sessions-cut"] += cut
            self.tally.events["ssh-cut"] += 1
            self.note("ssh-cut", sessions=cut)
            self.ssh_back = now + rng.uniform(1.0, 5.0)
        elif self.ssh_back is not None and now >= self.ssh_back:
            self.sshd.start()
            self.note("sshd-start")
            self.ssh_back = None
            plan["ssh"] = now + rng.uniform(20, 40)

    def progress(self, elapsed: float) -> None:
        ev = self.tally.events
        settled = len(self.tally.submitted) - len(self.unsettled)
        print(
            f"[{elapsed:6.0f}s] runs {len(self.tally.submitted)} submitted, {settled} settled | "
            f"kills {ev['worker-sigkill']} stops {ev['worker-sigstop']} "
            f"(zombies {ev['worker-zombie (stopped past the lease)']}) "
            f"redis {ev['log-redis-restart']} pg {ev['postgres-terminate']} "
            f"ssh {ev['ssh-cut']}",
            flush=True,
        )

    # --- the check --------------------------------------------------------------------

    def wait_closed(self, run_id: str) -> str:
        """Until the run's log is closed (its owner closes it right after settling it,
        or the reaper when the owner died in between): 'closed', 'missing' or 'open'."""
        assert self.client is not None
        deadline = time.monotonic() + 60  # a hang guard
        while time.monotonic() < deadline:
            try:
                state = self.client.log.state(run_id)
            except TurnkeeperError:
                time.sleep(0.2)
                continue
            if not state.exists:
                return "missing"
            if state.closed:
                return "closed"
            time.sleep(0.2)
        return "open"

    def around(self, run: Run) -> list[dict[str, Any]]:
        """The chaos events from the run's admission until 60 s after it settled."""
        begin = run.created_at.timestamp()
        finish = (run.finished_at or run.updated_at).timestamp() + 60
        return [
            dict(e, at=round(e["at"] - begin, 2))  # seconds after the run was admitted
            for e in self.tally.timeline
            if begin <= e["at"] <= finish
        ]

    def verdict(self, oracle: Oracle, sub: Submitted, run: Run) -> dict[str, Any]:
        """One completed run's log against its oracle: lost, doubled, and where it differs."""
        assert self.client is not None
        expected = oracle.log(run, sub.agent, sub.prompt)
        log = self.wait_closed(run.run_id)
        try:
            stored = self.client.log.snapshot(run.run_id)
        except TurnkeeperError as exc:
            stored, log = [], f"read failed: {exc}"
        # An agent process given up before it wrote (its worker died between recording
        # its journal and starting it, or it stalled) leaves an interruption mark and a
        # continuation: counted apart, the rest must still be the agent's own output.
        marks = [chunk for _, chunk in stored if is_interruption(chunk)]
        output = [chunk for _, chunk in stored if not is_interruption(chunk)]
        got = Counter(canonical(chunk) for chunk in output)
        want = Counter(canonical(chunk) for chunk in expected)
        result: dict[str, Any] = {
            "run_id": run.run_id,
            "provider": sub.provider,
            "attempts": run.attempt_count,
            "log": log,
            "stored": len(stored),
            "expected": len(expected),
            "lost": sum((want - got).values()),
            "doubled": sum((got - want).values()),
            "interruption_marks": len(marks),
            "seq_gap": [seq for seq, _ in stored] != list(range(1, len(stored) + 1)),
            "equal": output == expected,
        }
        if not result["equal"]:
            first = first_difference(output, expected)
            result["first_difference_at_output_chunk"] = first + 1
            result["stored_there"] = output[first] if first < len(output) else None
            result["expected_there"] = expected[first] if first < len(expected) else None
            result["chaos_around"] = self.around(run)
        if run.sandbox_ref is None:
            # The reaper forgets a settled run's placement record once its sandbox is
            # gone: the journal keys and nonces with it, so nothing says which
            # segments make the output, in what order, or where each one ends.
            result["postgres_truth_matches_oracle"] = None
            return result
        truth = truth_of(self.client, run, AgentSpec.from_payload(sub.agent).format)
        truth = [chunk for chunk in truth if not is_interruption(chunk)]
        result["postgres_truth_matches_oracle"] = truth == expected
        if truth != expected:
            at = first_difference(truth, expected)
            result["postgres_truth"] = {
                "chunks": len(truth),
                "first_difference_at": at + 1,
                "there": truth[at] if at < len(truth) else None,
            }
        return result

    def check(self, chaos_seconds: float) -> dict[str, Any]:
        oracle = Oracle(self.workdir / "oracle")
        failed: list[dict[str, Any]] = []
        never_settled: list[str] = []
        verdicts: list[dict[str, Any]] = []
        attempts: list[tuple[int, int, str]] = []
        for sub in self.tally.submitted:
            run = self.safe_get(sub.run_id)
            assert run is not None, sub.run_id
            attempts.append((run.attempt_count, sub.owner_hits, run.run_id))
            if not run.status.is_terminal:
                never_settled.append(f"{run.run_id} ({run.status.value})")
            elif run.status is RunStatus.COMPLETED:
                verdicts.append(self.verdict(oracle, sub, run))
            else:
                error = run.error if isinstance(run.error, dict) else {}
                failed.append(
                    {
                        "run_id": run.run_id,
                        "provider": sub.provider,
                        "status": run.status.value,
                        "reason": error.get("reason"),
                        "message": error.get("message"),
                        "attempts": run.attempt_count,
                        "owner_kills_and_stops": sub.owner_hits,
                        "chaos_around": self.around(run),
                    }
                )
        empty = [v for v in verdicts if not v["stored"]]
        events = dict(sorted(self.tally.events.items()))
        report: dict[str, Any] = {
            "minutes": self.args.minutes,
            "chaos_seconds": round(chaos_seconds, 1),
            "workers": self.args.workers,
            "runs_in_flight": self.args.runs_in_flight,
            "seed": self.args.seed,
            "ssh": self.ssh_enabled,
            "max_attempts": self.args.max_attempts,
            "events": events,
            "worker_exit_reasons": dict(self.tally.exit_reasons.most_common()),
            "kill_and_zombie_events": events.get("worker-sigkill", 0)
            + events.get("worker-sigstop", 0),
            "runs_submitted": len(self.tally.submitted),
            "runs_by_provider": dict(Counter(s.provider for s in self.tally.submitted)),
            "runs_completed": len(verdicts),
            "runs_failed": len(failed),
            "runs_never_settled": never_settled,
            "chunks_lost": sum(v["lost"] for v in verdicts),
            "chunks_lost_in_logs_read_back_empty": sum(v["lost"] for v in empty),
            "chunks_doubled": sum(v["doubled"] for v in verdicts),
            "logs_read_back_empty": len(empty),
            "logs_read_back_empty_postgres_intact": sum(
                1 for v in empty if v["postgres_truth_matches_oracle"]
            ),
            "runs_with_seq_gaps": [v["run_id"] for v in verdicts if v["seq_gap"]],
            "postgres_truth_matches_oracle": sum(
                1 for v in verdicts if v["postgres_truth_matches_oracle"]
            ),
            "postgres_placement_forgotten": sum(
                1 for v in verdicts if v["postgres_truth_matches_oracle"] is None
            ),
            CONTINUED: [
                {"run_id": v["run_id"], "marks": v["interruption_marks"]}
                for v in verdicts
                if v["interruption_marks"]
            ],
            "max_attempts_used": max((a for a, _, _ in attempts), default=0),
            "max_owner_kills_and_stops_of_one_run": max((h for _, h, _ in attempts), default=0),
            "most_attempts": [
                {"run_id": r, "attempts": a, "owner_kills_and_stops": h}
                for a, h, r in sorted(attempts, reverse=True)[:5]
            ],
            "failed": failed,
            "mismatched": [v for v in verdicts if not v["equal"]],
            "workdir": str(self.workdir),
            "timeline": self.tally.timeline,
        }
        report["ok"] = not (
            report["chunks_lost"]
            or report["chunks_doubled"]
            or failed
            or never_settled
            or report["mismatched"]
            or report["runs_with_seq_gaps"]
        )
        return report


def brief(entry: dict[str, Any]) -> dict[str, Any]:
    """A failed or differing run for the summary: the chaos around it only counted
    (the JSON report has the events themselves)."""
    around = Counter(e["event"] for e in entry.get("chaos_around", []))
    return {**{k: v for k, v in entry.items() if k != "chaos_around"}, "chaos_around": around}


def summary(report: dict[str, Any]) -> str:
    head = (
        f"soak: {report['minutes']} min ({report['chaos_seconds']} s of chaos), "
        f"{report['workers']} workers, {report['runs_in_flight']} runs in flight, "
        f"seed {report['seed']}, ssh {'on' if report['ssh'] else 'off'}, "
        f"max_attempts {report['max_attempts']}"
    )
    lost = (
        f"chunks lost        {report['chunks_lost']} (of them in logs read back empty: "
        f"{report['chunks_lost_in_logs_read_back_empty']})"
    )
    empty = (
        f"logs read back empty {report['logs_read_back_empty']} (Postgres still holds "
        f"the right output for {report['logs_read_back_empty_postgres_intact']})"
    )
    truth = (
        "completed runs whose output Postgres holds right (rebuilt from segments) "
        f"{report['postgres_truth_matches_oracle']} of {report['runs_completed']} "
        f"(placement record already forgotten by the reaper: "
        f"{report['postgres_placement_forgotten']})"
    )
    lines = [
        head,
        "events survived:",
        *(f"  {kind:42} {count}" for kind, count in report["events"].items()),
        f"  {'kill and zombie events (SIGKILL + SIGSTOP)':42} {report['kill_and_zombie_events']}",
        *(
            f"  worker exited, saying: {said} ({n}x)"
            for said, n in report["worker_exit_reasons"].items()
        ),
        f"runs submitted     {report['runs_submitted']} {report['runs_by_provider']}",
        f"runs completed     {report['runs_completed']}",
        f"runs failed        {report['runs_failed']}",
        f"runs never settled {len(report['runs_never_settled'])}",
        lost,
        f"chunks doubled     {report['chunks_doubled']}",
        empty,
        f"runs with seq gaps {len(report['runs_with_seq_gaps'])}",
        truth,
        f"runs continued after a lost agent process {len(report[CONTINUED])}",
        f"max attempts used by one run        {report['max_attempts_used']}",
        f"max kills+stops of one run's owner  {report['max_owner_kills_and_stops_of_one_run']}",
        f"most attempts: {json.dumps(report['most_attempts'])}",
    ]
    lines += [f"FAILED {json.dumps(brief(failure))}" for failure in report["failed"]]
    lines += [f"MISMATCH {json.dumps(brief(mismatch))}" for mismatch in report["mismatched"]]
    lines += [f"NEVER SETTLED {run_id}" for run_id in report["runs_never_settled"]]
    if not report["ok"]:
        lines.append(f"work dir kept (fleet logs): {report['workdir']}")
    lines.append("OK" if report["ok"] else "NOT OK")
    return "\n".join(lines)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs-in-flight", type=int, default=4)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--ssh-share", type=float, default=0.3, help="share of runs on ssh")
    parser.add_argument("--max-attempts", type=int, default=100)
    parser.add_argument("--settle-timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument("--workdir-parent", type=Path, default=None, help="default: $TMPDIR")
    args = parser.parse_args()
    configure_logging(level="WARNING")
    # A SIGTERM (a CI timeout, an operator's kill) unwinds like Ctrl-C: the fleet, its
    # agents, the sshd and the log's Redis are stopped on the way out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    workdir = Path(tempfile.mkdtemp(prefix="tk-soak-", dir=args.workdir_parent))
    report = Soak(args, workdir).run()
    if report["ok"] and not args.keep:  # a failed soak keeps its fleet's logs
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    print(summary(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
