"""The ``Store``: the primitives that decide who owns a run and how far its turns got.

One class, assembled from one part per area (admission, ownership, turn slots and
segments, transcript, maintenance, API keys, hosts, session workspaces, the fleet page) that share
the pooled ``Database``.
Every owner write is fenced by the attempt id in the statement itself; a refusal
is a ``False`` or ``None``, never an exception. Database trouble becomes a
``StoreUnavailableError`` (retryable); any other driver failure a ``StoreError``.
"""

from __future__ import annotations

from turnkeeper.errors import InvalidInputError
from turnkeeper.store.admission import AdmissionMixin
from turnkeeper.store.database import Database
from turnkeeper.store.fleet import FleetMixin
from turnkeeper.store.hosts import HostsMixin
from turnkeeper.store.keys import KeysMixin
from turnkeeper.store.maintenance import MaintenanceMixin
from turnkeeper.store.ownership import OwnershipMixin
from turnkeeper.store.transcript import TranscriptMixin
from turnkeeper.store.turns import TurnsMixin
from turnkeeper.store.workspaces import WorkspacesMixin


class Store(
    AdmissionMixin,
    OwnershipMixin,
    TurnsMixin,
    TranscriptMixin,
    MaintenanceMixin,
    KeysMixin,
    HostsMixin,
    WorkspacesMixin,
    FleetMixin,
):
    """A pooled, thread-safe handle on the run store. Create one per process (after fork)."""

    def __init__(
        self, database_url: str, *, pool_size: int = 10, application_name: str | None = None
    ) -> None:
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise InvalidInputError(f"pool_size must be a positive integer, got {pool_size!r}")
        self._db = Database(database_url, pool_size=pool_size, application_name=application_name)

    def close(self) -> None:
        """Close every pooled connection; the store must not be used afterwards."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
