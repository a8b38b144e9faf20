"""Who is calling: the API key behind ``Authorization: Bearer``, and what it may see.

A run and its session belong to the key that created them. Another key is told
that they do not exist (404, never 403), and never sees them in a list; an admin
key sees everything. The key is looked up on every request, so a revoked key is
refused at once by every web process.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from turnkeeper.errors import (
    AuthenticationError,
    AuthorizationHeaderError,
    NotPermittedError,
    RunNotFoundError,
)
from turnkeeper.store.keys import is_key_format
from turnkeeper.store.records import ApiKey, Run
from turnkeeper.store.store import Store


@dataclass(frozen=True)
class Principal:
    """The key a request came with."""

    name: str
    admin: bool
    allow_commands: bool
    max_running: int | None

    @classmethod
    def of(cls, key: ApiKey) -> Principal:
        return cls(key.name, key.admin, key.allow_commands, key.max_running)

    def sees(self, key_name: str | None) -> bool:
        """Whether a run or session of ``key_name`` (None: a trusted client's) is visible."""
        return self.admin or key_name == self.name

    @property
    def tenant_filter(self) -> str | None:
        """The key to filter lists by: none for an admin."""
        return None if self.admin else self.name

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise NotPermittedError(f"{what} needs an admin key", reason="admin-only")


def bearer_key(request: Request) -> str | None:
    """The key of ``Authorization: Bearer KEY``, or None without one."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthorizationHeaderError(
            "the Authorization header must be `Bearer KEY`", reason="malformed-key"
        )
    return key.strip()


async def authenticate(request: Request) -> Principal:
    """The FastAPI dependency of every keyed route: 401 without a live key."""
    key = bearer_key(request)
    if key is None:
        raise AuthenticationError(
            "an API key is required: send `Authorization: Bearer KEY`", reason="missing-key"
        )
    if not is_key_format(key):
        raise AuthenticationError(
            "the API key is malformed: a key is `tk_` and 43 letters, digits, `-` or `_`, "
            "as `turnkeeper keys create` prints it",
            reason="malformed-key",
        )
    store: Store = request.app.state.web.client.store
    found = await run_in_threadpool(store.authenticate_key, key)
    if found is None:
        raise AuthenticationError("the API key is unknown or revoked", reason="invalid-key")
    return Principal.of(found)


async def authorize_stream(
    request: Request, run_id: str, token: str | None
) -> tuple[Run, Principal | None]:
    """The run a stream of ``run_id`` reads, and the key that opens it (None for a token).

    A stream opens with a key that may see the run (404 otherwise, as for no run), or
    with the run's stream token, which grants nothing once its key is revoked.
    """
    state = request.app.state.web
    if bearer_key(request) is not None:
        principal = await authenticate(request)
        found = await run_in_threadpool(state.client.get, run_id)
        return require_visible(principal, found, run_id), principal
    state.tokens.verify(token, run_id)
    run: Run = await run_in_threadpool(state.client.require, run_id)
    # A token outlives nothing: revoking its key cuts off the stream URLs it got.
    owner = run.key_name
    if owner is not None and not await run_in_threadpool(state.client.store.key_is_live, owner):
        raise AuthenticationError(
            "the key this stream token was issued to is revoked",
            run_id=run_id,
            reason="revoked-key",
        )
    return run, None


def require_visible(principal: Principal, run: Run | None, run_id: str) -> Run:
    """The run, when it exists and the principal may see it; else the same 404 either way."""
    if run is None or not principal.sees(run.key_name):
        raise RunNotFoundError(f"no run has the id {run_id!r}", run_id=run_id)
    return run
