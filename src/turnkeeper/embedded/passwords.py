"""The embedded servers' passwords: one file each in the data directory, 0600.

Any local user can reach a loopback port, so a server without a password is everyone's:
PostgreSQL's superuser runs programs (``COPY ... TO PROGRAM``) and Redis holds every
tenant's output. Each server gets a random password the first time it starts; the
processes of the fleet's uid read it from its file to build their URLs, and no one else
can. A password never goes on a command line.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from turnkeeper.errors import EmbeddedStackError

_BYTES = 32


def read_password(path: Path) -> str | None:
    """The password kept in ``path``, or None when there is none yet."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise EmbeddedStackError(f"cannot read {path}: {exc}", reason="password-file") from exc
    return text or None


def ensure_password(path: Path) -> tuple[str, bool]:
    """The password kept in ``path``, made now if there is none; and whether it was made
    now (so the server must be given it). Starters racing on one file agree on one
    password: it is written whole to a file of its own, then linked into place, which
    only the first one does."""
    kept = read_password(path)
    if kept is not None:
        return kept, False
    password = secrets.token_hex(_BYTES)  # hex: safe in a URL, a config line and SQL
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(f"{password}\n")
        os.link(draft, path)
    except FileExistsError:
        return ensure_password(path)  # another starter's is in place: that one holds
    except OSError as exc:
        raise EmbeddedStackError(f"cannot write {path}: {exc}", reason="password-file") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            draft.unlink()
    return password, True


def keep_private(path: Path, mode: int = 0o600) -> None:
    """``path`` readable by its owner alone (files of data dirs made before this was
    taken care of were 0644); nothing when it does not exist."""
    with contextlib.suppress(FileNotFoundError):
        path.chmod(mode)
