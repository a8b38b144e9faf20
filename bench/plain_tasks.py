"""The plain alternative for bench/fleet_throughput.py: a Celery task that spawns the
agent with a pipe and XADDs each of its lines. No store, no journal, no fencing,
no takeover: what a team would write first."""

from __future__ import annotations

import os
import subprocess
import tempfile

import redis
from celery import Celery

app = Celery("plain", broker=os.environ["PLAIN_BROKER_URL"], set_as_current=False)
app.conf.update(
    task_ignore_result=True,
    worker_disable_prefetch=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"global_keyprefix": os.environ["PLAIN_PREFIX"] + ":celery:"},
    task_default_queue=os.environ["PLAIN_PREFIX"] + ".plain",
    worker_hijack_root_logger=False,
)
_redis: redis.Redis | None = None


@app.task(name="plain.run")
def run(argv: list[str], key: str) -> None:
    global _redis  # noqa: PLW0603 - one client per worker process
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["PLAIN_REDIS_URL"])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=tempfile.gettempdir())
    assert proc.stdout is not None
    for line in proc.stdout:
        _redis.xadd(key, {"c": line})
    proc.wait()
    _redis.incr(os.environ["PLAIN_PREFIX"] + ":done")
