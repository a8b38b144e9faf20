"""The egress proxy as a jail sees it: the bind, the in-jail forwarder, the proxy variables.

A jail has no network but its own loopback. The host's proxy socket directory is bound
read-only at ``JAIL_SOCKET_DIR`` (the directory, not the socket file, so that a proxy
restarted on the same path is reachable from jails that already run), and ``socat``
inside the jail listens on ``127.0.0.1:FORWARDER_PORT`` and relays each connection to
the socket. socat, not Python: it is a small C binary from ``/usr`` that every jail
already sees, starts in milliseconds, forks per connection and needs no interpreter or
turnkeeper code inside the jail. Agents then find the proxy through ``proxy_environment``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from turnkeeper.errors import SandboxError
from turnkeeper.sandbox.egress.host import SOCKET_NAME

JAIL_SOCKET_DIR = "/run/turnkeeper/egress"
JAIL_SOCKET_PATH = f"{JAIL_SOCKET_DIR}/{SOCKET_NAME}"
FORWARDER_PORT = 3128
_FORWARDER_CHILDREN = 256
_SOCAT_SAFE_PATH = re.compile(r"/[A-Za-z0-9_./-]+")
# Starts the forwarder ($1, shell-quoted argv), waits until it listens on the loopback
# port ($2, hex as in /proc/net/tcp), then becomes the command; exit 125 if it cannot.
_WITH_FORWARDER = r"""
forwarder=$1 port_hex=$2
shift 2
eval "$forwarder" '&'
forwarder_pid=$!
tries=0
until grep -q ": 0100007F:$port_hex 00000000:0000 0A" /proc/net/tcp 2>/dev/null; do
  if ! kill -0 "$forwarder_pid" 2>/dev/null || [ "$tries" -ge 2000 ]; then
    echo "turnkeeper: the egress forwarder did not start listening" >&2
    exit 125
  fi
  tries=$((tries + 1))
  sleep 0.005
done
exec "$@"
"""


def jail_bind_args(socket_path: Path) -> list[str]:
    """bwrap arguments that show the host's proxy socket at ``JAIL_SOCKET_PATH``."""
    return ["--ro-bind", str(socket_path.parent), JAIL_SOCKET_DIR]


def _check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise SandboxError(f"not a TCP port: {port}", reason="egress-forwarder")


def forwarder_argv(
    socket_path_inside_jail: str = JAIL_SOCKET_PATH, port: int = FORWARDER_PORT
) -> list[str]:
    """The in-jail command relaying ``127.0.0.1:port`` to the proxy socket; runs until killed."""
    if not _SOCAT_SAFE_PATH.fullmatch(socket_path_inside_jail):
        raise SandboxError(
            f"the socket path {socket_path_inside_jail!r} must be absolute, in [A-Za-z0-9_./-]",
            reason="egress-forwarder",
        )
    _check_port(port)
    return [
        "socat",
        "-b65536",  # relay in 64 KiB blocks, not socat's default 8 KiB
        f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,max-children={_FORWARDER_CHILDREN}",
        f"UNIX-CONNECT:{socket_path_inside_jail}",
    ]


def with_forwarder(
    argv: Sequence[str],
    *,
    socket_path_inside_jail: str = JAIL_SOCKET_PATH,
    port: int = FORWARDER_PORT,
) -> list[str]:
    """``argv`` run inside the jail once the forwarder listens, so its first request works.

    The forwarder stays a background child; it ends with the jail's PID namespace.
    """
    forwarder = shlex.join(forwarder_argv(socket_path_inside_jail, port))
    return ["/bin/sh", "-c", _WITH_FORWARDER, "turnkeeper-egress", forwarder, f"{port:04X}", *argv]


def proxy_environment(port: int = FORWARDER_PORT) -> dict[str, str]:
    """The variables that send an agent's HTTP(S) through the forwarder, and nothing around it.

    ``ALL_PROXY`` is ``http://`` too: some clients fail on ``socks`` URLs. ``NO_PROXY`` is
    empty, so even a loopback URL goes through the proxy (the jail's own loopback holds
    nothing; an allowlisted ``127.0.0.1:PORT`` means the host's).
    """
    _check_port(port)
    url = f"http://127.0.0.1:{port}"
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
    return {
        **dict.fromkeys(names, url),
        **{name.lower(): url for name in names},
        "NO_PROXY": "",
        "no_proxy": "",
    }
