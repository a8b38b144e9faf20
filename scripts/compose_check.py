"""The compose stack, built and run for real, with its workers disrupted mid-run.

Run through ``scripts/compose-check`` (which makes the virtualenv this needs). Steps, each
printed with its time and a one-line verdict:

1. the container engine (``scripts/container-engine``) and a base image: the slim Python
   image when a registry answers, else one made from Debian's packages
   (``scripts/container-base``);
2. the four images (app, sandbox host with Claude Code, PostgreSQL, Redis);
3. the stack up (``docker/compose.yaml``) with a scripted model server beside the sandbox
   host, and the first API key once the version has them;
4. a scripted run and a real Claude Code run submitted through the HTTP API; while they run,
   one worker container is killed, the other restarted, and the workers scaled to three;
5. the checks: every run completes with exactly the chunks of the same agent run outside
   the stack; no agent was restarted (one journal per run, the agent's pid on the sandbox
   host never changed) and each ran in its jail (a network namespace of its own, so
   Claude Code reached the model server only through the egress proxy); the runs were
   really taken over (epoch above 1); the web port is published on the loopback only;
   the dashboard answers;
6. the stack torn down, volumes included.

Exit status 0 only when every step passed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.driver.fleet import expected_log
from tests.integration.npm_cache import CLAUDE_PACKAGE, PINNED

from turnkeeper.agents.formats import translator_for
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.chunks import Chunk
from turnkeeper.driver import lifecycle
from turnkeeper.sandbox.codec import encode_run_id
from turnkeeper.web.sse import parse_stream

PROJECT = "turnkeeper-check"  # never an operator's own stack (`-p turnkeeper`)
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
REGISTRY_BASE = "docker.io/library/python:3.11-slim-bookworm"
LOCAL_BASE = "localhost/debian-bookworm:base"
IMAGES = {  # tag: (dockerfile, target)
    "localhost/turnkeeper:latest": ("docker/Dockerfile", "app"),
    "localhost/turnkeeper-sandbox-host:latest": ("docker/Dockerfile", "sandbox-host"),
    "localhost/turnkeeper-postgres:15": ("docker/postgres.Dockerfile", None),
    "localhost/turnkeeper-redis:7": ("docker/redis.Dockerfile", None),
}
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # handed to builds behind TLS proxies
MODEL = "turnkeeper-check-model"
MODEL_PORT = 8080
PROMPT = "check the greeting"
SCRIPTED = {"preset": "scripted", "seed": 7, "turns": 12, "pace": 0.4}
SCRIPTED_MODULE = "turnkeeper.agents.scripted"  # an element of its argv, never of its writer's
CLAUDE_ENV = {
    "ANTHROPIC_BASE_URL": f"http://model:{MODEL_PORT}",
    "ANTHROPIC_API_KEY": "sk-ant-scripted",
}
MADE_UP = ("sessionId", "durationMs", "totalCostUsd")  # what Claude Code invents per process
SANDBOXES = "/var/lib/turnkeeper/sandboxes"
FIRST_KEY = "/etc/turnkeeper/secret/first-api-key"
# Prints, for every sandbox on the sandbox host: its journal names, the pids its detached
# writers were started as, and every live process descending from those writers (the
# jail's processes too: bwrap gives the agent a session of its own, so it is found by
# parentage, not by session), each with its network namespace, and the host's.
PROBE = f"""
import json, os
def netns(pid):
    try:
        return os.readlink(f"/proc/{{pid}}/ns/net")
    except OSError:
        return None
parents, argvs = {{}}, {{}}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()
        cmd = open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    parents[pid] = stat[1]
    argvs[pid] = [c.decode(errors="replace") for c in cmd if c]
out = {{}}
root = {SANDBOXES!r}
for box in os.listdir(root):
    try:
        journals = sorted(os.listdir(f"{{root}}/{{box}}/journal"))
        procs = open(f"{{root}}/{{box}}/procs").read().split()
    except OSError:
        continue
    session = []
    for pid in parents:
        up, seen = pid, set()
        while up in parents and up not in procs and up not in seen:
            seen.add(up)
            up = parents[up]
        if up in procs:
            session.append([int(pid), argvs[pid], netns(pid)])
    out[box] = {{"journals": journals, "procs": procs, "session": session}}
print(json.dumps({{"host_netns": netns("self"), "sandboxes": out}}))
"""


class CheckError(Exception):
    """A step's verdict was not ok; its message is the verdict."""


STEP_ERRORS = (CheckError, subprocess.SubprocessError, httpx.HTTPError, OSError, ValueError)


def _started() -> float:
    """When the wrapper started (its virtualenv step counts too), on the monotonic clock."""
    wrapper_ns = os.environ.get("COMPOSE_CHECK_STARTED_NS", "")
    ago = time.time() - int(wrapper_ns) / 1e9 if wrapper_ns.isdigit() else 0.0
    return time.monotonic() - max(ago, 0.0)


@dataclass
class Report:
    started: float = field(default_factory=_started)
    failures: list[str] = field(default_factory=list)

    def line(self, name: str, ok: bool, seconds: float, verdict: str) -> None:
        total = time.monotonic() - self.started
        mark = "ok  " if ok else "FAIL"
        print(f"[{total:7.1f}s] {name:<22} {mark} {seconds:6.1f}s  {verdict}", flush=True)
        if not ok:
            self.failures.append(name)

    def step(self, name: str, action: Callable[[], str]) -> bool:
        began = time.monotonic()
        try:
            verdict = action()
        except STEP_ERRORS as exc:
            detail = str(exc)
            if isinstance(exc, subprocess.CalledProcessError):
                tail = (exc.stderr or exc.output or "").strip().splitlines()[-3:]
                detail = f"{' '.join(map(str, exc.cmd))[:120]} exited {exc.returncode}"
                detail += f": {' | '.join(tail)}" if tail else ""
            self.line(name, False, time.monotonic() - began, detail)
            return False
        self.line(name, True, time.monotonic() - began, verdict)
        return True


def podman(*args: str, timeout: float = 600, stdin: str | None = None) -> str:
    """``podman ARGS``' stdout; CalledProcessError (with its stderr) when it fails."""
    done = subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, text=True, timeout=timeout,
        check=True, cwd=REPO,
    )  # fmt: skip
    return done.stdout


class Stack:
    """The compose project: its environment, its containers, its web API."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.web_port = _free_port()
        self.headers: dict[str, str] = {}
        self.env = {
            **os.environ,
            "POSTGRES_PASSWORD": secrets.token_hex(16),
            "TURNKEEPER_WEB_PORT": str(self.web_port),
            "TURNKEEPER_SANDBOX_EGRESS": f"model:{MODEL_PORT}",
            # Short leases, so takeovers come within seconds of a worker's death; not much
            # shorter than a worker's restart, or the reconciler hands a run over again while
            # its takeover waits in the queue, spending an attempt each time.
            "TURNKEEPER_LEASE_TTL": "20",
            "TURNKEEPER_HEARTBEAT_INTERVAL": "5",
            "TURNKEEPER_RECONCILE_INTERVAL": "2",
            "WORKERS": "2",
            "WORKER_CONCURRENCY": "2",
        }

    def compose(self, *args: str, workers: int | None = None) -> None:
        env = dict(self.env)
        if workers is not None:
            env["WORKERS"] = str(workers)
        argv = ["podman-compose", "-p", PROJECT, "-f", str(COMPOSE_FILE), *args]
        with (self.logs / "compose.log").open("a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            done = subprocess.run(
                argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False,
                timeout=900,
            )  # fmt: skip
        if done.returncode != 0:
            raise CheckError(f"podman-compose {' '.join(args)} failed (see {log.name})")

    def container(self, service: str, number: int = 1) -> str:
        return f"{PROJECT}_{service}_{number}"

    def state(self, name: str) -> str:
        try:
            return podman("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name).strip()
        except subprocess.CalledProcessError:
            return "missing"

    def running(self, service: str) -> list[str]:
        names = podman(
            "ps", "--filter", f"label=com.docker.compose.service={service}",
            "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "{{.Names}}",
        ).split()  # fmt: skip
        return sorted(names)

    def running_any(self) -> list[str]:
        label = f"label=io.podman.compose.project={PROJECT}"
        return podman("ps", "-a", "--filter", label, "--format", "{{.Names}}").split()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30)

    def probe(self) -> dict[str, Any]:
        out = podman("exec", self.container("sandbox-host"), "python3", "-c", PROBE, timeout=60)
        result: dict[str, Any] = json.loads(out)
        return result


def _healthy(container: str) -> bool:
    """The container's own health check, run now (podman schedules it only under systemd)."""
    checked = subprocess.run(
        ["podman", "healthcheck", "run", container], capture_output=True, check=False, timeout=120
    )
    return checked.returncode == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(what: str, ready: Callable[[], bool], timeout: float, every: float = 2) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise CheckError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


# --- the agents outside the stack -----------------------------------------------------


def normalized(chunks: list[Chunk]) -> list[Chunk]:
    """The chunks with what Claude Code makes up per process replaced by a placeholder."""
    out = []
    for chunk in chunks:
        value = chunk.get("value")
        if chunk.get("type") == "CUSTOM" and isinstance(value, dict):
            value = {k: ("*" if k in MADE_UP else v) for k, v in value.items()}
            out.append({**chunk, "value": value})
        else:
            out.append(chunk)
    return out


def claude_oracle(run_id: str, session_id: str) -> list[Chunk]:
    """Claude Code run directly (no journal, no worker) in the sandbox host's image."""
    spec = AgentSpec.from_payload("claude-code")  # the preset as shipped
    home = "/home/agent/oracle"  # HOME inside the one-off container
    env = [f"--env={k}={v}" for k, v in {**spec.env, **CLAUDE_ENV, "HOME": home}.items()]
    # The preset reads its prompt on stdin (`-p` with no prompt argument), as in the stack.
    stdin = PROMPT if spec.prompt_stdin else None
    stdout = podman(
        "run", "--rm", "--interactive", f"--network={PROJECT}_sandbox", "--entrypoint=sh",
        "--user=agent", "--workdir=/home/agent", *env,
        "localhost/turnkeeper-sandbox-host:latest",
        "-c", 'mkdir -p "$HOME" && exec "$@"', "sh", *spec.argv(PROMPT),
        timeout=600, stdin=stdin,
    )  # fmt: skip
    translator = translator_for(spec.format, run_id)
    chunks: list[Chunk] = [lifecycle.run_started(run_id, session_id)]
    for line in stdout.encode().splitlines(keepends=True):
        chunks.extend(translator.feed(line))
    chunks.extend(translator.finish())
    chunks.append(lifecycle.run_finished(run_id, session_id))
    return chunks


# --- watching the agents on the sandbox host --------------------------------------------


@dataclass
class AgentTrace:
    """Everything seen of one run's sandbox over the whole run."""

    journals: set[str] = field(default_factory=set)
    writers: set[str] = field(default_factory=set)
    agent_pids: set[int] = field(default_factory=set)
    jailed: set[bool] = field(default_factory=set)
    """Per sample: whether the agent had a network namespace of its own (its jail's)."""
    seen: int = 0


class Watcher:
    """Samples the sandbox host every second, recording each run's journals and pids."""

    def __init__(self, stack: Stack, runs: dict[str, Callable[[list[str]], bool]]) -> None:
        self.stack = stack
        self.tokens = {encode_run_id(run_id): run_id for run_id in runs}
        self.is_agent = runs  # run id -> whether an argv is its agent's (not its writer's)
        self.traces = {run_id: AgentTrace() for run_id in runs}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @contextmanager
    def running(self) -> Iterator[Watcher]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.sample()
            except (subprocess.SubprocessError, ValueError) as exc:
                self.errors.append(str(exc)[:200])

    def sample(self) -> None:
        probed = self.stack.probe()
        for box in probed["sandboxes"].values():
            names = [n for n in box["journals"] if n.endswith(".ndjson")]
            owners = {self.tokens[t] for n in names for t in self.tokens if n.startswith(t + ".")}
            for run_id in owners:
                trace = self.traces[run_id]
                trace.seen += 1
                trace.journals.update(names)
                trace.writers.update(box["procs"])
                is_agent = self.is_agent[run_id]
                agents = [(pid, ns) for pid, argv, ns in box["session"] if argv and is_agent(argv)]
                if agents:
                    pid, ns = min(agents)
                    trace.agent_pids.add(pid)
                    trace.jailed.add(ns is not None and ns != probed["host_netns"])

    def live(self, run_id: str) -> bool:
        return bool(self.traces[run_id].agent_pids)


# --- the check --------------------------------------------------------------------------


class Check:
    def __init__(self, report: Report, logs: Path) -> None:
        self.report = report
        self.stack = Stack(logs)
        self.base_image = os.environ.get("TURNKEEPER_BASE_IMAGE", "")
        self.run_ids: dict[str, str] = {}
        self.expected: dict[str, list[Chunk]] = {}
        self.oracle_thread: threading.Thread | None = None
        self.oracle_error: str | None = None
        self.resumed: list[str] = []  # bodies of refused stream starts, retried
        self.oracle_failures: list[str] = []  # Claude Code outside the stack, retried

    def engine(self) -> str:
        out = subprocess.run(
            [str(REPO / "scripts" / "container-engine")],
            capture_output=True, text=True, check=True, timeout=1800,
        )  # fmt: skip
        return out.stderr.strip().splitlines()[-1].removeprefix("container-engine: ")

    def base(self) -> str:
        if self.base_image:
            return f"{self.base_image} (TURNKEEPER_BASE_IMAGE)"
        pulled = subprocess.run(
            ["podman", "pull", "-q", REGISTRY_BASE], capture_output=True, timeout=600, check=False
        )
        if pulled.returncode == 0:
            self.base_image = REGISTRY_BASE
            return f"{REGISTRY_BASE} from the registry"
        made = subprocess.run(
            [str(REPO / "scripts" / "container-base"), LOCAL_BASE],
            capture_output=True, text=True, check=True, timeout=1800,
        )  # fmt: skip
        self.base_image = LOCAL_BASE
        last = made.stderr.strip().splitlines()[-1].removeprefix("container-base: ")
        return f"no registry reachable: {last}"

    def images(self) -> str:
        bundle = Path(os.environ.get("COMPOSE_CHECK_CA_BUNDLE", SYSTEM_CA_BUNDLE))
        ca = [f"--secret=id=ca-bundle,src={bundle}"] if bundle.is_file() else []
        sizes = []
        for tag, (dockerfile, target) in IMAGES.items():
            argv = ["build", "-q", "-f", dockerfile, "-t", tag, *ca]
            argv += [f"--build-arg=BASE_IMAGE={self.base_image}"]
            if target is not None:
                argv += [f"--target={target}"]
            if target == "sandbox-host":
                argv += [f"--build-arg=CLAUDE_CODE_VERSION={PINNED[CLAUDE_PACKAGE]}"]
            podman(*argv, ".", timeout=1800)
            size = podman("image", "inspect", "--format", "{{.Size}}", tag).strip()
            sizes.append(f"{tag.split('/')[-1]} {int(size) / 1e6:.0f} MB")
        return ", ".join(sizes)

    def up(self) -> str:
        leftover = self.stack.running_any()
        if leftover:
            self.down()  # a previous check that did not finish
        self.stack.compose("up", "-d", "--no-build")
        podman(
            "run", "-d", "--name", MODEL, f"--network={PROJECT}_sandbox", "--network-alias=model",
            "--entrypoint=python3", "--user=nobody",
            "-v", f"{REPO}/tests/integration/model_server.py:/srv/model_server.py:ro",
            "localhost/turnkeeper:latest", "/srv/model_server.py",
            "--api=anthropic", "--host=0.0.0.0", f"--port={MODEL_PORT}", "--pace=0.8",
        )  # fmt: skip
        init = self.stack.container("init")
        wait_until("the init service", lambda: self.stack.state(init).startswith("exited"), 300)
        if self.stack.state(init) != "exited 0":
            raise CheckError(f"init ended {self.stack.state(init)}: podman logs {init}")
        wait_until("web /healthz", self._web_healthy, 300)
        services = ("postgres", "redis", "sandbox-host", "web", "worker", "beat")
        running = {service: self.stack.running(service) for service in services}
        missing = [service for service, names in running.items() if not names]
        if missing:
            raise CheckError(f"not running: {', '.join(missing)} (see compose.log)")
        names = [name for service in services for name in running[service]]
        unhealthy = [name for name in names if not _healthy(name)]
        if unhealthy:
            raise CheckError(f"unhealthy: {', '.join(unhealthy)}")
        workers = self.stack.running("worker")
        if len(workers) != 2:
            raise CheckError(f"expected 2 workers, running: {workers}")
        return f"init done, every health check passes, workers {', '.join(workers)}"

    def _web_healthy(self) -> bool:
        try:
            with self.stack.http() as http:
                return http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def loopback_only(self) -> str:
        ports = podman("port", self.stack.container("web")).split()
        published = [p for p in ports if ":" in p]
        if published != [f"127.0.0.1:{self.stack.web_port}"]:
            raise CheckError(f"web published on {published}, not only on 127.0.0.1")
        return f"8000/tcp -> {published[0]}"

    def first_key(self) -> str:
        """The init step's admin key answers; it creates the key the runs are submitted
        with (inline agent specs need ``--allow-commands``, which the admin key lacks)."""
        web = self.stack.container("web")
        first = podman("exec", web, "cat", FIRST_KEY, timeout=60).strip()
        if not first:
            raise CheckError(f"the init step left no key in {FIRST_KEY}")
        with httpx.Client(
            base_url=self.stack.base_url, headers={"Authorization": f"Bearer {first}"}, timeout=30
        ) as http:
            if (answer := http.get("/runs")).status_code != 200:
                raise CheckError(f"GET /runs with the first key: {answer.status_code}")
        with httpx.Client(base_url=self.stack.base_url, timeout=30) as http:
            if (answer := http.get("/runs")).status_code != 401:
                raise CheckError(f"GET /runs without a key: {answer.status_code}, not 401")
        created = podman(
            "exec", web, "turnkeeper", "keys", "create", "compose-check", "--allow-commands",
            timeout=120,
        )  # fmt: skip
        self.stack.headers["Authorization"] = f"Bearer {created.strip().splitlines()[-1]}"
        return (
            "the init step's admin key answers (none: 401); key compose-check "
            "(--allow-commands) created by `turnkeeper keys create` in web, used for every request"
        )

    def submit(self) -> str:
        suffix = secrets.token_hex(4)
        self.run_ids = {"scripted": f"check-scripted-{suffix}", "claude": f"check-claude-{suffix}"}
        bodies: dict[str, dict[str, Any]] = {
            "scripted": {"agent": SCRIPTED},
            "claude": {
                "agent": "claude-code",
                "env": CLAUDE_ENV,
            },
        }
        with self.stack.http() as http:
            for name, run_id in self.run_ids.items():
                body = {**bodies[name], "prompt": PROMPT, "run_id": run_id, "session_id": run_id}
                response = http.post("/runs", json=body)
                if response.status_code != 201:
                    raise CheckError(f"POST /runs {name}: {response.status_code} {response.text}")
        claude_id = self.run_ids["claude"]

        def claude() -> None:
            # The oracle is the reference, not what is checked: one failed attempt (a loaded
            # machine) is retried, and said in the verdict with its stderr.
            for attempt in range(2):
                try:
                    expected = claude_oracle(claude_id, claude_id)
                except subprocess.CalledProcessError as exc:
                    error = f"exit {exc.returncode}: {(exc.stderr or '').strip()[-300:]}"
                except (subprocess.SubprocessError, OSError) as exc:
                    error = str(exc)[:300]
                else:
                    self.expected[claude_id] = expected
                    return
                self.oracle_failures.append(error)
                self.oracle_error = error if attempt else None

        self.oracle_thread = threading.Thread(target=claude, daemon=True)
        self.oracle_thread.start()
        return ", ".join(f"{name} {run_id}" for name, run_id in self.run_ids.items())

    def status(self, run_id: str) -> dict[str, Any]:
        with self.stack.http() as http:
            response = http.get(f"/runs/{run_id}")
            response.raise_for_status()
            view: dict[str, Any] = response.json()
            return view

    def disrupt(self, watcher: Watcher) -> str:
        runs = list(self.run_ids.values())
        wait_until(
            "both agents running on the sandbox host",
            lambda: all(watcher.live(r) and self.status(r)["status"] == "running" for r in runs),
            180,
            every=1,
        )
        owners = {run_id: self.status(run_id)["owner"] for run_id in runs}
        steps = []
        began = time.monotonic()
        podman("kill", "--signal=KILL", self.stack.container("worker", 1))
        steps.append(f"killed worker_1 at +{time.monotonic() - began:.1f}s")
        podman("restart", "--time=10", self.stack.container("worker", 2))
        steps.append(f"restarted worker_2 at +{time.monotonic() - began:.1f}s")
        self.stack.compose("up", "-d", "--no-build", "--no-deps", "worker", workers=3)
        workers = self.stack.running("worker")
        steps.append(f"scaled to {len(workers)} at +{time.monotonic() - began:.1f}s")
        if len(workers) != 3:
            raise CheckError(f"expected 3 running workers after scaling, got {workers}")
        live = [run_id for run_id in runs if self.status(run_id)["status"] == "running"]
        return f"{'; '.join(steps)}; owners were {sorted(set(owners.values()))}; live: {live}"

    def completed(self) -> str:
        def settled() -> bool:
            return all(
                self.status(r)["status"] not in ("queued", "running") for r in self.run_ids.values()
            )

        wait_until("both runs to settle", settled, 600)
        views = {run_id: self.status(run_id) for run_id in self.run_ids.values()}
        bad = {r: (v["status"], v["error"]) for r, v in views.items() if v["status"] != "completed"}
        if bad:
            raise CheckError(f"not completed: {bad}")
        not_taken_over = [r for r, v in views.items() if v["epoch"] < 2]
        if not_taken_over:
            raise CheckError(f"never taken over (epoch 1), the disruption missed {not_taken_over}")
        return ", ".join(f"{r} epoch {v['epoch']}" for r, v in views.items())

    def exact_output(self) -> str:
        scripted = self.run_ids["scripted"]
        with tempfile.TemporaryDirectory() as tmp:
            unpaced = {**SCRIPTED, "pace": 0}  # pace spaces the lines out, it changes none
            self.expected[scripted] = expected_log(scripted, scripted, unpaced, PROMPT, Path(tmp))
        if self.oracle_thread is not None:
            self.oracle_thread.join(timeout=600)
        if self.oracle_error is not None:
            raise CheckError(f"Claude Code outside the stack failed: {self.oracle_error}")
        verdicts = []
        for name, run_id in self.run_ids.items():
            seqs, chunks = self.stream(run_id)
            if seqs != list(range(1, len(seqs) + 1)):
                raise CheckError(f"{name}: event ids are not 1..n: {seqs[:5]}...")
            expected = self.expected[run_id]
            got, want = normalized(chunks), normalized(expected)
            if got != want:
                pairs = enumerate(zip(got, want, strict=False))
                diverge = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want)))
                raise CheckError(
                    f"{name}: {len(chunks)} chunks streamed, {len(expected)} expected; first "
                    f"difference at {diverge + 1}: {chunks[diverge : diverge + 1]}"
                )
            verdicts.append(f"{name} {len(chunks)} chunks")
        retried = f" (stream starts refused, then retried: {self.resumed})" if self.resumed else ""
        if self.oracle_failures:
            retried += f" (Claude Code outside the stack retried after: {self.oracle_failures})"
        return "identical to the agents run outside the stack: " + ", ".join(verdicts) + retried

    def stream(self, run_id: str) -> tuple[list[int], list[Chunk]]:
        """The run's whole event stream from the start, read as a client reads it (SSE).

        A refused start (503, the web app's answer to a service error) is retried twice,
        resuming after the last event received, as an EventSource would.
        """
        seqs: list[int] = []
        chunks: list[Chunk] = []
        for attempt in range(3):
            url = self.status(run_id)["stream_url"]
            headers = {"Last-Event-ID": str(seqs[-1])} if seqs else {}
            with (
                self.stack.http() as http,
                http.stream("GET", url, headers=headers, timeout=60) as response,
            ):
                if response.status_code == 503 and attempt < 2:
                    response.read()
                    self.resumed.append(response.text[:200])
                    time.sleep(2)
                    continue
                response.raise_for_status()
                for seq, event, data in parse_stream(response.iter_lines()):
                    if event == "end":
                        if json.loads(data)["last_seq"] != (seqs[-1] if seqs else 0):
                            raise CheckError(f"{run_id}: stream ended at {data}, read {len(seqs)}")
                        return seqs, chunks
                    if seq is None:
                        raise CheckError(f"{run_id}: unexpected {event} event: {data}")
                    seqs.append(int(seq))
                    chunks.append(json.loads(data))
            break
        raise CheckError(f"{run_id}: the stream ended without its end event")

    def agents_untouched(self, watcher: Watcher) -> str:
        if watcher.errors:
            raise CheckError(f"sampling the sandbox host failed: {watcher.errors[:2]}")
        verdicts = []
        for name, run_id in self.run_ids.items():
            trace = watcher.traces[run_id]
            journals = sorted(trace.journals)
            token = encode_run_id(run_id)
            if journals != [f"{token}.1.ndjson"]:
                raise CheckError(f"{name}: journals seen {journals}, expected only process 1")
            if len(trace.writers) != 1 or len(trace.agent_pids) != 1:
                raise CheckError(
                    f"{name}: writers {sorted(trace.writers)}, agent pids "
                    f"{sorted(trace.agent_pids)}: the agent was started again"
                )
            if trace.jailed != {True}:
                raise CheckError(f"{name}: not in a jail of its own in every sample")
            verdicts.append(f"{name} pid {trace.agent_pids.pop()} in {trace.seen} samples")
        return (
            "one journal (process 1) and one agent pid per run, each jailed (a network "
            "namespace of its own): " + ", ".join(verdicts)
        )

    def dashboard(self) -> str:
        with self.stack.http() as http:
            page = http.get("/")
            listed = http.get("/runs").json()["runs"]
        if page.status_code != 200 or "<html" not in page.text.lower():
            raise CheckError(f"GET / answered {page.status_code}")
        ids = {view["run_id"] for view in listed}
        missing = set(self.run_ids.values()) - ids
        if missing:
            raise CheckError(f"GET /runs does not list {missing}")
        return f"GET / 200 ({len(page.text)} bytes), GET /runs lists both runs"

    def down(self) -> str:
        for name in self.stack.running_any():
            with (self.stack.logs / f"{name}.log").open("w") as out:
                subprocess.run(["podman", "logs", name], stdout=out, stderr=out, check=False)
        subprocess.run(["podman", "rm", "-f", "-t", "0", MODEL], capture_output=True, check=False)
        # As many workers as there were (down removes only the replicas it is told of).
        self.stack.compose("down", "-v", workers=max(3, len(self.stack.running("worker"))))
        # podman-compose 1.0 leaves the project's networks behind.
        label = f"label=io.podman.compose.project={PROJECT}"
        networks = podman("network", "ls", "--filter", label, "--format", "{{.Name}}").split()
        if networks:
            podman("network", "rm", *networks)
        left = (
            self.stack.running_any()
            + podman("volume", "ls", "--filter", label, "--format", "{{.Name}}").split()
        )
        if left:
            raise CheckError(f"left behind: {left}")
        return f"containers, volumes and networks ({', '.join(networks)}) removed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the stack up at the end")
    args = parser.parse_args()
    if shutil.which("podman") is None and os.geteuid() != 0:
        print("compose-check: run it as root (it installs podman and debootstrap)", file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="compose-check-"))
    report = Report()
    check = Check(report, logs)
    print(f"compose-check: logs in {logs}", flush=True)
    ok = (
        report.step("engine", check.engine)
        and report.step("base image", check.base)
        and report.step("images", check.images)
    )
    if ok:
        try:
            steps_ok = report.step("stack up", check.up)
            steps_ok = steps_ok and report.step("web on loopback only", check.loopback_only)
            steps_ok = steps_ok and report.step("first API key", check.first_key)
            steps_ok = steps_ok and report.step("submit over HTTP", check.submit)
            if steps_ok:
                watcher = Watcher(
                    check.stack,
                    {
                        check.run_ids["scripted"]: lambda argv: SCRIPTED_MODULE in argv,
                        check.run_ids["claude"]: lambda argv: Path(argv[0]).name == "claude",
                    },
                )
                with watcher.running():
                    report.step("kill, restart, scale", lambda: check.disrupt(watcher))
                    report.step("runs completed", check.completed)
                report.step("exact output", check.exact_output)
                report.step("agents never restarted", lambda: check.agents_untouched(watcher))
                report.step("dashboard", check.dashboard)
        finally:
            if args.keep:
                print(f"compose-check: stack left up on {check.stack.base_url}", flush=True)
            else:
                report.step("tear down", check.down)
    total = time.monotonic() - report.started
    if report.failures:
        print(f"compose-check: FAILED ({', '.join(report.failures)}) in {total:.0f}s; logs {logs}")
        return 1
    print(f"compose-check: all steps passed in {total:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
