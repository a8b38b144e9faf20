"""Egress for sandboxed agents: an allowlisting HTTP proxy on a unix socket, per host.

The interface a jail uses:

- ``ensure_proxy(settings, jail_gid=None) -> Path``: the host path of the proxy socket
  for ``settings.sandbox_egress``, with the daemon started if it was not running;
- ``jail_bind_args(socket_path)``: bwrap arguments binding its directory at
  ``JAIL_SOCKET_DIR``, so the socket is ``JAIL_SOCKET_PATH`` inside the jail;
- ``forwarder_argv()`` / ``with_forwarder(argv)``: socat relaying
  ``127.0.0.1:FORWARDER_PORT`` inside the jail to that socket;
- ``proxy_environment()``: the ``*_PROXY`` variables for the agent.

See docs/architecture.md, "Egress".
"""

from __future__ import annotations

from turnkeeper.sandbox.egress.host import (
    SOCKET_NAME,
    ProxyPaths,
    answers,
    ensure_proxy,
    lock_holder,
    proxy_paths,
)
from turnkeeper.sandbox.egress.jail import (
    FORWARDER_PORT,
    JAIL_SOCKET_DIR,
    JAIL_SOCKET_PATH,
    forwarder_argv,
    jail_bind_args,
    proxy_environment,
    with_forwarder,
)

__all__ = [
    "FORWARDER_PORT",
    "JAIL_SOCKET_DIR",
    "JAIL_SOCKET_PATH",
    "SOCKET_NAME",
    "ProxyPaths",
    "answers",
    "ensure_proxy",
    "forwarder_argv",
    "jail_bind_args",
    "lock_holder",
    "proxy_environment",
    "proxy_paths",
    "with_forwarder",
]
