"""Signed, expiring stream tokens: a run's stream URL can be handed to a browser.

A token is ``<expires>.<signature>``: the expiry as Unix seconds and an
HMAC-SHA256 over the run id and that expiry, keyed by a subkey of the server
secret. It grants reading one run's stream until it expires, nothing else, so
the client that holds the API key decides who gets it and the browser needs no
other credential (EventSource cannot send headers).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from turnkeeper.errors import AuthenticationError

_DOMAIN = b"turnkeeper.stream.v1"


class StreamTokens:
    """Issues and checks tokens for one key and lifetime."""

    def __init__(self, key: bytes, ttl: float) -> None:
        if not key:
            raise ValueError("a stream token key cannot be empty")
        if ttl <= 0:
            raise ValueError(f"a stream token lifetime must be positive, got {ttl!r}")
        self._key = key
        self.ttl = ttl

    def _signature(self, run_id: str, expires: int) -> str:
        message = b"\n".join((_DOMAIN, run_id.encode(), str(expires).encode()))
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(self, run_id: str, *, now: float | None = None, ttl: float | None = None) -> str:
        issued = time.time() if now is None else now
        expires = int(issued + (self.ttl if ttl is None else ttl))
        return f"{expires}.{self._signature(run_id, expires)}"

    def verify(self, token: str | None, run_id: str, *, now: float | None = None) -> None:
        """Raise AuthenticationError unless ``token`` is a live token for ``run_id``."""
        if not token:
            raise AuthenticationError(
                "a stream token or an API key is required", run_id=run_id, reason="missing"
            )
        expires_text, sep, signature = token.partition(".")
        well_formed = expires_text.isascii() and expires_text.isdigit() and len(expires_text) <= 12
        if not sep or not well_formed:
            raise AuthenticationError(
                "the stream token is malformed", run_id=run_id, reason="forged"
            )
        expires = int(expires_text)
        expected = self._signature(run_id, expires).encode()
        if not hmac.compare_digest(signature.encode(), expected):
            raise AuthenticationError(
                "the stream token is not valid for this run", run_id=run_id, reason="forged"
            )
        if (time.time() if now is None else now) >= expires:
            raise AuthenticationError("the stream token expired", run_id=run_id, reason="expired")
