"""A host uid of its own for every jailed sandbox, claimed from a configured range.

A root worker never runs an agent as root, nor as one shared account: each sandbox
gets a uid of the range (``TURNKEEPER_SANDBOX_UIDS``), so agents of different runs can
never signal, trace or read one another, nor share a per-user limit, even if a
namespace boundary failed. The range's first id is no sandbox's uid but the jails'
group: every agent runs with it, and only that group (and the fleet) may reach the
egress proxy's socket; the proxy itself runs as that id once it listens
(``egress.host.proxy_uid``). Claims are files named by the uid, created exclusively in
a host-wide registry that holds the sandbox's root (so fleets with different sandbox
roots on one host never hand out the same uid), and released when the sandbox is
destroyed; a claim whose sandbox no longer exists is stale and the reaper frees it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from turnkeeper.errors import SandboxError

REGISTRY = Path("/var/lib/turnkeeper/sandbox-uids")


@dataclass(frozen=True, slots=True)
class UidPool:
    first: int
    last: int
    registry: Path = REGISTRY

    @property
    def group(self) -> int:
        return self.first

    def claim(self, owner: Path) -> int:
        """A free uid of the range, now owned by the sandbox at ``owner``."""
        self.registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        size = self.last - self.first
        start = secrets.randbelow(size)  # random, so concurrent claimers rarely collide
        for step in range(size):
            uid = self.first + 1 + (start + step) % size
            try:
                fd = os.open(self.registry / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as claim:
                claim.write(str(owner))
            return uid
        raise SandboxError(
            f"every sandbox uid of {self.first}-{self.last} is in use", reason="no-free-uid"
        )

    def release(self, uid: int, owner: Path) -> None:
        """Free ``uid`` if ``owner`` holds it; idempotent."""
        path = self.registry / str(uid)
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8") == str(owner):
                path.unlink()

    def release_stale(self, root: Path) -> int:
        """Free the claims whose sandbox directory is gone; how many of ``root``'s.

        The registry is the host's: another root's stale claim is its own reaper's to
        free, unless that whole root is gone (a removed fleet reaps nothing), in which
        case any reaper frees it without counting it as its own."""
        freed = 0
        try:
            claims = list(self.registry.iterdir())
        except OSError:
            return 0
        for path in claims:
            try:
                owner = Path(path.read_text(encoding="utf-8"))
            except OSError:
                continue
            if not owner.is_absolute() or owner.exists():
                continue  # a claim still being written, or a live sandbox's
            ours = owner.parent == root
            if not ours and owner.parent.exists():
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                freed += ours
        return freed
