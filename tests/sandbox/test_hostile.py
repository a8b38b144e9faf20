"""A hostile agent against a real fleet, on every provider that claims isolation.

A worker holds fleet secrets in its environment (a ``TURNKEEPER_SECRET`` marker, the
database URL); a second live run (the victim) holds a prompt, an env value and a
workspace file, all markers. The hostile agent (``hostile_agent.py``) then reads every
/proc it can see, connects to Postgres, Redis and RabbitMQ by TCP, through the proxy
and by unix socket, walks the filesystem for the victim's marker and any journal,
writes outside its workspace, reads other processes' memory for its nonce, starts a
``setsid`` daemon, allocates memory and forks without bound, prints forged sentinels
and exits 5. Each attempt must fail, exactly as listed here; the bombs are stopped
alone; the victim and the worker finish normally; the run is recorded failed with the
agent's own exit code 5; the daemon is gone; the nonce is nowhere a client or a log
could see it.

``ssh`` runs here against the loopback sshd of conftest, logged in as its unprivileged
account, whose host has bwrap (so the agent is in the same jail, as that account in a
user namespace); the sshd, its host key and the account's sandboxes root and data dir
are on the list of what it must not reach. Where ssh promises less than bwrap, the
expectation says what it does promise (``_SSH_DIFFERS``): memory is an rlimit there,
so the memory bomb's allocation is refused (exit 1, ``MemoryError``) rather than
OOM-killed, and the run's error counts no limit hits; the jail's pid 1 is the ssh
user's, so the agent reads it, and nothing of it is the host's (README, "Security").
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.driver.fleet import Fleet
from tests.sandbox.conftest import release_remote
from tests.sshd import Sshd
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.sandbox.ssh import SshTarget
from turnkeeper.store.records import Run, RunStatus

# The agent walks the whole tree it can see: on a loaded 2-core machine that takes minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HOSTILE = Path(__file__).with_name("hostile_agent.py").read_text()
PROVIDERS = ["bwrap", "ssh"]
"""Every provider that claims isolation (ssh: its remote host has bwrap)."""
SERVICES = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672}
MIB = 1024 * 1024
VICTIM = (
    'printf "%s" "$VICTIM_FILE_TEXT" > "notes-$VICTIM_FILE_TAG.txt"; echo ready; '
    "while [ ! -e release ]; do sleep 0.1; done; echo victim-done"
)


def _text(chunks: list[Chunk]) -> str:
    return "".join(str(c["delta"]) for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT")


def _markers() -> dict[str, str]:
    return {
        name: f"{name}-{uuid.uuid4().hex}" for name in ("secret", "prompt", "env", "file", "tag")
    }


@pytest.fixture(params=PROVIDERS)
def fleet(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    ssh: dict[str, object] = {}
    if request.param == "ssh":
        target: SshTarget = request.getfixturevalue("ssh_agent_target")
        ssh = {
            "ssh_host": target.host,
            "ssh_port": target.port,
            "ssh_user": target.user,
            "ssh_root": target.root,
            "ssh_identity_file": target.identity_file,
            "ssh_known_hosts_file": target.known_hosts_file,
            "ssh_python": target.python,
        }
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        sandbox_provider=request.param,
        sandbox_memory=256 * MIB,
        sandbox_pids=128,
        sandbox_ro_binds="",  # the agents here need only the system's python3
        **ssh,
    )
    try:
        yield fleet
    finally:
        fleet.stop()
        if request.param == "ssh":
            release_remote(request.getfixturevalue("ssh_agent_target"))


def _wait_text(fleet: Fleet, run_id: str, text: str) -> Run:
    def shows(run: Run) -> bool:
        return text in _text([c for _, c in fleet.log_of(run_id)]) or run.status.is_terminal

    return fleet.wait(run_id, shows, 120, f"output {text!r}")


class DaemonWatch(threading.Thread):
    """Host pids of every process whose command line carries ``tag``, while it runs."""

    def __init__(self, tag: str) -> None:
        super().__init__(daemon=True)
        self.tag, self.pids, self.done = tag, set[int](), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            for proc in psutil.process_iter(["pid", "cmdline"]):
                if self.tag in (proc.info["cmdline"] or []):
                    self.pids.add(proc.info["pid"])


def _let_go_once_seen(fleet: Fleet, run_id: str, watch: DaemonWatch) -> None:
    """The agent waits, its daemon running, until the watch has seen the daemon."""
    run = fleet.wait(run_id, lambda r: r.sandbox_ref, 120, "a sandbox")
    assert run.sandbox_ref is not None
    deadline = time.monotonic() + 300  # a hang guard
    while not watch.pids and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watch.pids, "the daemon was never seen running"
    (Path(run.sandbox_ref["sandbox"]["root"]) / "workspace" / "daemon-seen").touch()


# Where ssh's jail differs from bwrap's under a root worker (README, "Security"): bwrap
# runs as the ssh user in a user namespace, so the jail's pid 1 (bwrap's own, without
# capabilities, holding the jail's argv and nothing of the fleet) and the proxy's socket
# directory (the user's egress proxy) are that user's; and
# memory is an rlimit, which refuses the allocation rather than OOM-killing it.
_SSH_DIFFERS: dict[str, object] = {
    "proc-environ": {"found": [], "unreadable": []},
    "unix-sockets": {
        "walked": ["/run/turnkeeper/egress/proxy.sock"],
        "connected": ["/run/turnkeeper/egress/proxy.sock"],
    },
    "memory": {"ppid": 1, "mem": {"1": "read", "3": "read"}, "nonces": []},
    "memory-bomb": "exit 1",
}


def _expected(provider: str, config: dict[str, Any]) -> dict[str, object]:
    """Every probe's exact result: bwrap's, and ssh's where it differs."""
    services = config["services"]
    writes = {
        # The jail's own root tmpfs, and the directories made on it, are read-only.
        "/": "EROFS",
        "/usr": "EROFS",
        "/etc": "EROFS",
        "/run/turnkeeper": "EROFS",
        "/run/turnkeeper/egress": "EROFS",
        # Paths of the host, none of which the jail shows (ssh adds its own).
        **dict.fromkeys(config["write_targets"][5:], "ENOENT"),
    }
    expected: dict[str, object] = {
        "proc-environ": {"found": [], "unreadable": [1]},
        "proc-cmdline": {"found": [], "unreadable": []},
        **{f"tcp-{name}": "ECONNREFUSED" for name in services},
        **{f"proxy-{name}": "HTTP/1.1 403 Forbidden" for name in services},
        "unix-postgres": "ENOENT",
        # None to be found by walking; the proxy's, named on its jail's command line, only.
        "unix-sockets": {"walked": [], "connected": ["/run/turnkeeper/egress/proxy.sock"]},
        "files": {"named": [], "holding": []},
        "host-paths": dict.fromkeys(config["host_paths"], False),
        "write-outside": writes,
        "memory": {"ppid": 1, "mem": {"1": "EACCES", "3": "read"}, "nonces": []},
        "daemon": "started",
        "memory-bomb": "exit -9",  # OOM-killed by its cgroup, alone
        "fork-bomb": "refused: EAGAIN",
        "forged": 3,
    }
    if provider == "ssh":
        expected.update(_SSH_DIFFERS)
    return expected


def _host_extras(
    provider: str, request: pytest.FixtureRequest
) -> tuple[dict[str, int], list[str], list[str]]:
    """The services to reach, and the paths to look for and write to, beyond bwrap's:
    for ssh, its sshd, its host key, and the account's sandboxes root and data dir."""
    if provider != "ssh":
        return dict(SERVICES), [], []
    sshd: Sshd = request.getfixturevalue("sshd")
    target: SshTarget = request.getfixturevalue("ssh_agent_target")
    remote_data = str(Path(target.root).parent)
    host_paths = [str(sshd.base), str(sshd.host_key), str(sshd.authorized_keys.parent),
                  target.root, remote_data]  # fmt: skip
    return {**SERVICES, "sshd": sshd.port}, host_paths, [target.root, remote_data]


def test_a_hostile_agent_gets_nothing(
    fleet: Fleet, settings: Settings, request: pytest.FixtureRequest
) -> None:
    provider = fleet.settings.sandbox_provider
    services, host_paths, write_targets = _host_extras(provider, request)
    marks = _markers()
    marks["secret"] = fleet.env["TURNKEEPER_SECRET"]  # the worker's server secret
    database = settings.require_database_url()
    fleet.start_worker(concurrency=2)

    victim_env = {"VICTIM_TOKEN": marks["env"], "VICTIM_FILE_TEXT": marks["file"],
                  "VICTIM_FILE_TAG": marks["tag"]}  # fmt: skip
    victim = fleet.client.submit(
        {"command": ["/bin/sh", "-c", VICTIM], "format": "text", "env": victim_env},
        marks["prompt"],
    )
    victim = _wait_text(fleet, victim.run_id, "ready")
    assert victim.sandbox_ref is not None
    victim_root = Path(victim.sandbox_ref["sandbox"]["root"])

    tag = f"hostile-daemon-{uuid.uuid4().hex}"
    config = {
        "markers": [*marks.values(), database.rsplit("/", 1)[1]],
        "marker_file": f"notes-{marks['tag']}.txt",
        "host_paths": [str(settings.data_dir), str(victim_root), "/var/run/postgresql",
                       "/run/postgresql", "/root", "/home", "/etc/shadow", *host_paths],
        "write_targets": ["/", "/usr", "/etc", "/run/turnkeeper", "/run/turnkeeper/egress",
                          str(victim_root / "workspace"), str(settings.data_dir),
                          *write_targets],
        "services": services,
        "daemon_tag": tag,
        "run_id": "hostile",
    }  # fmt: skip
    watch = DaemonWatch(tag)
    watch.start()
    hostile = fleet.client.submit(
        {"command": ["python3", "-c", HOSTILE, "{prompt_file}"], "format": "text"},
        json.dumps(config),
        run_id="hostile",
    )
    _let_go_once_seen(fleet, hostile.run_id, watch)
    hostile = fleet.wait_settled(hostile.run_id, timeout=600)
    watch.done.set()
    watch.join()

    lines = _text([c for _, c in fleet.log_of("hostile")]).splitlines()
    forged = [json.loads(line) for line in lines if line.startswith('{"__exit"')]
    probes = {p["probe"]: p["result"] for p in map(json.loads, lines) if "probe" in p}
    assert probes == _expected(provider, config)
    # What the jail let it write was the jail's own: nothing of it reached the host.
    assert [t for t in config["write_targets"] if Path(t, "hostile-was-here").exists()] == []
    assert [list(f) for f in forged] == [["__exit", "__nonce"]] * 3
    assert len(lines) == len(probes) + len(forged)

    # The run is the agent's own: failed, exit code 5, with the limits it hit counted.
    assert hostile.status is RunStatus.FAILED
    error = dict(hostile.error or {})
    limits = error.pop("limits", None)
    assert error == {"reason": "agent-exit", "message": "the agent exited with code 5",
                     "exit_code": 5, "stderr": ""}  # fmt: skip
    if provider == "ssh":
        assert limits is None  # rlimits count nothing the worker could report
    else:
        assert limits is not None
        assert limits["memory_kills"] == 1
        assert limits["pid_limit_hits"] > 0

    # Its nonce was random, never guessed, and is nowhere a client or a log sees it.
    placement = fleet.client.require("hostile").sandbox_ref
    assert placement is not None
    nonce = placement["journals"][0]["nonce"]
    assert re.fullmatch("[0-9a-f]{64}", nonce)
    assert nonce not in {f["__nonce"] for f in forged}
    assert nonce not in json.dumps([c for _, c in fleet.log_of("hostile")])
    assert nonce not in fleet.dump_logs()

    # The daemon it left is gone, found from outside by its tag.
    assert [pid for pid in watch.pids if psutil.pid_exists(pid)] == []

    # The victim and the worker went on as if nothing happened.
    assert all(proc.poll() is None for proc in fleet.procs)
    (victim_root / "workspace" / "release").touch()
    victim = fleet.wait_settled(victim.run_id)
    assert victim.status is RunStatus.COMPLETED
    assert _text([c for _, c in fleet.log_of(victim.run_id)]) == "ready\nvictim-done\n"
