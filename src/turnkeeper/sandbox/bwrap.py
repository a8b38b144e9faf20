"""The ``bwrap`` provider: the local layout, every command jailed by bubblewrap.

The jail sees the host root read-only, a private ``/tmp``, its own PID, IPC and UTS
namespaces and no network unless the spec allows it. Only the workspace and the
journal directory are writable, bound at their host paths so the host reads the
same journal files the jail writes. No ``--die-with-parent``: a detached agent must
outlive the worker that started it; killing the process group of a spawned command
still ends its jail, because the jail's init is in that group.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from turnkeeper.errors import SandboxError
from turnkeeper.sandbox.local import LocalProvider, ProcessSandbox
from turnkeeper.sandbox.provider import Capabilities

BWRAP = "bwrap"


def bwrap_binary() -> str | None:
    """The bubblewrap executable on PATH, or None (Debian package ``bubblewrap``)."""
    return shutil.which(BWRAP)


class BwrapSandbox(ProcessSandbox):
    provider_capabilities = Capabilities(
        background_processes=True,
        killable_processes=True,
        durable_filesystem=True,
        network_isolation=True,
        resource_limits=True,
    )

    def wrap(self, argv: Sequence[str]) -> list[str]:
        ref = self.ref
        jail = [
            BWRAP,
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",  # noqa: S108 - a private, empty /tmp inside the jail
            "--bind", ref.workspace, ref.workspace,
            "--bind", ref.journal_dir, ref.journal_dir,
            "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--chdir", ref.workspace,
        ]  # fmt: skip
        if not ref.spec.network:
            jail.append("--unshare-net")
        return [*jail, "--", *argv]


class BwrapProvider(LocalProvider):
    name = "bwrap"
    sandbox_class = BwrapSandbox

    def __init__(self, root: Path) -> None:
        if bwrap_binary() is None:
            raise SandboxError("bubblewrap (bwrap) is not installed", reason="bwrap-missing")
        super().__init__(root)
