"""Building providers from Settings, and which providers are at least as strong as another.

Providers are ranked by what they isolate: ``local`` (nothing) below ``ssh`` (another
host, jailed only where that host has bwrap) below ``bwrap`` (a jail). A worker runs a
run only in its configured provider or a stronger one: a run's payload can never pick a
weaker one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import structlog

from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError, SandboxError
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.cgroup import CgroupTree, Limits
from turnkeeper.sandbox.egress import (
    ensure_proxy,
    jail_bind_args,
    proxy_environment,
    with_forwarder,
)
from turnkeeper.sandbox.jail import Egress
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.provider import SandboxProvider
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool

log = structlog.get_logger(__name__)

PROVIDER_NAMES = ("local", "bwrap", "ssh")
STRENGTH = {"local": 0, "ssh": 1, "bwrap": 2}


def at_least_as_strong(requested: str, configured: str) -> bool:
    """Whether a worker configured with ``configured`` may run a run that names
    ``requested``: never a weaker jail (``local`` < ``ssh`` < ``bwrap``). This is the
    worker's rule, for what trusted callers (the CLI, the Python client) submit, so a
    fleet may mix agents on a sandbox host with agents jailed on the workers. HTTP
    requests meet the catalog's stricter rule first
    (:func:`turnkeeper.agents.catalog.at_least_as_strong`), where ``ssh`` stands only
    for itself: a tenant cannot move its agent off the sandbox host."""
    return STRENGTH.get(requested, -1) >= STRENGTH.get(configured, len(STRENGTH))


def limits_of(settings: Settings) -> Limits:
    return Limits(settings.sandbox_memory, settings.sandbox_cpus, settings.sandbox_pids)


def cgroup_tree() -> CgroupTree | None:
    """This host's cgroup tree for sandboxes; None (rlimits instead) for a worker that is
    not root and was delegated none. A root worker without one is misconfigured."""
    try:
        return CgroupTree.detect()
    except SandboxError as exc:
        if os.geteuid() == 0:
            raise ConfigError(
                f"cannot limit sandboxes: {exc.message}; mount cgroup v2 (or v1 memory, "
                "pids, cpu) read-write, or run the worker as an unprivileged user "
                "(limits are then rlimits)",
                reason="cgroup-unusable",
            ) from exc
        log.warning("sandbox.no_cgroup", error=exc.message, fallback="rlimits")
        return None


def egress_for(settings: Settings, jail_gid: int | None) -> Callable[[], Egress] | None:
    """The proxy binding of each new agent process: the host's proxy for
    ``TURNKEEPER_SANDBOX_EGRESS``, started (again) if it is not running. An empty
    allowlist needs no proxy: the jail then has no way out at all."""
    if not settings.sandbox_egress:
        return None

    def binding() -> Egress:
        socket = ensure_proxy(settings, jail_gid=jail_gid)
        return Egress(
            bind=tuple(jail_bind_args(socket)),
            launcher=tuple(with_forwarder([])),
            environment=proxy_environment(),
        )

    return binding


def provider_for(name: str, settings: Settings, *, ssh: SshTarget | None = None) -> SandboxProvider:
    """The provider called ``name``; local ones live under ``settings.sandboxes_dir``.

    The ``ssh`` provider reaches ``TURNKEEPER_SSH_HOST`` unless a target is passed in.
    """
    if name == "local":
        return LocalProvider(
            settings.sandboxes_dir, limits=limits_of(settings), cgroups=cgroup_tree()
        )
    if name == "bwrap":
        uids = UidPool(*settings.sandbox_uid_range)
        jail_gid = uids.group if os.geteuid() == 0 else None
        return BwrapProvider(
            settings.sandboxes_dir,
            limits=limits_of(settings),
            cgroups=cgroup_tree(),
            ro_binds=settings.ro_bind_paths,
            uids=uids,
            egress=egress_for(settings, jail_gid),
        )
    if name == "ssh":
        if ssh is None and settings.ssh_host:
            ssh = SshTarget(
                host=settings.ssh_host,
                root=settings.ssh_root,
                port=settings.ssh_port,
                user=settings.ssh_user,
                identity_file=settings.ssh_identity_file,
                known_hosts_file=settings.ssh_known_hosts_file,
                python=settings.ssh_python,
            )
        if ssh is None:
            raise ConfigError(
                "the ssh sandbox provider needs TURNKEEPER_SSH_HOST (and usually "
                "TURNKEEPER_SSH_IDENTITY_FILE, TURNKEEPER_SSH_KNOWN_HOSTS_FILE)",
                reason="no-ssh-target",
            )
        return SshProvider(
            ssh,
            ro_binds=settings.ro_bind_paths,
            egress=settings.sandbox_egress,
            limits=limits_of(settings),
        )
    raise ConfigError(f"unknown sandbox provider {name!r}", reason="unknown-provider")
