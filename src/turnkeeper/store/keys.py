"""API keys: created with 256 random bits, stored as a SHA-256 hash, revoked for good.

A key carries 256 bits of entropy, so a plain SHA-256 of it is as hard to invert
as the key is to guess: no slow hash and no secret is needed, and keys survive a
rotation of the server secret. Every request looks its key up (one indexed
read), so a revoke takes effect on the next request of every web process; the
last use is written at most once a minute per key.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Collection

from turnkeeper.errors import ApiKeyError, InvalidInputError
from turnkeeper.logconfig import get_logger
from turnkeeper.store import sql
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import ApiKey, check_key_name

log = get_logger(__name__)

KEY_PREFIX = "tk_"
KEY_FORMAT = re.compile(r"tk_[A-Za-z0-9_-]{43}")
"""What ``create_key`` makes: the prefix and 32 random bytes in URL-safe base64."""
_TOUCH_EVERY = 60.0


def is_key_format(key: str) -> bool:
    """Whether ``key`` could be a key at all: anything else is malformed, not unknown."""
    return KEY_FORMAT.fullmatch(key) is not None


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class KeysMixin(StoreBase):
    """Create, authenticate, list and revoke API keys."""

    def create_key(
        self,
        name: str,
        *,
        admin: bool = False,
        allow_commands: bool = False,
        max_running: int | None = None,
    ) -> str:
        """A new key under ``name``; the key itself is returned once and never stored."""
        check_key_name(name)
        if max_running is not None and (
            isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1
        ):
            raise InvalidInputError(f"max_running must be a positive integer: {max_running!r}")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        params = {
            "name": name,
            "key_hash": hash_key(key),
            "admin": admin,
            "allow_commands": allow_commands,
            "max_running": max_running,
        }
        if self._db.one("create_key", sql.keys.INSERT_KEY, params) is None:
            raise ApiKeyError(
                f"a key named {name!r} exists or existed; names are never reused",
                reason="key-name-taken",
            )
        log.info("key.created", key_name=name, admin=admin, allow_commands=allow_commands)
        return key

    def authenticate_key(self, key: str) -> ApiKey | None:
        """The live key ``key`` is, or None (unknown or revoked)."""
        if not is_key_format(key):
            return None
        params = {"key_hash": hash_key(key), "touch_every": _TOUCH_EVERY}
        row = self._db.one("authenticate_key", sql.keys.AUTHENTICATE_KEY, params)
        return None if row is None else ApiKey.from_row(row)

    def list_keys(self) -> list[ApiKey]:
        return [ApiKey.from_row(r) for r in self._db.rows("list_keys", sql.keys.LIST_KEYS, {})]

    def revoke_key(self, name: str) -> ApiKey:
        """Revoke for good (idempotent); ApiKeyError for an unknown name."""
        check_key_name(name)
        row = self._db.one("revoke_key", sql.keys.REVOKE_KEY, {"name": name})
        if row is None:
            raise ApiKeyError(f"no key is named {name!r}", reason="unknown-key")
        log.info("key.revoked", key_name=name)
        return ApiKey.from_row(row)

    def key_is_live(self, name: str) -> bool:
        """Whether the key named ``name`` exists and is not revoked."""
        row = self._db.one("key_is_live", sql.keys.KEY_IS_LIVE, {"name": check_key_name(name)})
        return bool(row and row["exists"])

    def revoked_among(self, names: Collection[str]) -> set[str]:
        """Which of the keys named ``names`` are revoked (one query, whatever their number)."""
        rows = self._db.rows("revoked_among", sql.keys.REVOKED_AMONG, {"names": sorted(names)})
        return {str(row["name"]) for row in rows}

    def active_key_count(self) -> int:
        row = self._db.one("active_keys", sql.keys.ACTIVE_KEYS, {})
        return int(row["count"]) if row is not None else 0

    def session_tenant(self, session_id: str) -> tuple[bool, str | None]:
        """``(exists, key_name)`` of a session."""
        row = self._db.one(
            "session_tenant", sql.sessions.SESSION_TENANT, {"session_id": session_id}
        )
        return (False, None) if row is None else (True, row["key_name"])
