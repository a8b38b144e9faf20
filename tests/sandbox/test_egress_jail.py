"""The egress path end to end: a real bwrap jail with no network, as an unprivileged uid,
reaches the host's proxy only through the bound socket directory and the socat forwarder.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.egress_support import (
    UpstreamServer,
    jail_argv,
    jail_unavailable,
    paths_for,
    serving,
    settings_for,
    short_data_dir,
    stop_daemon,
)
from tests.unavailable import cannot_run
from turnkeeper.sandbox.egress import ensure_proxy, proxy_environment

_WHY = jail_unavailable()


@pytest.fixture(autouse=True)
def _jail_available() -> None:
    cannot_run(_WHY)


URLLIB = "import sys, urllib.request as r; sys.stdout.write(r.urlopen('{url}').read().decode())"
# One line per attempt: CONNECT status, HTTP status, curl's exit code.
PROBE = "curl -s -o /dev/null -w '%{http_connect} %{http_code} %{exitcode}\\n' --max-time 60"


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer()
    with serving(server):
        yield server


@pytest.fixture
def proxy(upstream: UpstreamServer) -> Iterator[tuple[Path, Path]]:
    """(data dir, socket) of a proxy allowing only the upstream, for the jail's group."""
    with short_data_dir() as data_dir:
        settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
        try:
            yield data_dir, ensure_proxy(settings, jail_gid=65534)
        finally:
            stop_daemon(paths_for(settings, jail_gid=65534))


def test_a_jailed_agent_reaches_the_allowlist_and_nothing_else(
    upstream: UpstreamServer, proxy: tuple[Path, Path]
) -> None:
    _, socket_path = proxy
    allowed = f"http://127.0.0.1:{upstream.port}/small"
    script = "\n".join(
        [
            "id -u",
            f"{PROBE} {allowed}",  # plain HTTP, forwarded
            f"{PROBE} --proxytunnel {allowed}",  # through a CONNECT tunnel
            f"curl -s {allowed}",
            f"python3 -I -c {shlex.quote(URLLIB.format(url=allowed))}",
            f"{PROBE} http://127.0.0.1:5432/",  # Postgres, by the proxy
            f"{PROBE} --proxytunnel http://127.0.0.1:5432/",
            f"{PROBE} http://127.0.0.1:6379/",  # Redis
            f"{PROBE} --noproxy '*' http://127.0.0.1:5432/",  # Postgres, directly
            f"{PROBE} --noproxy '*' {allowed}",  # even the allowed port, directly
            "echo done",
        ]
    )
    argv = jail_argv(socket_path, ["/bin/sh", "-c", script], proxy_environment())
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [
        "65534",
        "000 200 0",
        "200 200 0",
        "hello through the proxy",
        "hello through the proxy",
        "000 403 0",
        "403 000 56",
        "000 403 0",
        "000 000 7",
        "000 000 7",
        "done",
    ]
    assert upstream.accepted == 4
    assert [seen.path for seen in upstream.seen] == ["/small"] * 4


def test_a_running_jail_reaches_a_restarted_proxy(
    upstream: UpstreamServer, proxy: tuple[Path, Path]
) -> None:
    data_dir, socket_path = proxy
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    script = f"while read -r step; do {PROBE} http://127.0.0.1:{upstream.port}/small; done"
    argv = jail_argv(socket_path, ["/bin/sh", "-c", script], proxy_environment())
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    ) as jail:
        assert jail.stdin is not None
        assert jail.stdout is not None

        def attempt() -> str:
            jail.stdin.write("go\n")
            return jail.stdout.readline()

        assert attempt() == "000 200 0\n"
        stop_daemon(paths_for(settings, jail_gid=65534))
        down = attempt().split()
        assert down[:2] == ["000", "000"]
        assert down[2] != "0"
        assert ensure_proxy(settings, jail_gid=65534) == socket_path
        assert attempt() == "000 200 0\n"
        jail.stdin.close()
        assert jail.wait(timeout=60) == 0
    assert upstream.accepted == 2
