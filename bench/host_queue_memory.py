"""Redis memory held by the queue of a host no worker consumes, and after beat's
``reap`` empties it.

Sends ``--messages`` takeover messages (what a dead host's queue collects: a takeover
per waiting run, again every ``requeue_after`` while the host looked alive, and a
``reap_host`` per reap interval) to one host's queue on the Redis broker, reports the
queue's bytes (``MEMORY USAGE`` of its keys) per message, then empties it the way
``reap`` does for a dead host and reports what is left.

    TURNKEEPER_REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/host_queue_memory.py
"""

from __future__ import annotations

import argparse
import os
import uuid

import redis

from turnkeeper.config import Settings
from turnkeeper.queues import host_queue, send_takeover
from turnkeeper.tasks import _empty_dead_host_queue, create_app


def _queue_bytes(client: redis.Redis, settings: Settings, queue: str) -> tuple[int, int]:
    """(bytes, messages) of every priority list of ``queue``."""
    total = count = 0
    for key in client.scan_iter(match=f"{settings.namespace}:celery:{queue}*"):
        total += int(client.memory_usage(key, samples=0) or 0)
        count += int(client.llen(key))
    return total, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=10_000)
    args = parser.parse_args()
    redis_url = os.environ.get("TURNKEEPER_REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = Settings(
        database_url="postgresql://unused@127.0.0.1/unused",
        redis_url=redis_url,
        namespace=f"bench-{uuid.uuid4().hex[:8]}",
    )
    app = create_app(settings, turn_worker=False)
    client = redis.Redis.from_url(redis_url)
    queue = host_queue(settings, "gone-host")
    try:
        for index in range(args.messages):
            run_id = str(uuid.uuid4())
            send_takeover(app, settings, run_id, uuid.uuid4().hex, 2 + index % 3, host="gone-host")
        held, count = _queue_bytes(client, settings, queue)
        print(f"messages {count}  bytes {held}  bytes/message {held / max(count, 1):.0f}")
        _empty_dead_host_queue(app, settings, "gone-host")
        left, count = _queue_bytes(client, settings, queue)
        print(f"after reap: messages {count}  bytes {left}")
    finally:
        for key in client.scan_iter(match=f"{settings.namespace}:*"):
            client.delete(key)
        client.close()


if __name__ == "__main__":
    main()
