"""The loopback sshd of the ssh tests and the soak listens on its own port, or says so.

Its port is chosen free but bound later; parallel tests choose ports too. A port taken
in between must not pass for a listening sshd (the soak's workers would then refuse to
start, one after another, against whatever holds it)."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sshd import Sshd, sshd_unavailable
from tests.unavailable import cannot_run
from turnkeeper.embedded.ports import LOOPBACK


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    cannot_run(sshd_unavailable())
    server = Sshd(tmp_path / "sshd")
    yield server
    server.stop()


def _listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen()
    return sock


def _ssh_true(server: Sshd) -> subprocess.CompletedProcess[bytes]:
    target = server.target()
    return subprocess.run(
        [
            *("ssh", "-p", str(target.port), "-i", str(target.identity_file)),
            *("-o", f"UserKnownHostsFile={target.known_hosts_file}"),
            *("-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"),
            *(f"{target.user}@{target.host}", "true"),
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_a_port_taken_before_the_first_start_is_given_up_for_another(sshd: Sshd) -> None:
    chosen = sshd.port
    squatter = _listener(chosen)
    try:
        sshd.start()
        assert sshd.port != chosen
        assert sshd.target().port == sshd.port
        assert sshd.settings()["ssh_port"] == sshd.port
        done = _ssh_true(sshd)
        assert (done.returncode, done.stderr) == (0, b"")
    finally:
        squatter.close()


def test_after_a_cut_it_waits_for_its_own_port(sshd: Sshd) -> None:
    sshd.start()
    port = sshd.port
    sshd.cut()
    squatter = _listener(port)
    freed = threading.Timer(1.0, squatter.close)
    freed.start()
    try:
        sshd.start()  # returns only once the squatter let go and sshd itself listens
    finally:
        freed.cancel()
        squatter.close()
    assert sshd.port == port
    done = _ssh_true(sshd)
    assert (done.returncode, done.stderr) == (0, b"")
