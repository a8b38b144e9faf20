"""The ssh provider's remote side: agents in the bubblewrap jail of the remote host, and
out of it only through that host's egress proxy (here the loopback sshd of conftest,
logged in as its unprivileged account, as a deployment's sandbox host is). The jail's
pid namespace ends everything an agent started, ``setsid`` daemons included, when
``destroy`` kills the writer's group; its user namespace makes ``RLIMIT_NPROC`` count
one sandbox's processes, not every process of the remote user."""

from __future__ import annotations

import pwd
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from tests.sandbox.conftest import SSH_AGENT_USER, release_remote
from tests.sandbox.test_journal_suite import read_all
from tests.unavailable import require_bwrap
from turnkeeper.config import load_settings
from turnkeeper.sandbox import spawn_journaled
from turnkeeper.sandbox.cgroup import Limits
from turnkeeper.sandbox.egress import lock_holder, proxy_paths
from turnkeeper.sandbox.journal import follow_argv
from turnkeeper.sandbox.provider import SandboxSpec
from turnkeeper.sandbox.ssh import SshProvider, SshTarget

BODY = b"allowed upstream\n"
# Shell code run as the agent: what it sees of the host, and what its network reaches.
PROBE = """
hostname
test -e {journal_dir} && echo journal-visible || echo journal-hidden
test -e {other} && echo other-visible || echo other-hidden
cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sshd
python3 - <<'EOF'
import urllib.error, urllib.request
for port in ({allowed}, {refused}):
    try:
        answer = urllib.request.urlopen(f"http://127.0.0.1:{{port}}/x", timeout=30)
        print(answer.read().decode(), end="")
    except urllib.error.HTTPError as exc:
        print(exc.code)
EOF
"""

FORK_BOMB = """python3 -c '
import errno, os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        n += 1
except OSError as exc:
    print("forked", n, "then", errno.errorcode[exc.errno], flush=True)
'"""


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - its signature
        pass


@pytest.fixture
def upstreams() -> Iterator[tuple[int, int]]:
    """Two loopback HTTP servers answering BODY: one allowlisted, one not."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Upstream) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield servers[0].server_address[1], servers[1].server_address[1]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def jailed_provider(
    ssh_agent_target: SshTarget, upstreams: tuple[int, int]
) -> Iterator[SshProvider]:
    require_bwrap()
    provider = SshProvider(ssh_agent_target, egress=(f"127.0.0.1:{upstreams[0]}",))
    yield provider
    provider.close()
    release_remote(ssh_agent_target)


@pytest.fixture
def limited_provider(ssh_agent_target: SshTarget) -> Iterator[SshProvider]:
    """The jail without egress, under a pids limit of 24."""
    require_bwrap()
    provider = SshProvider(ssh_agent_target, limits=Limits(256 * 1024 * 1024, 1.0, 24))
    yield provider
    provider.close()
    release_remote(ssh_agent_target)  # what a failed test left running


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes of this host whose command line carries ``tag``."""
    return [
        proc
        for proc in psutil.process_iter(["cmdline", "status"])
        if tag in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE
    ]


def _wait_for_line(path: str, text: bytes) -> None:
    for _ in range(1200):  # a hang guard while the remote agent starts
        if text in Path(path).read_bytes():
            return
        time.sleep(0.05)
    pytest.fail(f"{text!r} never reached {path}")


def test_the_remote_host_runs_the_agent_in_its_jail_with_egress_by_allowlist(
    jailed_provider: SshProvider, upstreams: tuple[int, int]
) -> None:
    other = jailed_provider.create("other-run", SandboxSpec())
    ref = jailed_provider.create("jailed-run", SandboxSpec())
    sandbox = jailed_provider.resume(ref)
    assert sandbox is not None
    assert sandbox.capabilities.network_isolation
    allowed, refused = upstreams
    probe = PROBE.format(
        journal_dir=ref.journal_dir, other=other.workspace, allowed=allowed, refused=refused
    )
    try:
        lines, _ = read_all(sandbox, spawn_journaled(sandbox, "jailed-run", probe))
        # Its own pid namespace: the host's sshd (which runs its writer) is not in it.
        assert [line for line, _ in lines] == [
            b"sandbox",
            b"journal-hidden",
            b"other-hidden",
            b"0",
            BODY.rstrip(),
            b"403",
        ]
        # One proxy on the remote host, for the allowlist, alive after the agent is gone
        # (the account's data dir keeps the pidfiles of proxies other tests stopped).
        data_dir = Path(jailed_provider.target.root).parent
        pidfiles = sorted((data_dir / "egress").glob("*.pid"))
        ours = proxy_paths(load_settings(data_dir=data_dir, sandbox_egress=f"127.0.0.1:{allowed}"))
        assert [p for p in pidfiles if lock_holder(p) is not None] == [ours.pidfile]
    finally:
        jailed_provider.destroy(ref)
        jailed_provider.destroy(other)


def test_destroy_ends_the_jail_and_a_setsid_daemon_in_it(limited_provider: SshProvider) -> None:
    """The agent is still running, and its daemon left its session: destroy kills the
    writer's group, bwrap's init dies with its parent, and its pid namespace with it."""
    ref = limited_provider.create("daemon-run", SandboxSpec())
    sandbox = limited_provider.resume(ref)
    assert sandbox is not None
    tag = f"daemon-{uuid.uuid4().hex}"
    daemon = f"setsid sh -c 'while :; do sleep 1; done' {tag} </dev/null >/dev/null 2>&1 &"
    handle = spawn_journaled(sandbox, "daemon-run", f"{daemon} echo up; exec sleep 1000")
    _wait_for_line(handle.paths.journal, b"up\n")
    daemons = _tagged(tag)
    # One daemon, of the unprivileged account, in the jail's pid namespace.
    assert [p.uids().real for p in daemons] == [pwd.getpwnam(SSH_AGENT_USER).pw_uid]
    namespace = Path(f"/proc/{daemons[0].pid}/ns/pid").readlink()
    assert namespace != Path("/proc/self/ns/pid").readlink()
    limited_provider.destroy(ref)
    psutil.wait_procs(daemons, timeout=30)  # a hang guard: SIGKILL is not instant
    assert _tagged(tag) == []
    assert not Path(ref.root).exists()


def test_a_fork_bomb_takes_the_forks_of_its_own_sandbox_only(
    limited_provider: SshProvider,
) -> None:
    """Both sandboxes run as the one remote user, under a pids limit of 24 each: one
    holds 20 processes while the other forks until refused, and both get their own 24."""
    holder_ref = limited_provider.create("holder", SandboxSpec())
    bomber_ref = limited_provider.create("bomber", SandboxSpec())
    holder = limited_provider.resume(holder_ref)
    bomber = limited_provider.resume(bomber_ref)
    assert holder is not None
    assert bomber is not None
    hold = "for i in $(seq 20); do sleep 1000 & done; echo holding; exec sleep 1000"
    try:
        held = spawn_journaled(holder, "holder", hold)
        _wait_for_line(held.paths.journal, b"holding\n")
        lines, reader = read_all(bomber, spawn_journaled(bomber, "bomber", FORK_BOMB))
        # 24 less bwrap's init, the agent's shell and python: 21 children, then EAGAIN.
        assert ([line for line, _ in lines], reader.exit_code) == ([b"forked 21 then EAGAIN"], 0)
    finally:
        limited_provider.destroy(holder_ref)
        limited_provider.destroy(bomber_ref)


def test_destroy_ends_what_a_dead_worker_left_reading(limited_provider: SshProvider) -> None:
    """A worker killed while following a journal never kills its follower: the ssh
    client lives on in a session of its own, and so does the remote ``tail -F`` (it
    writes nothing once the run is over, so no broken pipe ends it). Destroy ends the
    remote tail, and the client with it."""
    ref = limited_provider.create("follow-run", SandboxSpec())
    sandbox = limited_provider.resume(ref)
    assert sandbox is not None
    handle = spawn_journaled(sandbox, "follow-run", "echo up; exec sleep 1000")
    journal = handle.paths.journal
    _wait_for_line(journal, b"up\n")
    follower = sandbox.spawn(follow_argv(handle.paths, 0))
    assert follower.stdout.readline() == b"up\n"  # the remote tail runs
    tails = _tagged(journal)
    assert [p.name() for p in tails] == ["tail"]
    limited_provider.destroy(ref)  # and no follower.kill(): its worker is gone
    psutil.wait_procs(tails, timeout=30)  # a hang guard: SIGKILL is not instant
    assert _tagged(journal) == []
    assert follower.stdout.read() == b""  # the session ended
    for _ in range(600):  # a hang guard while the client exits
        if follower.poll() is not None:
            break
        time.sleep(0.05)
    assert follower.poll() == 255  # ssh: the remote command was killed by a signal
    follower.kill()  # reaps it
