"""Can this host run agents in the configured provider? Asked once, as a worker starts.

Not a look at the configuration but a real start: a sandbox is created, a trivial agent
runs in it journaled, exactly as a run's would (writer, jail, cgroup, uid), and its
sentinel must come back with exit code 0. A worker that cannot do that refuses to start
with one line saying how to fix it, rather than fail every run it takes. Before that, no
bind of a jail may show agents a path of the fleet's own (``exposure.py``).
"""

from __future__ import annotations

import contextlib
import threading

import structlog

from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError, TurnkeeperError
from turnkeeper.sandbox.bwrap import bwrap_binary
from turnkeeper.sandbox.exposure import (
    NO_AGENT_PATHS,
    AgentPaths,
    exposures,
    fleet_paths,
    jail_binds,
    remote_paths,
)
from turnkeeper.sandbox.factory import provider_for
from turnkeeper.sandbox.provider import SandboxProvider, SandboxRef, SandboxSpec
from turnkeeper.sandbox.reader import JournalReader, StopSignal
from turnkeeper.sandbox.runner import spawn_journaled, stderr_tail

log = structlog.get_logger(__name__)

CHECK_RUN = "turnkeeper-readiness"
CHECK_TIMEOUT = 60.0  # a hang guard: a healthy host answers in well under a second
_USERNS_HINT = (
    "enable unprivileged user namespaces (sysctl user.max_user_namespaces, "
    "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
    "kernel.apparmor_restrict_unprivileged_userns=0) or run the worker as root"
)
_HINTS = (
    ("namespace", _USERNS_HINT),
    ("setpriv", "install util-linux (setpriv, prlimit, flock)"),
    ("cgroup", "give the worker a writable cgroup hierarchy (memory, pids, cpu)"),
)
NOT_ISOLATED = (
    "the local sandbox provider is no security boundary: agents run as host processes of "
    "the worker's user and can read its environment, files and other runs "
    "(set TURNKEEPER_SANDBOX_PROVIDER=bwrap)"
)


def check_provider(settings: Settings, agents: AgentPaths = NO_AGENT_PATHS) -> None:
    """Start a trivial agent in the configured provider; ConfigError says how to fix it.

    ``agents``: the binds and key files of the agents the worker may run
    (``agents.readiness.agent_paths``), checked with the jail's own binds.
    """
    name = settings.sandbox_provider
    check_binds(settings, agents)
    if name == "bwrap" and bwrap_binary() is None:
        raise ConfigError(
            "bubblewrap is not installed: install it (Debian: apt-get install bubblewrap) or "
            "set TURNKEEPER_SANDBOX_PROVIDER=local, which is no security boundary",
            reason="bwrap-missing",
        )
    try:
        provider = provider_for(name, settings)
        ref = provider.create(CHECK_RUN, SandboxSpec())
    except TurnkeeperError as exc:
        raise ConfigError(
            f"the {name} sandbox cannot be created: {exc.message}", reason="sandbox-unusable"
        ) from exc
    try:
        failure = _trivial_agent(provider, ref)
    except TurnkeeperError as exc:
        failure = f"a trivial agent could not run: {exc.message}"
    finally:
        with contextlib.suppress(TurnkeeperError):
            provider.destroy(ref)
    if failure is not None:
        raise ConfigError(_with_hint(failure), reason="jail-failed")
    if name == "local":
        log.warning("sandbox.not_isolated", provider=name, detail=NOT_ISOLATED)
    log.info("sandbox.ready", provider=name)


def check_binds(settings: Settings, agents: AgentPaths = NO_AGENT_PATHS) -> None:
    """Refuse jails any of whose binds would show agents a path of the fleet's own.

    A run may ask for a stronger provider than the worker's (``factory.STRENGTH``), so
    each worker checks the jails its runs may get: this host's ``bwrap`` jails (for an
    ``ssh`` worker, where bwrap is installed), and for ``ssh`` the remote host's, as
    written. A ``local`` worker is no boundary itself: it only warns, for runs that
    would ask it for ``bwrap``.
    """
    binds = [*jail_binds(settings), *agents.binds]
    here = exposures(binds, [*fleet_paths(settings), *agents.private])
    provider = settings.sandbox_provider
    if provider == "local":
        if here:
            log.warning("sandbox.binds_show_the_fleet", detail="; ".join(here), provider=provider)
        return
    problems = here if provider == "bwrap" or bwrap_binary() is not None else []
    if provider == "ssh":
        problems = [*exposures(binds, remote_paths(settings), resolve=False), *problems]
    if problems:
        raise ConfigError("; ".join(problems), reason="bind-exposes-fleet")


def _trivial_agent(provider: SandboxProvider, ref: SandboxRef) -> str | None:
    """None when ``exit 0`` ran journaled in the sandbox; else what went wrong."""
    sandbox = provider.resume(ref)
    if sandbox is None:
        return "the sandbox vanished as soon as it was created"
    handle = spawn_journaled(sandbox, CHECK_RUN, "exit 0")
    with StopSignal() as stop:
        guard = threading.Timer(CHECK_TIMEOUT, stop.set)
        guard.start()
        try:
            reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce, stop=stop)
            for _ in reader:
                pass
        finally:
            guard.cancel()
    if reader.exit_code == 0:
        return None
    stderr = stderr_tail(sandbox, handle.paths).decode("utf-8", "replace").strip()
    detail = stderr.splitlines()[-1] if stderr else f"exit code {reader.exit_code}"
    return f"a trivial agent failed: {detail}"


def _with_hint(message: str) -> str:
    for needle, hint in _HINTS:
        if needle in message.lower():
            return f"{message}; fix: {hint}"
    return message
