"""A file that ``rm -f`` cannot remove for a while, and is back as it was afterwards."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def unremovable(path: Path) -> Iterator[None]:
    """While inside, ``rm -f path`` fails (exit 1) and something stays at ``path``.

    The immutable attribute where this user may set it and the filesystem keeps it
    (root on ext4, xfs, btrfs): the file itself stays. Elsewhere a non-empty directory
    stands in its place, which ``rm -f`` refuses as well, while the file waits beside
    it. Either way the file is back, bytes and mode, when the block ends."""
    if _chattr("+i", path):
        try:
            yield
        finally:
            assert _chattr("-i", path), f"cannot clear the immutable attribute of {path}"
        return
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    path.mkdir()
    (path / "keep").touch()
    try:
        yield
    finally:
        (path / "keep").unlink()
        path.rmdir()
        aside.rename(path)


def _chattr(flag: str, path: Path) -> bool:
    try:
        done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    except FileNotFoundError:  # no e2fsprogs
        return False
    return done.returncode == 0
