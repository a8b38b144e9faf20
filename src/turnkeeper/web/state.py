"""What the web app's endpoints share (``WebState``), in a module of its own so that the
routers (``routes``, ``agui``, ``durable``, ``fleet``) name it without importing the app
that includes them."""

from __future__ import annotations

from dataclasses import dataclass

from turnkeeper.agents.catalog import Catalog
from turnkeeper.client import Client
from turnkeeper.config import Settings
from turnkeeper.log import AsyncRunLog, RunLog
from turnkeeper.log.quota import StreamSlots, SubmitRate
from turnkeeper.secret import STREAM_TOKENS, ServerSecret
from turnkeeper.web.fanout import FanOut, FanOutLimits
from turnkeeper.web.metrics import WebMetrics
from turnkeeper.web.revocation import RevocationWatch
from turnkeeper.web.tokens import StreamTokens

# Each run streamed parks one Redis connection in XREAD BLOCK (turnkeeper.web.fanout); past
# this many, the streams of a further run end at once with a log-error of status 503.
MAX_FEED_CONNECTIONS = 4096
# Short commands (state, pages, stream slots) share a bounded pool; a burst waits for one.
MAX_COMMAND_CONNECTIONS = 64
COMMAND_WAIT_SECONDS = 20.0


@dataclass
class WebState:
    """What the endpoints share; built when the app starts, closed when it stops."""

    settings: Settings
    client: Client
    run_log: AsyncRunLog
    tokens: StreamTokens
    metrics: WebMetrics
    catalog: Catalog
    submit_rate: SubmitRate
    stream_slots: StreamSlots
    revocations: RevocationWatch
    fanout: FanOut

    @classmethod
    def open(cls, settings: Settings, fanout_limits: FanOutLimits | None = None) -> WebState:
        secret = ServerSecret.require(settings, "to serve the web app")
        catalog = Catalog.load(settings)
        client = Client.from_settings(settings)
        names = web_client_names(settings.namespace)
        run_log = AsyncRunLog.from_settings(
            settings,
            blocking=True,
            max_connections=MAX_COMMAND_CONNECTIONS,
            timeout=COMMAND_WAIT_SECONDS,
            client_name=names.commands,
        )
        feed_log = AsyncRunLog.from_settings(
            settings,
            max_connections=MAX_FEED_CONNECTIONS,
            client_name=names.feeds,
            socket_timeout=None,  # its reads are guarded by a timer instead (AsyncRunLog.read)
        )
        # A lost log is rebuilt from Postgres on its first read.
        run_log.restorer = feed_log.restorer = client.log
        metrics = WebMetrics(client.store, RunLog.from_settings(settings))
        fanout = FanOut(run_log, feed_log, fanout_limits, on_drop=metrics.streams_dropped.inc)
        metrics.feeds.set_function(lambda: len(fanout.feeds))
        return cls(
            settings=settings,
            client=client,
            run_log=run_log,
            tokens=StreamTokens(secret.subkey(STREAM_TOKENS), settings.stream_token_ttl),
            metrics=metrics,
            catalog=catalog,
            submit_rate=SubmitRate(
                client.log.client,
                namespace=settings.namespace,
                per_minute=settings.submit_rate,
                burst=settings.submit_burst,
            ),
            stream_slots=StreamSlots(
                run_log.client, namespace=settings.namespace, cap=settings.max_streams_per_key
            ),
            revocations=RevocationWatch(client.store),
            fanout=fanout,
        )

    async def aclose(self) -> None:
        await self.fanout.aclose()
        await self.revocations.stop()
        self.client.close()
        self.metrics.close()
        await self.run_log.aclose()


@dataclass(frozen=True)
class WebClientNames:
    """The names the web process's Redis connections carry (``CLIENT LIST``)."""

    commands: str
    feeds: str


def web_client_names(namespace: str) -> WebClientNames:
    return WebClientNames(
        commands=f"turnkeeper-web:{namespace}", feeds=f"turnkeeper-feed:{namespace}"
    )
