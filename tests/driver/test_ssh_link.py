"""The ssh link to a run's sandbox host drops mid-run: the run rides it out.

A real ``sshd`` on loopback holds the sandboxes; a worker with the ssh provider
runs the agent there. Mid-run the sshd is stopped, every connection it holds
included, for 5 s (longer than the lease), then started again on the same port.
The run completes with exactly its oracle's output, in its first attempt.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_adoption import AGENT, PROMPT, assert_log_is_oracle, attempts, events
from turnkeeper.config import Settings
from turnkeeper.embedded.ports import free_port
from turnkeeper.errors import SandboxUnreachableError
from turnkeeper.sandbox.provider import SandboxSpec
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.store.records import RunStatus

SSHD = "/usr/sbin/sshd"


class LoopbackSshd:
    """An sshd on a loopback port with keys of its own, that can be cut and restored."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.host_key, self.user_key = base / "host_ed25519", base / "user_ed25519"
        for key in (self.host_key, self.user_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        authorized = base / "authorized_keys"
        authorized.write_bytes(self.user_key.with_suffix(".pub").read_bytes())
        authorized.chmod(0o600)
        self.known_hosts = base / "known_hosts"
        public = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {public[0]} {public[1]}\n")
        self.config = base / "sshd_config"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\n"
            f"PidFile {base}/sshd.pid\nAuthorizedKeysFile {authorized}\n"
            "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nMaxSessions 100\nMaxStartups 100\n"
        )
        self.root = base / "remote"
        self.root.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with (self.base / "sshd.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        for _ in range(400):  # hang guard while sshd binds its port
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert self.proc.poll() is None, (self.base / "sshd.log").read_text()
            time.sleep(0.05)
        pytest.fail("sshd never listened")

    def cut(self) -> int:
        """Stop sshd and every session it serves: each connection to it drops. Agents
        left running in their own sessions are not its children any more and live on."""
        assert self.proc is not None
        listener = psutil.Process(self.proc.pid)
        sessions = listener.children(recursive=True)
        for proc in [listener, *sessions]:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
        self.proc.wait(timeout=30)
        self.proc = None
        return len(sessions)

    def stop(self) -> None:
        if self.proc is not None:
            self.cut()


@pytest.fixture
def sshd(tmp_path: Path) -> LoopbackSshd:
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        pytest.skip("openssh-server (/usr/sbin/sshd) or the ssh client is not installed")
    if os.geteuid() != 0:
        pytest.skip("the loopback sshd fixture needs root")
    base = tmp_path / "sshd"
    base.mkdir()
    return LoopbackSshd(base)


def test_the_ssh_link_dropped_for_five_seconds_mid_run(
    settings: Settings, sshd: LoopbackSshd, database_url: str, tmp_path: Path
) -> None:
    sshd.start()
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        sandbox_provider="ssh",
        ssh_host="127.0.0.1",
        ssh_port=sshd.port,
        ssh_user="root",  # the test sshd's only account
        ssh_root=str(sshd.root),
        ssh_identity_file=str(sshd.user_key),
        ssh_known_hosts_file=str(sshd.known_hosts),
    )
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(AGENT, PROMPT)
        while len(fleet.log_of(run.run_id)) < 6:
            time.sleep(0.02)
        assert sshd.cut() >= 1, "the worker's connections were cut"
        time.sleep(5.0)
        sshd.start()
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        # No takeover: the lease was renewed all along, the link was retried.
        assert (done.epoch, done.attempt_count) == (1, 1)
        assert attempts(database_url, run.run_id) == [(1, "completed")]
        assert events(fleet, "journal.link_lost", run.run_id), "the follow saw the cut"
        assert_log_is_oracle(fleet, done, AGENT, tmp_path / "oracle")
    finally:
        fleet.stop()
        sshd.stop()


def test_ssh_tells_a_dropped_link_from_the_remote_commands_answers(
    sshd: LoopbackSshd, tmp_path: Path
) -> None:
    """Exit 255 is ssh's own (the link); every other status is the command's answer,
    a command's own 255 included (reported as 254); a gone sandbox is None."""
    sshd.start()
    target = SshTarget(
        host="127.0.0.1",
        port=sshd.port,
        user="root",
        root=str(sshd.root),
        identity_file=sshd.user_key,
        known_hosts_file=sshd.known_hosts,
        control_dir=tmp_path / "control",
    )
    (tmp_path / "control").mkdir()
    provider = SshProvider(target)
    try:
        ref = provider.create("link-run", SandboxSpec())
        sandbox = provider.resume(ref)
        assert sandbox is not None
        answers = [
            sandbox.exec(["/bin/sh", "-c", f"exit {code}"]).exit_code for code in (0, 3, 255)
        ]
        assert answers == [0, 3, 254]
        sshd.cut()
        with pytest.raises(SandboxUnreachableError) as unreachable:
            sandbox.exec(["true"])
        assert unreachable.value.reason == "ssh-unreachable"
        with pytest.raises(SandboxUnreachableError):
            provider.resume(ref)  # out of reach is not gone
        sshd.start()
        assert sandbox.exec(["/bin/sh", "-c", "exit 7"]).exit_code == 7
        provider.destroy(ref)
        assert provider.resume(ref) is None  # gone: the answer a run may fail on
    finally:
        provider.close()
        sshd.stop()
