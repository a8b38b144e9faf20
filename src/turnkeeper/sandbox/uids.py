"""A host uid of its own for every jailed sandbox, claimed from a configured range.

A root worker never runs an agent as root, nor as one shared account: each sandbox
gets a uid of the range (``TURNKEEPER_SANDBOX_UIDS``), so agents of different runs can
never signal, trace or read one another, nor share a per-user limit, even if a
namespace boundary failed. The range's first id is not a uid but the jails' group:
every agent runs with it, and only that group (and the fleet) may reach the egress
proxy's socket. Claims are files named by the uid, created exclusively in
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

    def release_stale(self) -> int:
        """Free the claims whose sandbox directory is gone; how many were freed."""
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
            if owner.is_absolute() and not owner.exists():
                with contextlib.suppress(OSError):
                    path.unlink()
                    freed += 1
        return freed
