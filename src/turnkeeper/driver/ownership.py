"""The one answer to "does this attempt still own its run?".

An attempt loses its run in three ways, each an answer rather than a failure: its
lease renewal is refused (the heartbeat sets ``lost``), the store refuses one of
its writes as ``NOT_OWNER``, or the run log refuses an append for its epoch.
Every part of the driver asks here, and the first ``OwnershipLostError`` stops
the attempt from writing anything more.
"""

from __future__ import annotations

import threading
from typing import NoReturn

from turnkeeper.errors import OwnershipLostError
from turnkeeper.logconfig import get_logger
from turnkeeper.store.records import Claim, Verdict
from turnkeeper.store.store import Store

log = get_logger(__name__)

_MESSAGES = {
    "lease-lost": "the lease was lost; this attempt stops writing",
    "store-fenced": "the store refused a write: another attempt owns the run",
    "log-fenced": "a later attempt fenced the run log",
}


class Ownership:
    def __init__(self, store: Store, claim: Claim, lost: threading.Event, lease_ttl: float) -> None:
        self.store = store
        self.claim = claim
        self.lost = lost
        self.lease_ttl = lease_ttl
        self._reason = "lease-lost"

    def check(self) -> None:
        """Raise OwnershipLostError once the run was lost, whichever way."""
        if self.lost.is_set():
            self.lose(self._reason)

    def confirm(self, verdict: Verdict) -> bool:
        """Read a store write's verdict: True when made, False when refused for the
        row's state (a retry already made it, or the turn moved on). A write refused
        because another attempt owns the run raises OwnershipLostError."""
        if verdict is Verdict.NOT_OWNER:
            self.lose("store-fenced")
        if verdict is Verdict.WRONG_STATE:
            log.debug("write.already_made", run_id=self.claim.run_id)
        return verdict is Verdict.DONE

    def lose(self, reason: str, cause: BaseException | None = None) -> NoReturn:
        """Record that the run is gone (``reason``) and stop this attempt."""
        if not self.lost.is_set():
            self._reason = reason
            self.lost.set()
        raise OwnershipLostError(
            _MESSAGES.get(self._reason, self._reason),
            run_id=self.claim.run_id,
            attempt_id=self.claim.attempt_id,
            epoch=self.claim.epoch,
            reason=self._reason,
        ) from cause

    def held(self) -> bool:
        """Whether the run is still this attempt's, asking the store: what an
        unexpected error means depends on it (a successor's business, or ours to fail)."""
        if self.lost.is_set():
            return False
        return self.store.renew_lease(self.claim, self.lease_ttl) is Verdict.DONE
