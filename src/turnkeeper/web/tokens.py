"""Signed, expiring stream tokens: a run's stream URL can be handed to a browser.

A token is ``<expires>.<signature>``: the expiry as Unix seconds and an
HMAC-SHA256 over the run id and that expiry, keyed by the server secret. It
grants reading one run's stream until it expires, nothing else, so the web app
that owns the user session decides who gets it and the browser needs no other
credential (EventSource cannot send headers).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

import structlog

from turnkeeper.config import Settings
from turnkeeper.errors import AccessDeniedError

log = structlog.get_logger(__name__)

_DOMAIN = b"turnkeeper.stream.v1"


def server_secret(settings: Settings) -> bytes:
    """The configured secret, or a random one for this process (tokens die with it)."""
    if settings.secret is not None and settings.secret.get_secret_value():
        return settings.secret.get_secret_value().encode()
    log.warning(
        "web.secret.generated",
        detail="TURNKEEPER_SECRET is unset: stream tokens are signed with a random secret "
        "of this process and stop working when it restarts or on another web process",
    )
    return secrets.token_bytes(32)


class StreamTokens:
    """Issues and checks tokens for one secret and lifetime."""

    def __init__(self, secret: bytes, ttl: float) -> None:
        if not secret:
            raise ValueError("a stream token secret cannot be empty")
        if ttl <= 0:
            raise ValueError(f"a stream token lifetime must be positive, got {ttl!r}")
        self._secret = secret
        self.ttl = ttl

    def _signature(self, run_id: str, expires: int) -> str:
        message = b"\n".join((_DOMAIN, run_id.encode(), str(expires).encode()))
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(self, run_id: str, *, now: float | None = None, ttl: float | None = None) -> str:
        issued = time.time() if now is None else now
        expires = int(issued + (self.ttl if ttl is None else ttl))
        return f"{expires}.{self._signature(run_id, expires)}"

    def verify(self, token: str | None, run_id: str, *, now: float | None = None) -> None:
        """Raise AccessDeniedError unless ``token`` is a live token for ``run_id``."""
        if not token:
            raise AccessDeniedError("a stream token is required", run_id=run_id, reason="missing")
        expires_text, sep, signature = token.partition(".")
        if not sep or not expires_text.isdigit() or len(expires_text) > 12:
            raise AccessDeniedError("the stream token is malformed", run_id=run_id, reason="forged")
        expires = int(expires_text)
        expected = self._signature(run_id, expires).encode()
        if not hmac.compare_digest(signature.encode(), expected):
            raise AccessDeniedError(
                "the stream token is not valid for this run", run_id=run_id, reason="forged"
            )
        if (time.time() if now is None else now) >= expires:
            raise AccessDeniedError("the stream token expired", run_id=run_id, reason="expired")
