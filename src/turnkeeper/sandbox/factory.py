"""Building providers from Settings, and finding the provider of a stored reference."""

from __future__ import annotations

from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.provider import SandboxProvider
from turnkeeper.sandbox.ssh import SshProvider, SshTarget

PROVIDER_NAMES = ("local", "bwrap", "ssh")


def provider_for(name: str, settings: Settings, *, ssh: SshTarget | None = None) -> SandboxProvider:
    """The provider called ``name``; local ones live under ``settings.sandboxes_dir``.

    The ``ssh`` provider reaches ``TURNKEEPER_SSH_HOST`` unless a target is passed in.
    """
    if name == "local":
        return LocalProvider(settings.sandboxes_dir)
    if name == "bwrap":
        return BwrapProvider(settings.sandboxes_dir)
    if name == "ssh":
        if ssh is None and settings.ssh_host:
            ssh = SshTarget(
                host=settings.ssh_host,
                root=settings.ssh_root,
                port=settings.ssh_port,
                user=settings.ssh_user,
                identity_file=settings.ssh_identity_file,
                known_hosts_file=settings.ssh_known_hosts_file,
            )
        if ssh is None:
            raise ConfigError(
                "the ssh sandbox provider needs TURNKEEPER_SSH_HOST (and usually "
                "TURNKEEPER_SSH_IDENTITY_FILE, TURNKEEPER_SSH_KNOWN_HOSTS_FILE)",
                reason="no-ssh-target",
            )
        return SshProvider(ssh)
    raise ConfigError(f"unknown sandbox provider {name!r}", reason="unknown-provider")
