"""The owner id of a worker process: ``<host_id>:<pid>:<token>``.

It names the process that owns a run (``runs.owner``) and, through the application
names of its sessions, tells the crash watcher whether that process still lives
(docs/architecture.md, "Crash detection"). The pid alone cannot: a container
restarted with a fixed host id starts its processes at the same pids. So each process
adds a random token, and its session names put that token before the host id, so
that the server's 63-byte cut of an application name never reaches it.
"""

from __future__ import annotations

import os
import secrets

APPLICATION_NAME_BYTES = 63
"""What the server keeps of an application name (NAMEDATALEN - 1)."""


def new_owner(host_id: str) -> str:
    """The owner id of this process on ``host_id``, new at every call."""
    return f"{host_id}:{os.getpid()}:{secrets.token_hex(6)}"


def owner_pid(owner: str) -> int:
    """The process id an owner id names (an owner of a version before the token too)."""
    return int(owner.split(":")[1])


def owner_token(owner: str) -> str:
    parts = owner.split(":")
    return parts[2] if len(parts) > 2 else ""


def session_name(prefix: str, owner: str) -> str:
    """The application name of a session of ``owner``: its token first, then the owner,
    cut to what the server keeps (``LIVE_OWNERS`` builds the same name in SQL). An owner
    without a token (a test's, a bench's) is named by itself."""
    token = owner_token(owner)
    return (
        f"{prefix}{token} {owner}"[:APPLICATION_NAME_BYTES]
        if token
        else (f"{prefix}{owner}"[:APPLICATION_NAME_BYTES])
    )
