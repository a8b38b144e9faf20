"""What a proxy request asks to reach, and whether the egress allowlist permits it.

The host is compared exactly as the client spelled it (lowercased, one trailing dot
stripped) with the canonical entries of ``config.parse_egress_allowlist``: nothing is
resolved or converted, so ``localhost``, ``127.1``, ``0x7f.1``, ``2130706433`` or
``[::1]`` never stand in for an allowed ``127.0.0.1``. Pure functions, no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from turnkeeper.errors import EgressRefusedError

BLOCKED = "blocked-by-allowlist"
MALFORMED = "malformed-request"
_MAX_LOGGED_HOST = 200


@dataclass(frozen=True)
class Destination:
    """A host and port as requested, and the origin-form path of a forwarded request."""

    host: str
    port: int
    path: str = ""

    @property
    def host_header(self) -> str:
        return self.host if self.port == 80 else f"{self.host}:{self.port}"

    @property
    def is_address(self) -> bool:
        """True for an IP literal, which is dialled as it is, without any lookup."""
        return self.host.startswith("[") or self.host.replace(".", "").isdigit()


def printable(host: str) -> str:
    """A requested host as it may appear in a log line or a reply: escaped and bounded."""
    return host.encode("unicode_escape").decode("ascii")[:_MAX_LOGGED_HOST]


def blocked(reason: str, host: str, port: int | None = None) -> EgressRefusedError:
    shown = printable(host)
    where = shown if port is None else f"{shown}:{port}"
    return EgressRefusedError(
        403, reason, f"egress to {where} is not allowed", host=shown, port=port
    )


def malformed(message: str) -> EgressRefusedError:
    return EgressRefusedError(400, MALFORMED, message)


def has_control_characters(text: bytes | str) -> bool:
    data = text.encode("latin-1", "replace") if isinstance(text, str) else text
    return any(byte < 0x20 or byte == 0x7F for byte in data)


def _host(raw: str, port: int) -> str:
    if "@" in raw:  # logged without the credentials before the "@"
        raise blocked("userinfo", raw.rpartition("@")[2], port)
    if has_control_characters(raw):
        raise blocked("control-characters", raw, port)
    if not raw.isascii():
        raise blocked("not-ascii", raw, port)
    return raw.lower().removesuffix(".")


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise malformed("the port must be a number from 1 to 65535")
    return int(text)


def _authority(authority: str, default_port: int | None) -> tuple[str, int]:
    if authority.startswith("[") and "]" in authority:
        host, _, rest = authority.partition("]")
        host += "]"
        if rest and not rest.startswith(":"):
            raise malformed("unexpected text after the IPv6 address")
        port_text = rest[1:]
    else:
        host, colon, port_text = authority.rpartition(":")
        if not colon:
            host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise malformed("CONNECT needs host:port")
        port = default_port
    else:
        port = _port(port_text)
    if not host:
        raise malformed("the request names no host")
    return _host(host, port), port


def connect_destination(target: bytes) -> Destination:
    """The destination of ``CONNECT host:port``."""
    host, port = _authority(target.decode("latin-1"), default_port=None)
    return Destination(host, port)


def forward_destination(target: bytes) -> Destination:
    """The destination of an absolute-form request, ``http://host[:port]/path?query``."""
    text = target.decode("latin-1")
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise malformed("a proxy request needs an absolute http:// URL or CONNECT")
    if scheme.lower() != "http":
        raise malformed(f"only http:// URLs are forwarded (use CONNECT for {printable(scheme)})")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:].partition("#")[0]
    host, port = _authority(authority, default_port=80)
    if not path.startswith("/"):
        path = "/" + path
    return Destination(host, port, path)


class Allowlist:
    """The ``host:port`` pairs the proxy may dial, from canonical allowlist entries."""

    def __init__(self, entries: Iterable[str]) -> None:
        pairs = (entry.rpartition(":") for entry in entries)
        self.pairs = frozenset((host, int(port)) for host, _, port in pairs)

    def check(self, destination: Destination) -> None:
        if (destination.host, destination.port) not in self.pairs:
            raise blocked("not-allowlisted", destination.host, destination.port)


def reachable_by_name(address: str) -> bool:
    """False for addresses an allowlisted *name* must never lead to.

    Only an explicit ``127.0.0.1:PORT`` entry reaches the host's loopback; a name that
    resolves to a loopback, link-local (cloud metadata), unspecified or multicast address
    is refused, so a changed DNS record cannot turn an allowed name into the host itself.
    """
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)
