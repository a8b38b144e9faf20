"""What the fleet keeps from every agent, and whether a jail's read-only bind would show it.

A jail shows host paths read-only at their own place: the system directories, a few
``/etc`` entries, the operator's ``TURNKEEPER_SANDBOX_RO_BINDS`` and what an agent
brings along (the scripted preset's interpreter and package). Any of them may hold a
path of the fleet's own: a data directory under ``/opt`` or ``/usr/local``, a secret
file under ``/etc/ssl``, an agent's key file in an operator's bind. A worker asks this
module about every bind and every private path before it starts
(``readiness.check_provider``), and refuses to start naming both, rather than show
every agent the journals and workspaces of other runs, the embedded servers' data and
credentials, or the server secret.

Private, and why:

- the data directory: the embedded servers' data and credentials, the egress proxies'
  sockets, logs and pids, the dev stack's secret and state;
- the sandboxes directory (``TURNKEEPER_SANDBOX_ROOT``, else inside the data directory):
  every run's journal, prompt, env file and workspace;
- the server secret's file, the agent catalog (its ``env`` may hold keys), the ssh
  provider's private key, each catalog agent's key files (``env_files``), and a root
  worker's sandbox uid claims (they name every sandbox).

Not private: the interpreter and the package the scripted preset binds (code, no
secrets; a data directory inside them is caught as inside any bind). A jail's own binds
are no exposure either: its workspace, identity files and the egress proxy's socket
directory are the sandbox's own or meant for it.

A path shows another when one lies inside the other, compared as the host resolves them
(symlinks followed: ``/lib`` is ``/usr/lib`` where ``/usr`` is merged, and a data
directory reached through a link is where the link leads). For the ssh provider's
remote host only the paths as written can be compared.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from turnkeeper.config import ENV_PREFIX, Settings
from turnkeeper.sandbox.jail import ETC_ENTRIES, SYSTEM_DIRS
from turnkeeper.sandbox.uids import REGISTRY


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path every jail shows read-only, and where it comes from."""

    path: str
    origin: str


@dataclass(frozen=True, slots=True)
class PrivatePath:
    """A host path of the fleet's that no agent may see, and what it is."""

    path: str
    what: str


@dataclass(frozen=True, slots=True)
class AgentPaths:
    """What the agents a worker may run add: their own binds, their key files."""

    binds: tuple[Bind, ...] = ()
    private: tuple[PrivatePath, ...] = ()


NO_AGENT_PATHS = AgentPaths()


def jail_binds(settings: Settings) -> list[Bind]:
    """The binds of every jail whatever its agent: the system directories, the ``/etc``
    entries and the operator's (``jail.jail_argv``)."""
    binds = [Bind(path, "a system directory") for path in SYSTEM_DIRS]
    binds += [Bind(f"/etc/{name}", "an /etc entry") for name in ETC_ENTRIES]
    binds += [Bind(path, f"{ENV_PREFIX}SANDBOX_RO_BINDS") for path in settings.ro_bind_paths]
    return binds


def fleet_paths(settings: Settings) -> list[PrivatePath]:
    """This host's private paths that the settings name (see the module's docstring)."""
    private = [
        PrivatePath(str(settings.data_dir), f"the data directory ({ENV_PREFIX}DATA_DIR)"),
        PrivatePath(
            str(settings.sandboxes_dir), f"the sandboxes directory ({ENV_PREFIX}SANDBOX_ROOT)"
        ),
    ]
    named = (
        (settings.secret_file, f"the server secret ({ENV_PREFIX}SECRET_FILE)"),
        (settings.agents_file, f"the agent catalog ({ENV_PREFIX}AGENTS_FILE)"),
        (settings.ssh_identity_file, f"the ssh key ({ENV_PREFIX}SSH_IDENTITY_FILE)"),
    )
    private += [PrivatePath(str(path), what) for path, what in named if path is not None]
    if os.geteuid() == 0:  # only a root worker claims uids
        private.append(PrivatePath(str(REGISTRY), "the sandbox uid claims"))
    return private


def remote_paths(settings: Settings) -> list[PrivatePath]:
    """The ssh provider's host's private paths: its sandboxes and the data directory
    above them, where its egress proxy lives."""
    root = PurePosixPath(settings.ssh_root)
    return [
        PrivatePath(str(root), f"the remote sandboxes ({ENV_PREFIX}SSH_ROOT)"),
        PrivatePath(str(root.parent), f"the remote data directory (above {ENV_PREFIX}SSH_ROOT)"),
    ]


def exposures(
    binds: Iterable[Bind], private: Iterable[PrivatePath], *, resolve: bool = True
) -> list[str]:
    """One line for each bind that would show a private path, saying how to fix it;
    ``resolve``: compare the paths as this host resolves them."""
    shown = [(path, _real(path.path, resolve)) for path in private]
    problems = []
    for bind in binds:
        bound = _real(bind.path, resolve)
        for path, real in shown:
            where = _shown(path.path, real)
            if real.is_relative_to(bound):
                problems.append(
                    f"every jail shows {bind.path} ({bind.origin}) and so {path.what}, "
                    f"{where}: move it out of {bind.path}"
                )
            elif bound.is_relative_to(real):
                problems.append(
                    f"every jail shows {bind.path} ({bind.origin}), which is inside "
                    f"{path.what}, {where}: keep the two apart"
                )
    return problems


def _real(path: str, resolve: bool) -> PurePosixPath:
    if not resolve:
        return PurePosixPath(os.path.normpath(path))
    return PurePosixPath(Path(path).resolve())


def _shown(path: str, real: PurePosixPath) -> str:
    absolute = os.path.normpath(Path.cwd() / path)  # as written, made absolute, no link followed
    return absolute if absolute == str(real) else f"{absolute} (really {real})"
