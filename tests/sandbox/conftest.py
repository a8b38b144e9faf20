"""Real sandboxes for the journal suite: local, bubblewrap, and ssh to a loopback sshd.

The ssh fixtures start one ``sshd`` on a free loopback port with host and user keys
generated in a temporary directory only root can enter; bwrap and ssh tests skip,
naming the missing binary, only when it is not installed. ``ssh_target`` logs in as
root; ``ssh_agent_target`` as ``SSH_AGENT_USER``, an unprivileged system account the
fixture creates when it is missing (the deployment's sandbox host logs its workers in
as such an account), with its sandboxes under a directory of its own.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.egress import stop_proxies
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.provider import Sandbox, SandboxProvider, SandboxRef, SandboxSpec
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool

SSHD = "/usr/sbin/sshd"
PROVIDERS = ["local", "bwrap", "ssh"]
TEST_UIDS = (1900000000, 1900065535)
"""The default range of TURNKEEPER_SANDBOX_UIDS: the uids a root worker's jails get."""
SSH_AGENT_USER = "tk-ssh-agent"
"""The unprivileged remote user of ``ssh_agent_target`` (no password, no home)."""


@dataclass(frozen=True)
class Sshd:
    """The loopback sshd: its port, a known_hosts naming its host key, the client key,
    where it keeps its own files (root's alone) and the directory shared with the
    unprivileged account (its authorized keys, and that account's own directory)."""

    port: int
    known_hosts: Path
    identity_file: Path
    private_dir: Path
    shared_dir: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ssh_agent_user() -> pwd.struct_passwd:
    """The unprivileged account, created when missing (idempotent: a concurrent
    creation by another test process is fine). Its password field is ``*``, no
    password but not locked: sshd refuses a locked account even a key login."""
    with contextlib.suppress(KeyError):
        pwd.getpwnam(SSH_AGENT_USER)
        subprocess.run(["usermod", "--password", "*", SSH_AGENT_USER], check=False)
    # A login shell (sshd runs session commands with it), no home.
    done = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/bin/sh", "--user-group", "--password", "*", SSH_AGENT_USER],
        capture_output=True, check=False,
    )  # fmt: skip
    try:
        return pwd.getpwnam(SSH_AGENT_USER)
    except KeyError:
        pytest.skip(f"cannot create the user {SSH_AGENT_USER}: {done.stderr.decode()[-300:]}")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        pytest.skip("openssh-server (/usr/sbin/sshd) or the ssh client is not installed")
    if os.geteuid() != 0:
        pytest.skip("the loopback sshd fixture needs root")
    base = tmp_path_factory.mktemp("sshd")  # below pytest's 0700 root: root's alone
    # sshd reads authorized keys as the user logging in: they live where any user can.
    shared = Path(tempfile.mkdtemp(prefix="tk-sshd-"))
    shared.chmod(0o755)
    host_key, user_key = base / "host_ed25519", base / "user_ed25519"
    for key in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = shared / "authorized_keys"
    authorized.write_bytes(user_key.with_suffix(".pub").read_bytes())
    authorized.chmod(0o644)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    port = _free_port()
    known_hosts = base / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.with_suffix('.pub').read_text()}")
    config = base / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"PidFile {base}/sshd.pid\nAuthorizedKeysFile {authorized}\n"
        "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nMaxSessions 100\nMaxStartups 100\n"
    )
    with (base / "sshd.log").open("wb") as sshd_log:
        server = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sshd_log,
        )
    for _ in range(200):  # hang guard while sshd binds its port
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        if server.poll() is not None:
            pytest.fail("sshd exited: " + (base / "sshd.log").read_text())
        time.sleep(0.05)
    yield Sshd(port, known_hosts, user_key, base, shared)
    # Its sessions outlive it (the workers' multiplexing masters hold theirs for minutes).
    sessions = psutil.Process(server.pid).children(recursive=True)
    server.terminate()
    server.wait(timeout=10)
    for session in sessions:
        with contextlib.suppress(psutil.NoSuchProcess):
            session.kill()
    shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture(scope="session")
def ssh_target(sshd: Sshd) -> SshTarget:
    remote_root = sshd.private_dir / "remote"
    remote_root.mkdir()
    return SshTarget(
        host="127.0.0.1",
        port=sshd.port,
        user="root",
        root=str(remote_root),
        identity_file=sshd.identity_file,
        known_hosts_file=Path("/dev/null"),
        strict_host_key_checking=False,
    )


@pytest.fixture(scope="session")
def ssh_agent_target(sshd: Sshd) -> SshTarget:
    """The unprivileged account's target: its data directory (the parent of its
    sandboxes root, where its egress proxy lives) is its own, 0700."""
    account = _ssh_agent_user()
    home = sshd.shared_dir / "agent"
    (home / "sandboxes").mkdir(parents=True)
    for path in (home, home / "sandboxes"):
        os.chown(path, account.pw_uid, account.pw_gid)
        path.chmod(0o700)
    return SshTarget(
        host="127.0.0.1",
        port=sshd.port,
        user=SSH_AGENT_USER,
        root=str(home / "sandboxes"),
        identity_file=sshd.identity_file,
        known_hosts_file=sshd.known_hosts,
        python=_account_python(sshd.shared_dir / "python"),
    )


def _account_python(venv: Path) -> str:
    """turnkeeper "installed" for the account: the worker's interpreter may live where
    it cannot go (a pyenv under /root), so a venv of the system's Python of the same
    version that reads this environment's packages. The worker's own path otherwise."""
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if system is None or _minor_version(system) != version:
        return sys.executable
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{version}" / "site-packages"
    ours = [p for p in map(Path, sys.path) if p.name == "site-packages" and p.is_dir()]
    # addsitedir, not a bare path: the editable install's own .pth must be read too.
    (site / "worker-packages.pth").write_text(
        "".join(f"import site; site.addsitedir({str(p)!r})\n" for p in ours)
    )
    return str(venv / "bin" / "python3")


def _minor_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, check=False, text=True,
    )  # fmt: skip
    return done.stdout.strip()


def release_remote(target: SshTarget) -> None:
    """Destroy every sandbox left under the target's root and stop that host's egress
    proxy (the remote host is this machine)."""
    provider = SshProvider(target)
    try:
        for entry in Path(target.root).iterdir():
            provider.destroy(SandboxRef("ssh", entry.name, str(entry), host=target.as_host()))
    finally:
        provider.close()
        stop_proxies(Path(target.root).parent)


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
