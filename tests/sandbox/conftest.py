"""Real sandboxes for the journal suite: local, bubblewrap, and ssh to a loopback sshd.

The ssh fixtures start one ``sshd`` on a free loopback port with host and user keys
generated in a temporary directory only root can enter; bwrap and ssh tests skip,
naming the missing binary, only when it is not installed, and fail then in CI
(``tests/unavailable.py``). ``ssh_target`` logs in as root; ``ssh_agent_target`` as
``SSH_AGENT_USER``, an unprivileged system account the fixture creates when it is
missing (the deployment's sandbox host logs its workers in as such an account), with
its sandboxes under a directory of its own.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sshd import Sshd, sshd_unavailable
from tests.unavailable import cannot_run, require_bwrap, skip_or_fail
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.egress import stop_proxies
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.provider import Sandbox, SandboxProvider, SandboxRef, SandboxSpec
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool

PROVIDERS = ["local", "bwrap", "ssh"]
TEST_UIDS = (1900000000, 1900065535)
"""The default range of TURNKEEPER_SANDBOX_UIDS: the uids a root worker's jails get."""
SSH_AGENT_USER = "tk-ssh-agent"
"""The unprivileged remote user of ``ssh_agent_target`` (no password, no home)."""


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
        skip_or_fail(f"cannot create the user {SSH_AGENT_USER}: {done.stderr.decode()[-300:]}")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    cannot_run(sshd_unavailable())
    # Its own files below pytest's 0700 root: root's alone. sshd reads authorized keys
    # as the user logging in: they live where any user can.
    shared = Path(tempfile.mkdtemp(prefix="tk-sshd-"))
    shared.chmod(0o755)
    server = Sshd(tmp_path_factory.mktemp("sshd"), shared_dir=shared)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture(scope="session")
def ssh_target(sshd: Sshd) -> SshTarget:
    return sshd.target(known_hosts_file=Path("/dev/null"), strict_host_key_checking=False)


@pytest.fixture(scope="session")
def ssh_agent_target(sshd: Sshd) -> SshTarget:
    """The unprivileged account's target: its data directory (the parent of its
    sandboxes root, where its egress proxy lives) is its own, 0700."""
    account = _ssh_agent_user()
    shared = sshd.authorized_keys.parent
    home = shared / "agent"
    (home / "sandboxes").mkdir(parents=True)
    for path in (home, home / "sandboxes"):
        os.chown(path, account.pw_uid, account.pw_gid)
        path.chmod(0o700)
    return sshd.target(
        user=SSH_AGENT_USER, root=str(home / "sandboxes"), python=_account_python(shared / "python")
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
        require_bwrap()
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
