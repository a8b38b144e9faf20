"""The server secret and the keys derived from it.

One secret (``TURNKEEPER_SECRET``, or the file ``TURNKEEPER_SECRET_FILE`` names)
is shared by the fleet. Nothing uses it directly: every keyed value takes its own
subkey, derived with HKDF-SHA256 under a distinct label, so a key that leaks from
one use (a stream token's MAC key, say) says nothing about another (the key that
seals env values at rest).

``turnkeeper dev`` and ``turnkeeper demo`` generate a secret into the data
directory (mode 0600) and hand its path to every process they start. Workers,
beat and the web app started on their own refuse to start without one: a
random per-process secret would make stream tokens and sealed env values
unreadable by the next process.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import sys
from pathlib import Path

from turnkeeper.config import ENV_PREFIX, MIN_SECRET_BYTES, Settings
from turnkeeper.errors import ConfigError
from turnkeeper.logconfig import get_logger

log = get_logger(__name__)

# One label per use of the secret; a new use gets a new label, never a shared one.
STREAM_TOKENS = "turnkeeper/stream-tokens/v1"
ENV_SEALING = "turnkeeper/env-sealing/v1"
ENV_DIGEST = "turnkeeper/env-digest/v1"

DEV_SECRET_FILE = "secret"  # noqa: S105 - a file name under the data directory
_PR_SET_DUMPABLE = 4


class ServerSecret:
    """The fleet's secret; hands out subkeys, never itself."""

    def __init__(self, material: bytes) -> None:
        if len(material) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"{ENV_PREFIX}SECRET must be at least {MIN_SECRET_BYTES} bytes, "
                f"got {len(material)}",
                reason="secret-too-short",
            )
        self._material = material

    def __repr__(self) -> str:
        return "ServerSecret(<hidden>)"

    def subkey(self, label: str, length: int = 32) -> bytes:
        """The key for one use (``label``), independent of every other label's."""
        # Imported here: every command imports this module, few derive a key.
        from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # noqa: PLC0415

        hkdf = HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=label.encode())
        return hkdf.derive(self._material)

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerSecret | None:
        """The configured secret (the value, else the file), or None."""
        if settings.secret is not None:
            return cls(settings.secret.get_secret_value().encode())
        if settings.secret_file is not None:
            return cls(_read_secret_file(settings.secret_file))
        return None

    @classmethod
    def require(cls, settings: Settings, needed_for: str) -> ServerSecret:
        """The secret, or a ConfigError naming the settings that provide one."""
        secret = cls.from_settings(settings)
        if secret is None:
            raise ConfigError(
                f"{ENV_PREFIX}SECRET (at least {MIN_SECRET_BYTES} bytes) or "
                f"{ENV_PREFIX}SECRET_FILE must be set {needed_for}; generate one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe(48))'`",
                reason="no-secret",
            )
        return secret


def _read_secret_file(path: Path) -> bytes:
    try:
        material = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(
            f"{ENV_PREFIX}SECRET_FILE: cannot read {path}: {exc.strerror}", reason="secret-file"
        ) from exc
    if len(material) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{ENV_PREFIX}SECRET_FILE: {path} holds {len(material)} bytes, "
            f"at least {MIN_SECRET_BYTES} are needed",
            reason="secret-too-short",
        )
    return material


def dev_secret_file(data_dir: Path) -> Path:
    """Where ``dev`` and ``demo`` keep the secret they generate."""
    return data_dir / DEV_SECRET_FILE


def ensure_dev_secret(data_dir: Path) -> Path:
    """The data directory's secret file, created (0600, random) when missing; its path."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = dev_secret_file(data_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(48) + "\n")
    log.info("secret.generated", path=str(path))
    return path


def make_undumpable() -> None:
    """Forbid core dumps and ptrace-style reads of this process's memory by its peers
    (``PR_SET_DUMPABLE`` 0): the secret and decrypted env values live in it. Linux
    only; a no-op elsewhere. Children inherit it across fork, not across exec."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("secret.undumpable_failed", errno=ctypes.get_errno())
