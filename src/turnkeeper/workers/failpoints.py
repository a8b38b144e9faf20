"""Failpoints: named places where a worker can be made to stop, for crash tests.

Crash tests must kill a worker at an exact phase boundary (after the claim but
before the spawn, after the sentinel but before the commit); those windows are
too short to hit with a timer. The points: ``before-spawn``, ``after-prepare``
(the journal made, its writer not started yet), ``after-sentinel``,
``sentinel-stored``, ``settled`` (the run settled, its final chunk not appended).
With ``TURNKEEPER_FAILPOINTS=before-spawn`` a worker reaching that point writes
``<data_dir>/failpoints/before-spawn`` and waits there for the test to SIGKILL it.
Each failpoint fires once per data directory: the successor passes the same point.
Unset (the default), a failpoint costs one string comparison.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import structlog

from turnkeeper.config import Settings

log = structlog.get_logger(__name__)


def failpoint(settings: Settings, name: str, run_id: str) -> None:
    if not settings.failpoints or name not in settings.failpoints.split(","):
        return
    directory = settings.data_dir / "failpoints"
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / name
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return  # fired before: a successor goes on
    with os.fdopen(fd, "w") as out:
        out.write(f"{os.getpid()} {run_id}\n")
    log.warning("failpoint.reached", name=name, run_id=run_id, pid=os.getpid())
    while True:  # until the test kills this process
        time.sleep(3600)


def marker(settings: Settings, name: str) -> Path:
    return settings.data_dir / "failpoints" / name
