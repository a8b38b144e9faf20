"""A real fleet for tests: Celery worker and beat processes on the test's own servers.

Workers and beat run as `python -m turnkeeper worker|beat` in sessions of their
own (so a test can SIGKILL or SIGSTOP a whole worker, pool children included,
while the agents it started live on), on the test's database, Redis namespace
(queues and broker keys included) and data directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

import turnkeeper
from tests.sandboxes import release_sandboxes
from turnkeeper.agents.formats import translator_for
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.chunks import Chunk
from turnkeeper.client import Client
from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.driver import lifecycle
from turnkeeper.errors import ServiceError
from turnkeeper.owner import owner_pid
from turnkeeper.store.records import Run
from turnkeeper.workers.failpoints import marker

FAST: dict[str, Any] = {
    "lease_ttl": 2.0,
    "heartbeat_interval": 0.5,
    "reconcile_interval": 0.5,
    "requeue_after": 3.0,
    # Tests' own agent commands run this interpreter and package (``sys.executable -m
    # turnkeeper.agents.scripted``): the jail shows them read-only, as an operator
    # would show a Python agent of their own.
    "sandbox_ro_binds": ",".join(
        dict.fromkeys([sys.prefix, sys.base_prefix, str(Path(turnkeeper.__file__).parent)])
    ),
    "reap_interval": 5.0,
}
# The settings' own timing, for tests of what a fleet does at its defaults.
DEFAULT_TIMING: dict[str, Any] = {
    name: Settings.model_fields[name].default
    for name in ("lease_ttl", "heartbeat_interval", "reconcile_interval", "requeue_after")
}
_JSON = json.JSONDecoder()
CELERY_QUIET = ["--without-mingle", "--without-gossip", "--without-heartbeat"]


@dataclass
class Fleet:
    settings: Settings
    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _client: Client | None = None

    @classmethod
    def create(cls, settings: Settings, logs: Path, **overrides: Any) -> Fleet:
        fleet_settings = settings.model_copy(update={**FAST, **overrides})
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
        for name, value in {**FAST, **overrides}.items():
            env[f"TURNKEEPER_{name.upper()}"] = str(value)
        env.update(
            TURNKEEPER_DATABASE_URL=settings.require_database_url(),
            TURNKEEPER_REDIS_URL=settings.require_redis_url(),
            TURNKEEPER_NAMESPACE=settings.namespace,
            TURNKEEPER_DATA_DIR=str(settings.data_dir),
            TURNKEEPER_LOG_FORMAT="json",
        )
        if settings.secret is not None:
            env["TURNKEEPER_SECRET"] = settings.secret.get_secret_value()
        logs.mkdir(parents=True, exist_ok=True)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return cls(settings=fleet_settings, env=env, logs=logs)

    # --- processes ---------------------------------------------------------------------

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}-{len(self.procs)}.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "turnkeeper", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def start_worker(
        self, concurrency: int = 1, *, queues: str | None = None, pool: str | None = None
    ) -> subprocess.Popen[bytes]:
        """A worker; ``queues``: Celery's ``-Q`` instead of ours (turns and host);
        ``pool``: Celery's ``-P`` (``threads``: many turns in one process) instead of
        the worker's default."""
        chosen = ["-Q", queues] if queues is not None else []
        chosen += ["-P", pool] if pool is not None else []
        return self._start("worker", "worker", "-c", str(concurrency), *chosen, *CELERY_QUIET)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every worker and beat started so far reports that it is consuming."""
        deadline = time.monotonic() + timeout  # a hang guard, not a timing assertion
        logs = sorted(self.logs.glob("*.log"))
        while not all(b" ready." in path.read_bytes() for path in logs):
            assert time.monotonic() < deadline, self.dump_logs()
            time.sleep(0.1)

    def run_cli(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """A ``turnkeeper`` command with this fleet's settings (a hang guard, no timing)."""
        return subprocess.run(
            [sys.executable, "-m", "turnkeeper", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start_beat(self) -> subprocess.Popen[bytes]:
        return self._start("beat", "beat", *CELERY_QUIET)

    def signal_worker_of(self, run: Run, signum: int) -> int:
        """Signal the whole worker (its process group) that owns ``run``; returns the pgid."""
        assert run.owner is not None
        pid = owner_pid(run.owner)
        pgid = os.getpgid(pid)
        os.killpg(pgid, signum)
        return pgid

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.wait(timeout=30)
        if self._client is not None:
            self._client.close()
        _kill_agents(self.settings.sandboxes_dir)
        release_sandboxes(self.settings)

    def dump_logs(self) -> str:
        return "\n".join(
            f"===== {path.name}\n{path.read_text(errors='replace')[-6000:]}"
            for path in sorted(self.logs.glob("*.log"))
        )

    def events(
        self, *names: str, run_id: str | None = None, needle: str = "", files: str = "*.log"
    ) -> list[dict[str, Any]]:
        """The structured log lines named one of ``names`` (about ``run_id``, and holding
        ``needle``, when given) in the log files that ``files`` matches, in the order each
        process wrote them (the tests that read an order run one worker)."""
        found = []
        for path in sorted(self.logs.glob(files)):
            for line in path.read_text(errors="replace").splitlines():
                if not line.startswith("{") or needle not in line:
                    continue
                try:  # a line may run on into another writer's (Celery's, on stdout)
                    record, _ = _JSON.raw_decode(line)
                except ValueError:  # a line cut by a SIGKILL
                    continue
                if record.get("event") in names and run_id in (None, record.get("run_id")):
                    found.append(record)
        return found

    def wait_events(
        self, *names: str, count: int = 1, timeout: float = 60.0, **where: str
    ) -> list[dict[str, Any]]:
        """Until ``count`` such lines are logged (a hang guard, not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while len(found := self.events(*names, **where)) < count:
            assert time.monotonic() < deadline, f"fewer than {count} {names}\n" + self.dump_logs()
            time.sleep(0.05)
        return found

    # --- runs --------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_settings(self.settings)
        return self._client

    def wait(self, run_id: str, predicate: Any, timeout: float = 60.0, what: str = "") -> Run:
        """Poll the run until ``predicate(run)``; a hang guard, not a timing assertion."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                run = self.client.require(run_id)
            except ServiceError:  # a test that drops connections drops ours too
                time.sleep(0.05)
                continue
            if predicate(run):
                return run
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"run {run_id} never got {what or predicate}: {run}\n{self.dump_logs()}"
                )
            time.sleep(0.05)

    def wait_settled(self, run_id: str, timeout: float = 90.0) -> Run:
        """Until the run is settled and its log closed: a run is settled before its
        final chunk is appended, so a client reads the whole log once it is closed."""
        run = self.wait(run_id, lambda r: r.status.is_terminal, timeout, "settled")
        self.wait_log_closed(run_id)
        return run

    def wait_log_closed(self, run_id: str, timeout: float = 150.0) -> None:
        """Until the run's log is closed: by its owner right after it settled the run,
        or by the reaper when the owner died in between (a hang guard)."""
        deadline = time.monotonic() + timeout
        while not self.client.log.state(run_id).closed:
            assert time.monotonic() < deadline, f"the log of {run_id} never closed"
            time.sleep(0.1)

    def log_of(self, run_id: str) -> list[tuple[int, Chunk]]:
        return self.client.log.snapshot(run_id)

    def wait_chunks(self, run_id: str, count: int, timeout: float = 120.0) -> None:
        """Until the run's log holds at least ``count`` chunks (a hang guard)."""
        deadline = time.monotonic() + timeout
        while len(self.log_of(run_id)) < count:
            assert time.monotonic() < deadline, f"{run_id}: fewer than {count} chunks\n" + (
                self.dump_logs()
            )
            time.sleep(0.02)

    def wait_failpoint(self, point: str, timeout: float = 120.0) -> None:
        """Until a worker reached the failpoint ``point`` (its marker; a hang guard)."""
        reached = marker(self.settings, point)
        deadline = time.monotonic() + timeout
        while not reached.exists():
            assert time.monotonic() < deadline, self.dump_logs()
            time.sleep(0.05)

    def attempts(self, run_id: str) -> list[tuple[int, str | None, str]]:
        """Each attempt of the run: its epoch, outcome and owner (a worker process)."""
        with psycopg.connect(plain_postgres_url(self.settings.require_database_url())) as conn:
            rows = conn.execute(
                "SELECT epoch, outcome, owner FROM attempts WHERE run_id = %s ORDER BY epoch",
                (run_id,),
            ).fetchall()
        return [(row[0], row[1], row[2]) for row in rows]

    def attempt_history(self, run_id: str) -> list[tuple[Any, ...]]:
        """Each attempt of the run, whole: what a failed takeover test prints."""
        with psycopg.connect(plain_postgres_url(self.settings.require_database_url())) as conn:
            return conn.execute(
                "SELECT epoch, outcome, handover_cause, owner, started_at, ended_at"
                " FROM attempts WHERE run_id = %s ORDER BY epoch",
                (run_id,),
            ).fetchall()

    def start_pair(self) -> None:
        """Two one-slot workers and a beat: an owner, a successor and a reconciler."""
        self.start_worker()
        self.start_worker()
        self.start_beat()


def host_fleet(settings: Settings, root: Path, host_id: str, **overrides: Any) -> Fleet:
    """One simulated host on this machine: its own ``TURNKEEPER_HOST_ID``, data dir
    (so its own sandboxes dir) and logs, on the test's servers and namespace."""
    own = settings.model_copy(update={"data_dir": root / host_id / "data"})
    return Fleet.create(own, root / host_id / "logs", host_id=host_id, **overrides)


def kill_agents(fleet: Fleet) -> None:
    """End the agents under the fleet's sandboxes: what a host's death does to them."""
    _kill_agents(fleet.settings.sandboxes_dir)


def agents_under(root: Path) -> list[int]:
    """The pids of the live (not zombie) processes working under ``root``: the agents of
    a fleet's sandboxes, whose working directories are their workspaces."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if Path(proc.cwd()).is_relative_to(root) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.Error, OSError, ValueError):
            continue
    return found


def _kill_agents(root: Path) -> None:
    """Agents live in sessions of their own: end any left under the test's sandboxes."""
    for pid in agents_under(root):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def expected_log(
    run_id: str, session_id: str, agent: dict[str, Any], prompt: str, workdir: Path
) -> list[Chunk]:
    """The oracle: the log of a crash-free run, from the agent run directly and translated.

    Independent of workers, journals and the store: run the agent's command in an
    empty directory, translate its stdout, wrap it in the run's first and last chunk.
    """
    spec = AgentSpec.from_payload(agent)
    translator = translator_for(spec.format, run_id)
    chunks: list[Chunk] = [lifecycle.run_started(run_id, session_id)]
    for line in _output_lines(spec, prompt, workdir):
        chunks.extend(translator.feed(line))
    chunks.extend(translator.finish())
    chunks.append(lifecycle.run_finished(run_id, session_id))
    return chunks


def output_lines(agent: dict[str, Any], prompt: str, workdir: Path) -> list[bytes]:
    """The lines (with their newlines) ``agent`` prints, run directly in ``workdir``."""
    return _output_lines(AgentSpec.from_payload(dict(agent)), prompt, workdir)


def _output_lines(spec: AgentSpec, prompt: str, workdir: Path) -> list[bytes]:
    workdir.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        spec.argv(prompt),
        cwd=workdir,
        capture_output=True,
        check=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], "HOME": str(workdir)},
    ).stdout
    return out.splitlines(keepends=True)


# The agent's lines passed through as they come; after each line whose number is in
# argv[2] (comma-separated) the process stops itself (SIGSTOP) until the test lets it
# go on (SIGCONT). argv[1] names it.
_HOLD = """import os, signal, subprocess, sys
held, argv = {int(n) for n in sys.argv[2].split(",")}, sys.argv[3:]
child = subprocess.Popen(argv, stdout=subprocess.PIPE)
for number, line in enumerate(child.stdout, start=1):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    if number in held:
        os.kill(os.getpid(), signal.SIGSTOP)
sys.exit(child.wait())
"""


def held_agent(agent: dict[str, Any], token: str, lines: int | Sequence[int]) -> dict[str, Any]:
    """``agent`` (a preset or an inline spec) as an inline spec that stops after ``lines``
    lines of output (or after each of several line numbers) until ``release_held(token)``:
    the same bytes as ``agent``'s, so its oracle is ``agent``'s. A crash test kills the
    owner while the agent is held, so the run cannot have settled first however slow the
    machine. A continuation is ``agent``'s own."""
    spec = AgentSpec.from_payload(dict(agent))
    holds = ",".join(map(str, [lines] if isinstance(lines, int) else lines))
    return {
        "command": [sys.executable, "-c", _HOLD, token, holds, *spec.command],
        "continue": spec.continue_ if isinstance(spec.continue_, bool) else [*spec.continue_],
        "format": spec.format,
    }


def _held(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if len(cmdline) > 3 and cmdline[2] == _HOLD and cmdline[3] == token:
            found.append(proc)
    return found


def wait_held(token: str, timeout: float = 120.0) -> None:
    """Until the held agent named ``token`` has stopped itself (a hang guard)."""
    deadline = time.monotonic() + timeout
    while not any(p.info["status"] == psutil.STATUS_STOPPED for p in _held(token)):
        assert time.monotonic() < deadline, f"agent {token} never held"
        time.sleep(0.05)


def release_held(token: str) -> None:
    for proc in _held(token):
        proc.send_signal(signal.SIGCONT)


def chunks_while_held(
    run_id: str, agent: dict[str, Any], prompt: str, lines: int, workdir: Path
) -> int:
    """How many chunks the run's log holds while ``held_agent(agent, ..., lines)`` is
    held: the first, and those of the agent's first ``lines`` lines."""
    spec = AgentSpec.from_payload(dict(agent))
    translator = translator_for(spec.format, run_id)
    first = _output_lines(spec, prompt, workdir)[:lines]
    return 1 + sum(len(translator.feed(line)) for line in first)


def log_of_output(run_id: str, session_id: str, output_format: str, out: bytes) -> list[Chunk]:
    """The log of a crash-free run whose agent printed ``out``, translated and wrapped
    in the run's first and last chunk (``expected_log`` without running the agent)."""
    translator = translator_for(output_format, run_id)
    chunks: list[Chunk] = [lifecycle.run_started(run_id, session_id)]
    for line in out.splitlines(keepends=True):
        chunks.extend(translator.feed(line))
    chunks.extend(translator.finish())
    chunks.append(lifecycle.run_finished(run_id, session_id))
    return chunks


def follow_up_prompt(
    prompt: str, earlier: list[tuple[str, list[Chunk]]], max_bytes: int | None = None
) -> str:
    """What the scripted agent is given in a follow-up: the prompt, then each earlier
    run's prompt and the text of each message its log shows, one line each, oldest
    first (docs/architecture.md, "Follow-ups"); from the logs, not the transcript."""
    lines = [prompt, "", "Earlier in this conversation:"]
    for asked, chunks in earlier:
        lines.append(f"user: {' '.join(asked.split())}")
        texts: dict[str, str] = {}
        for chunk in chunks:
            if chunk["type"] == "TEXT_MESSAGE_CONTENT":
                texts[chunk["messageId"]] = texts.get(chunk["messageId"], "") + chunk["delta"]
        lines.extend(f"assistant: {' '.join(text.split())}" for text in texts.values() if text)
    if max_bytes is None or len("\n".join(lines).encode()) <= max_bytes:
        return "\n".join(lines)
    # Too long to hand over whole: the newest recalled lines that fit, after a note of
    # how many older ones were left out.
    head, recalled = lines[:3], lines[3:]
    for keep in range(len(recalled) - 1, -1, -1):
        left_out = len(recalled) - keep
        note = f"({left_out} earlier lines of this conversation left out: too long to recall)"
        kept = recalled[len(recalled) - keep :] if keep else []
        candidate = "\n".join([*head, note, *kept])
        if len(candidate.encode()) <= max_bytes:
            return candidate
    return prompt  # not even the heading and the note fit: the message alone


def transcript_of_tool_turns(run: Run, tool_turns: int) -> list[str]:
    """The entry ids of a run's transcript, once each: its input, each tool turn
    (assistant, tools), then the closing answer."""
    ids = [f"{run.run_id}/input"]
    for turn in range(tool_turns):
        ids += [f"{run.run_id}/turn-{turn}/assistant", f"{run.run_id}/turn-{turn}/tools"]
    return [*ids, f"{run.run_id}/turn-{tool_turns}/assistant"]
