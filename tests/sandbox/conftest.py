"""Real sandboxes for the journal suite: local, bubblewrap, and ssh to a loopback sshd.

The ssh fixture starts its own ``sshd`` on a free loopback port with host and user
keys generated in a temporary directory; bwrap and ssh tests skip, naming the
missing binary, only when it is not installed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.provider import Sandbox, SandboxProvider, SandboxSpec
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool

SSHD = "/usr/sbin/sshd"
PROVIDERS = ["local", "bwrap", "ssh"]
TEST_UIDS = (1900000000, 1900065535)
"""The default range of TURNKEEPER_SANDBOX_UIDS: the uids a root worker's jails get."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def ssh_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshTarget]:
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        pytest.skip("openssh-server (/usr/sbin/sshd) or the ssh client is not installed")
    if os.geteuid() != 0:
        pytest.skip("the loopback sshd fixture needs root")
    base = tmp_path_factory.mktemp("sshd")
    host_key, user_key = base / "host_ed25519", base / "user_ed25519"
    for key in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = base / "authorized_keys"
    authorized.write_bytes(user_key.with_suffix(".pub").read_bytes())
    authorized.chmod(0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    port = _free_port()
    config = base / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"PidFile {base}/sshd.pid\nAuthorizedKeysFile {authorized}\n"
        "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nMaxSessions 100\nMaxStartups 100\n"
    )
    with (base / "sshd.log").open("wb") as sshd_log:
        sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sshd_log,
        )
    for _ in range(200):  # hang guard while sshd binds its port
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        if sshd.poll() is not None:
            pytest.fail("sshd exited: " + (base / "sshd.log").read_text())
        time.sleep(0.05)
    remote_root = base / "remote"
    remote_root.mkdir()
    yield SshTarget(
        host="127.0.0.1",
        port=port,
        user="root",
        root=str(remote_root),
        identity_file=user_key,
        known_hosts_file=Path("/dev/null"),
        strict_host_key_checking=False,
    )
    sshd.terminate()
    sshd.wait(timeout=10)


def make_provider(name: str, request: pytest.FixtureRequest, root: Path) -> SandboxProvider:
    if name == "local":
        return LocalProvider(root)
    if name == "bwrap":
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) is not installed")
        return BwrapProvider(root, uids=UidPool(*TEST_UIDS))
    target: SshTarget = request.getfixturevalue("ssh_target")
    provider = SshProvider(target)
    request.addfinalizer(provider.close)
    return provider


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> SandboxProvider:
    return make_provider(request.param, request, tmp_path / "sandboxes")


@pytest.fixture
def sandbox(provider: SandboxProvider) -> Iterator[Sandbox]:
    ref = provider.create("fixture-run", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    yield sandbox
    provider.destroy(ref)


@pytest.fixture
def local_sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    provider = LocalProvider(tmp_path / "sandboxes")
    ref = provider.create("fixture-run", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    yield sandbox
    provider.destroy(ref)
