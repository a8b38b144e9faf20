"""Env values at rest: sealed with AES-GCM so Postgres never holds them in plaintext.

A request's env (model API keys, typically) is sealed once, at submission, into
the run's payload, and opened only by the worker that builds the run's sandbox.
The key is a subkey of the server secret; every sealing takes a fresh random
nonce; the run id is the associated data, so a sealed env copied onto another
run does not open. Beside the ciphertext sits a keyed digest of the plaintext:
a replayed submission (same run id, same request) is recognised by it, since
two sealings of one env never give the same ciphertext.

The sealed value is deleted when the run settles (and, for runs settled before
that, when they are pruned); nothing returns it to a client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from typing import Any

import orjson

from turnkeeper.errors import AgentError
from turnkeeper.secret import ENV_DIGEST, ENV_SEALING, ServerSecret

_VERSION = "v1"
_NONCE_BYTES = 12
_DOMAIN = b"turnkeeper.env.v1\n"

SEALED_PATH = ("env", "sealed")
"""Where the ciphertext sits in a run's payload: the part that is deleted at settlement."""


def _associated(run_id: str) -> bytes:
    return _DOMAIN + run_id.encode("utf-8", "surrogatepass")


class EnvSealer:
    """Seals and opens the env of runs under one server secret."""

    def __init__(self, secret: ServerSecret) -> None:
        # Imported here, as in turnkeeper.secret: only runs with env values need it.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

        self._aead = AESGCM(secret.subkey(ENV_SEALING))
        self._digest_key = secret.subkey(ENV_DIGEST)

    def seal(self, run_id: str, env: Mapping[str, str]) -> dict[str, str]:
        """The payload field for ``env``: ``{"digest": ..., "sealed": ...}``."""
        plaintext = orjson.dumps(dict(env), option=orjson.OPT_SORT_KEYS)
        nonce = os.urandom(_NONCE_BYTES)
        box = self._aead.encrypt(nonce, plaintext, _associated(run_id))
        digest = hmac.new(self._digest_key, _associated(run_id) + plaintext, hashlib.sha256)
        return {
            "digest": digest.hexdigest(),
            "sealed": f"{_VERSION}.{base64.urlsafe_b64encode(nonce + box).decode()}",
        }

    def open(self, run_id: str, field: Any) -> dict[str, str]:
        """The env a payload field holds; AgentError when it is not ours to open."""
        sealed = field.get("sealed") if isinstance(field, Mapping) else None
        if not isinstance(sealed, str):
            raise AgentError(
                "the run's env is no longer stored (the run settled)",
                run_id=run_id,
                reason="env-gone",
            )
        from cryptography.exceptions import InvalidTag  # noqa: PLC0415

        version, _, body = sealed.partition(".")
        try:
            raw = base64.urlsafe_b64decode(body.encode()) if version == _VERSION else b""
            nonce, box = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
            env = orjson.loads(self._aead.decrypt(nonce, box, _associated(run_id)))
        except (ValueError, InvalidTag, orjson.JSONDecodeError) as exc:
            raise AgentError(
                "the run's env cannot be opened: it was sealed under another "
                "TURNKEEPER_SECRET, or altered",
                run_id=run_id,
                reason="env-unreadable",
            ) from exc
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise AgentError("the run's env is malformed", run_id=run_id, reason="env-unreadable")
        return env
