"""Releasing what a test's sandboxes hold on this host outside the test's directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from turnkeeper.config import Settings
from turnkeeper.errors import TurnkeeperError
from turnkeeper.sandbox import SandboxRef, provider_for
from turnkeeper.sandbox.egress import stop_proxies

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def release_sandboxes(settings: Settings) -> None:
    """Destroy every sandbox left under the test's sandboxes root (their processes,
    cgroups and uids), sweep the cgroups of sandboxes a test removed by hand, and stop
    the egress proxies of its data dir."""
    root = settings.sandboxes_dir
    if root.is_dir():
        # bwrap's destroy also gives back a uid; on a sandbox of local it does the same.
        name = "bwrap" if shutil.which("bwrap") else "local"
        try:
            provider = provider_for(name, settings)
        except TurnkeeperError:
            provider = provider_for("local", settings)
        for entry in root.iterdir():
            if entry.is_dir():
                provider.destroy(SandboxRef(provider.name, entry.name, str(entry)))
        provider.sweep()
    if (settings.data_dir / "egress").is_dir():
        stop_proxies(settings.data_dir)
    # A jail on the ssh host has its egress proxy beside that host's sandbox root; the
    # tests' ssh host is this machine, so that proxy is this test's to stop too.
    remote = Path(settings.ssh_root).parent
    if (
        settings.ssh_host in _LOOPBACK
        and remote != settings.data_dir
        and (remote / "egress").is_dir()
    ):
        stop_proxies(remote)
