"""A scratch stack for the fleet benchmarks: its own database, namespace and processes.

Uses TURNKEEPER_DATABASE_URL / TURNKEEPER_REDIS_URL when set, else the embedded
servers (started if needed, left as they were found).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnkeeper.config import Settings, load_settings, plain_postgres_url
from turnkeeper.embedded import resolve_services
from turnkeeper.store import migration

QUIET = ["--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING"]


@dataclass
class BenchFleet:
    settings: Settings
    env: dict[str, str]
    logs: Path | None = None
    """Where each process writes its output (``<command>-<n>.log``); None discards it."""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    log_files: dict[int, Path] = field(default_factory=dict)
    """Each started process's output file, by pid (when ``logs`` is set)."""

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        log = None if self.logs is None else self.logs / f"{args[0]}-{len(self.procs) + 1}.log"
        with (log or Path(os.devnull)).open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "turnkeeper", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        if log is not None:
            self.log_files[proc.pid] = log
        return proc

    def worker(self, concurrency: int = 1) -> subprocess.Popen[bytes]:
        return self.start("worker", "-c", str(concurrency), *QUIET)

    def beat(self) -> subprocess.Popen[bytes]:
        return self.start("beat", *QUIET)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:  # a frozen process dies of SIGKILL too, but wakes to be reaped
                    os.killpg(proc.pid, signal.SIGKILL)
                    os.killpg(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.procs.clear()


@contextmanager
def bench_fleet(data_dir: Path, **overrides: Any) -> Iterator[BenchFleet]:
    # Fleet processes refuse to start without a server secret: a random one per bench.
    secret = str(overrides.pop("secret", None) or secrets.token_urlsafe(32))
    base, _ = resolve_services(load_settings(), start=True)
    admin = plain_postgres_url(base.require_database_url())
    name = f"tk_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin).set(database=name).render_as_string(hide_password=False)
    migration.upgrade(url)
    settings = base.model_copy(
        update={
            "database_url": url,
            "namespace": f"bench-{uuid.uuid4().hex[:8]}",
            "data_dir": data_dir,
            "secret": SecretStr(secret),
            **overrides,
        }
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(
        TURNKEEPER_DATABASE_URL=url,
        TURNKEEPER_REDIS_URL=settings.require_redis_url(),
        TURNKEEPER_NAMESPACE=settings.namespace,
        TURNKEEPER_DATA_DIR=str(data_dir),
        TURNKEEPER_LOG_LEVEL="WARNING",
        TURNKEEPER_SECRET=secret,
    )
    for key, value in overrides.items():
        env[f"TURNKEEPER_{key.upper()}"] = str(value)
    fleet = BenchFleet(settings, env)
    try:
        yield fleet
    finally:
        fleet.stop()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
