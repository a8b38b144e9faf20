"""The ssh provider's remote side: agents in the bubblewrap jail of the remote host, and
out of it only through that host's egress proxy (here the loopback sshd of conftest)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.sandbox.test_journal_suite import read_all
from turnkeeper.sandbox import spawn_journaled
from turnkeeper.sandbox.egress import lock_holder, stop_proxies
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
def jailed_provider(ssh_target: SshTarget, upstreams: tuple[int, int]) -> Iterator[SshProvider]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    provider = SshProvider(ssh_target, egress=(f"127.0.0.1:{upstreams[0]}",))
    yield provider
    provider.close()
    data_dir = Path(ssh_target.root).parent  # the remote host is this machine
    stop_proxies(data_dir)


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
        # One proxy on the remote host, for the allowlist, alive after the agent is gone.
        pidfiles = sorted((Path(jailed_provider.target.root).parent / "egress").glob("*.pid"))
        assert [lock_holder(p) is not None for p in pidfiles] == [True]
    finally:
        jailed_provider.destroy(ref)
        jailed_provider.destroy(other)
