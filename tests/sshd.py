"""A real OpenSSH server on a loopback port, for the ssh tests and the soak.

Its host key and its client key are generated in its own directory; it accepts the
client key for root and, when its authorized keys live in a directory any user can
read (``shared_dir``: sshd reads them as the user logging in), for other accounts too.
It can be cut (killed with its sessions: every connection to it drops) and started
again on the same port, with the same keys.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from turnkeeper.embedded.ports import LOOPBACK, free_port
from turnkeeper.errors import ServiceError
from turnkeeper.sandbox.ssh import SshTarget

SSHD = "/usr/sbin/sshd"


def sshd_unavailable() -> str | None:
    """Why no loopback sshd can run here (the tests' skip reason), or None."""
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        return "openssh-server (/usr/sbin/sshd) or the ssh client is not installed"
    if os.geteuid() != 0:
        return "the loopback sshd fixture needs root"
    return None


class Sshd:
    """The loopback sshd: its port, a known_hosts naming its host key, the client key
    (``user_key``), where it keeps its own files (``base``) and ``root``, a directory
    there for the sandboxes of the root account."""

    def __init__(self, base: Path, *, shared_dir: Path | None = None, max_sessions: int = 100):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host_key, self.user_key = base / "host_ed25519", base / "user_ed25519"
        for key in (self.host_key, self.user_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        self.authorized_keys = (shared_dir or base) / "authorized_keys"
        self.authorized_keys.write_bytes(self.user_key.with_suffix(".pub").read_bytes())
        self.authorized_keys.chmod(0o644 if shared_dir is not None else 0o600)
        self.known_hosts = base / "known_hosts"
        self.config = base / "sshd_config"
        self.max_sessions = max_sessions
        self._listen_on(self.port)
        self.root = base / "remote"
        self.root.mkdir()
        self.log = base / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.served = False  # once it listened, its port is the one its clients know

    def _listen_on(self, port: int) -> None:
        """Its config and known_hosts for ``port``."""
        self.port = port
        public = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[{LOOPBACK}]:{port} {public[0]} {public[1]}\n")
        self.config.write_text(
            f"Port {port}\nListenAddress {LOOPBACK}\nHostKey {self.host_key}\n"
            f"PidFile {self.base}/sshd.pid\nAuthorizedKeysFile {self.authorized_keys}\n"
            "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\n"
            f"MaxSessions {self.max_sessions}\nMaxStartups {self.max_sessions}\n"
        )

    def target(self, **fields: Any) -> SshTarget:
        """The SshTarget of its root account, with ``fields`` replaced."""
        served = SshTarget(
            host=LOOPBACK,
            port=self.port,
            user="root",
            root=str(self.root),
            identity_file=self.user_key,
            known_hosts_file=self.known_hosts,
        )
        return replace(served, **fields)

    def settings(self) -> dict[str, Any]:
        """The ssh settings of a worker whose sandboxes it holds (as root)."""
        return {
            "ssh_host": LOOPBACK,
            "ssh_port": self.port,
            "ssh_user": "root",
            "ssh_root": str(self.root),
            "ssh_identity_file": str(self.user_key),
            "ssh_known_hosts_file": str(self.known_hosts),
        }

    def start(self) -> None:
        """Start it (again, after a cut: the same port and keys) and wait until it listens.

        Its port was free when chosen, but another process may bind it before sshd does
        (parallel tests choose ports too), and a connect would then reach that process:
        only this sshd's own listening socket counts. Before it ever served, a taken port
        is given up for another; after, its clients know the port, so it waits for it."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        for _ in range(200):  # hang guard: a port taken for good
            proc = self._launch()
            if self._listens(proc):
                self.proc, self.served = proc, True
                return
            said = self.log.read_text(errors="replace")
            if "Address already in use" not in said and "Cannot bind" not in said:
                raise ServiceError(f"sshd exited with {proc.returncode}: {said}")
            self.log.write_bytes(b"")
            if self.served:
                time.sleep(0.1)
            else:
                self._listen_on(free_port())
        raise ServiceError(f"sshd never listened on {LOOPBACK}:{self.port}: it is taken")

    def _launch(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def _listens(self, proc: subprocess.Popen[bytes]) -> bool:
        """True once ``proc`` itself listens on the port; False once it exited."""
        for _ in range(400):  # hang guard while sshd binds its port
            if proc.poll() is not None:
                return False
            try:
                sockets = psutil.Process(proc.pid).net_connections(kind="tcp")
            except psutil.Error:
                sockets = []
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port
                for c in sockets
            ):
                return True
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)
        raise ServiceError(f"sshd never listened on {LOOPBACK}:{self.port}")

    def cut(self, *, with_commands: bool = False) -> int:
        """SIGKILL the listener and every sshd process serving a connection: each
        connection to it drops. ``with_commands`` kills the commands those sessions
        still run too. Agents started in sessions of their own are not its children
        any more and live on. Returns the processes killed besides the listener."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self.proc = None
            return 0
        try:
            descendants = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        served = descendants if with_commands else [p for p in descendants if _is_sshd(p)]
        proc.kill()
        proc.wait(timeout=30)
        self.proc = None
        for session in served:
            try:
                session.kill()
            except psutil.Error:
                continue
        return len(served)

    def stop(self) -> None:
        """End it with all its sessions and their commands (the workers' multiplexing
        masters hold sessions for minutes: they outlive a stopped listener)."""
        self.cut(with_commands=True)


def _is_sshd(process: psutil.Process) -> bool:
    try:
        return process.name().startswith("sshd")
    except psutil.Error:
        return False
