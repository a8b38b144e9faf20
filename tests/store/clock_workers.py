"""A worker process whose clock is skewed by hours (time zone and Python clocks)."""

from __future__ import annotations

import datetime as dt
import os
import time
from multiprocessing.queues import Queue
from typing import Any


def _skew_clocks(skew: float) -> None:
    os.environ["TZ"] = "Pacific/Kiritimati" if skew > 0 else "Pacific/Pago_Pago"
    time.tzset()
    real_time = time.time
    real_time_ns = time.time_ns
    time.time = lambda: real_time() + skew
    time.time_ns = lambda: real_time_ns() + int(skew * 1e9)

    class SkewedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> SkewedDatetime:
            return super().now(tz) + dt.timedelta(seconds=skew)  # type: ignore[return-value]

        @classmethod
        def utcnow(cls) -> SkewedDatetime:
            return cls.now(dt.UTC).replace(tzinfo=None)

    dt.datetime = SkewedDatetime  # type: ignore[misc]


def skewed(database_url: str, skew: float, action: str, run_id: str, out: Queue[Any]) -> None:
    real = time.time()
    _skew_clocks(skew)
    from turnkeeper.store import Store  # noqa: PLC0415 - imported after the clocks are skewed

    result: dict[str, Any] = {"client_time_skew": time.time() - real}
    with Store(database_url, pool_size=1) as store:
        if action == "claim":
            claim = store.claim_run(run_id, "skewed", 60)
            assert claim is not None
            result["attempt_id"] = claim.attempt_id
        else:
            result["reclaimed"] = [(c.run_id, c.epoch) for c in store.hand_over_expired(10)]
    out.put(result)
