"""Prometheus metrics of the fleet, as far as the web process can honestly see them.

Counters that happen inside workers are kept by the workers in one Redis hash
(``RunLog.count``) and read on every scrape:

- ``turnkeeper_lease_renewals_total``: lease renewals of every owner;
- ``turnkeeper_refused_appends_total``: appends the log refused to an owner
  whose epoch was fenced off (a zombie writing after a takeover).

What the store records is read on every scrape too:

- ``turnkeeper_runs{status}``: runs per status (gauge);
- ``turnkeeper_attempts{outcome}``: attempts per outcome (``running`` for open ones);
- ``turnkeeper_takeovers_total{cause}``: attempts superseded by a takeover, i.e.
  how many times a run was handed to a new epoch (each one also fenced the log, so
  it bounds the appends that could have been refused), by why: ``crash`` (the crash
  watcher saw the owner's process die), ``lease`` (the reconciler saw its lease run
  out) or ``forced`` (an operator's handoff);
- ``turnkeeper_expired_leases``: running runs whose lease has expired now, on
  the database clock (takeovers waiting for the reconciler);
- ``turnkeeper_max_epoch``: the highest epoch of any unsettled run.

Measured in this process: HTTP request latency per route, the time from
opening a stream to its first event, open streams (and, for the fleet page, the
most open in each of the last minutes), events sent, streams dropped for falling
behind, and the runs read from Redis (``turnkeeper.web.fanout``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from turnkeeper.errors import TurnkeeperError
from turnkeeper.log import RunLog
from turnkeeper.log.runlog import LEASE_RENEWALS, LOGS_LOST, REFUSED_APPENDS
from turnkeeper.store import Store
from turnkeeper.store.records import RunStatus
from turnkeeper.store.schema import HANDOVER_CAUSES

log = structlog.get_logger(__name__)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class StoreCollector(Collector):
    """Reads the fleet's state from the store on each scrape (one statement)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        try:
            counts = self._store.fleet_counts()
        except TurnkeeperError as exc:
            log.warning("metrics.store.unavailable", error=exc.message)
            return
        by_status, by_outcome = counts.runs_by_status, counts.attempts_by_outcome
        gauge = GaugeMetricFamily("turnkeeper_runs", "Runs per status.", labels=["status"])
        for status in RunStatus:
            gauge.add_metric([status.value], by_status.get(status.value, 0))
        yield gauge
        per_outcome = GaugeMetricFamily(
            "turnkeeper_attempts", "Attempts per outcome.", labels=["outcome"]
        )
        for name, count in sorted(by_outcome.items()):
            per_outcome.add_metric([str(name)], count)
        yield per_outcome
        takeovers = CounterMetricFamily(
            "turnkeeper_takeovers",
            "Attempts superseded by a takeover (new attempt, epoch + 1), by cause.",
            labels=["cause"],
        )
        for cause in HANDOVER_CAUSES:
            takeovers.add_metric([cause], counts.takeovers_by_cause.get(cause, 0))
        yield takeovers
        yield GaugeMetricFamily(
            "turnkeeper_expired_leases",
            "Running runs whose lease expired (database clock), awaiting takeover.",
            value=counts.expired_leases,
        )
        yield GaugeMetricFamily(
            "turnkeeper_max_epoch",
            "Highest epoch of a queued or running run.",
            value=counts.max_epoch,
        )


class FleetCollector(Collector):
    """Reads the counters the workers keep in Redis on each scrape."""

    def __init__(self, run_log: RunLog) -> None:
        self._log = run_log

    def close(self) -> None:
        self._log.client.close()

    def collect(self) -> Iterator[CounterMetricFamily]:
        try:
            counters = self._log.counters()
        except TurnkeeperError as exc:
            log.warning("metrics.fleet.unavailable", error=str(exc))
            return
        yield CounterMetricFamily(
            "turnkeeper_lease_renewals",
            "Lease renewals by run owners.",
            value=counters.get(LEASE_RENEWALS, 0),
        )
        yield CounterMetricFamily(
            "turnkeeper_refused_appends",
            "Appends the run log refused to an owner whose epoch was fenced off.",
            value=counters.get(REFUSED_APPENDS, 0),
        )
        yield CounterMetricFamily(
            "turnkeeper_logs_lost",
            "Run logs Redis lost (not expired) that were rebuilt from Postgres.",
            value=counters.get(LOGS_LOST, 0),
        )


class OpenStreams:
    """The event streams this process has open, and the most it had open in each
    minute (of the clock ``now`` reads, seconds), kept for ``keep_minutes``."""

    def __init__(
        self, gauge: Gauge, *, keep_minutes: int = 1440, now: Callable[[], float] = time.time
    ) -> None:
        self._gauge = gauge
        self._keep = keep_minutes
        self._now = now
        self._lock = threading.Lock()
        self._open = 0
        self._minutes: dict[int, tuple[int, int]] = {}
        """minute -> (most open in it, open at its end), for minutes with a change."""
        self._before = 0
        """Open at the end of the newest minute forgotten."""

    @property
    def open(self) -> int:
        return self._open

    def opened(self) -> None:
        self._change(+1)
        self._gauge.inc()

    def closed(self) -> None:
        self._change(-1)
        self._gauge.dec()

    def _change(self, by: int) -> None:
        with self._lock:
            minute = int(self._now() // 60)
            peak, _ = self._minutes.get(minute, (self._open, self._open))
            self._open += by
            self._minutes[minute] = (max(peak, self._open), self._open)
            for old in [m for m in self._minutes if m <= minute - self._keep]:
                self._before = self._minutes.pop(old)[1]

    def peaks(self, minutes: int) -> list[tuple[float, int]]:
        """The last ``minutes`` minutes, oldest first: (its start, seconds since the
        epoch; the most streams open in it)."""
        with self._lock:
            last = int(self._now() // 60)
            first = last - minutes + 1
            carried = self._before
            for minute in sorted(self._minutes):
                if minute >= first:
                    break
                carried = self._minutes[minute][1]
            out = []
            for minute in range(first, last + 1):
                peak, carried = self._minutes.get(minute, (carried, carried))
                out.append((minute * 60.0, peak))
            return out


class WebMetrics:
    """The registry of one web app: the store collector plus this process's own series."""

    def __init__(self, store: Store, run_log: RunLog) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.store = StoreCollector(store)
        self.registry.register(self.store)
        self.fleet = FleetCollector(run_log)
        self.registry.register(self.fleet)
        self.request_seconds = Histogram(
            "turnkeeper_http_request_duration_seconds",
            "HTTP request latency (streams: until the response starts).",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_event_seconds = Histogram(
            "turnkeeper_sse_first_event_seconds",
            "Time from opening a stream to sending its first event.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "turnkeeper_sse_open_streams", "SSE streams open now.", registry=self.registry
        )
        self.streams = OpenStreams(self.open_streams)
        self.events_sent = Counter(
            "turnkeeper_sse_events", "Chunks sent on SSE streams.", registry=self.registry
        )
        self.streams_dropped = Counter(
            "turnkeeper_sse_dropped",
            "Streams cut because their client fell too far behind (it resumes).",
            registry=self.registry,
        )
        self.feeds = Gauge(
            "turnkeeper_sse_feeds",
            "Runs this process reads from Redis now, one parked read each.",
            registry=self.registry,
        )

    def observe_request(self, method: str, route: str, status: int, started: float) -> None:
        self.request_seconds.labels(method, route, str(status)).observe(
            time.perf_counter() - started
        )

    def close(self) -> None:
        self.fleet.close()
