"""Worker memory while it follows a 1 GB journal of normal lines, against plain Python.

A real worker (the default provider, its journal, the reader, the driver's segments,
log appends and translation) runs a text agent that prints ``--mb`` MB in lines of
``--line-bytes`` bytes. The RSS of the pool process driving the run is sampled every
``--every`` seconds with how far the run's stored segments reached, so the figures
say whether memory grows with the bytes followed; its peak (``VmHWM``) is compared
with a bare Python process reading the same bytes line by line from ``cat`` (the
floor for any line reader). The run log is trimmed to a few thousand chunks
(``TURNKEEPER_LOG_MAX_CHUNKS``), so the shared Redis holds no gigabyte. Run:
    .venv/bin/python bench/journal_rss.py [--mb 1000] [--line-bytes 1000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import structlog

from _fleet import bench_fleet
from turnkeeper.client import Client
from turnkeeper.config import plain_postgres_url
from turnkeeper.logconfig import configure_logging
from turnkeeper.owner import owner_pid

LINES = "import sys\nfor line in sys.stdin.buffer: pass\n"
REPORT = (
    "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
)
MIB = 1024.0


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def stored_bytes(database_url: str, run_id: str) -> int:
    with psycopg.connect(plain_postgres_url(database_url)) as conn:
        row = conn.execute(
            "SELECT coalesce(max(byte_end), 0) FROM segments WHERE run_id = %s", (run_id,)
        ).fetchone()
    return int(row[0]) if row else 0


def plain_peak_kib(path: Path) -> int:
    with subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE) as cat:
        out = subprocess.run(
            [sys.executable, "-c", LINES + REPORT],
            stdin=cat.stdout,
            capture_output=True,
            check=True,
        )
    return int(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1000)
    parser.add_argument("--line-bytes", type=int, default=1000)
    parser.add_argument("--every", type=float, default=1.0)
    args = parser.parse_args()
    size = args.mb * 1_000_000
    line = "x" * (args.line_bytes - 1)
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    agent = {"command": ["/bin/sh", "-c", f"yes {line} | head -c {size}"], "format": "text"}
    overrides = {"journal_max_bytes": size + (1 << 20), "log_max_chunks": 5000}
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_fleet(Path(tmp) / "data", **overrides) as fleet,
    ):
        fleet.worker()
        client = Client.from_settings(fleet.settings)
        database_url = fleet.settings.require_database_url()
        warmup = client.submit({"command": ["/bin/sh", "-c", "echo warm"], "format": "text"}, "w")
        while not client.require(warmup.run_id).status.is_terminal:
            time.sleep(0.1)
        pid = owner_pid(str(client.require(warmup.run_id).owner))
        before = status_kib(pid, "VmRSS")
        samples: list[tuple[float, int, int]] = []  # (seconds, bytes stored, RSS KiB)
        started = time.monotonic()
        run = client.submit(agent, "a gigabyte of lines")
        while not (done := client.require(run.run_id)).status.is_terminal:
            samples.append(
                (
                    time.monotonic() - started,
                    stored_bytes(database_url, run.run_id),
                    status_kib(pid, "VmRSS"),
                )
            )
            time.sleep(args.every)
        elapsed = time.monotonic() - started
        assert done.owner is not None
        assert owner_pid(done.owner) == pid, "the warm pool process drove the run"
        peak = status_kib(pid, "VmHWM")
        after = status_kib(pid, "VmRSS")
        client.close()
        journal = Path(tmp) / "journal"
        subprocess.run(["/bin/sh", "-c", f"yes {line} | head -c {size} > {journal}"], check=True)
        plain = plain_peak_kib(journal)
    print(
        f"{args.mb} MB in lines of {args.line_bytes} bytes through a worker: run "
        f"{done.status.value}, {elapsed:.1f}s ({args.mb / elapsed:.1f} MB/s)"
    )
    print("  seconds  stored MB   worker RSS MiB")
    step = max(1, len(samples) // 12)
    for seconds, stored, rss in [*samples[::step], samples[-1]] if samples else []:
        print(f"  {seconds:7.1f}  {stored / 1e6:9.1f}  {rss / MIB:15.1f}")
    quarter = max(1, len(samples) // 4)
    first = max(rss for _, _, rss in samples[:quarter])
    last = max(rss for _, _, rss in samples[-quarter:])
    print(f"  worker RSS before the run          {before / MIB:8.1f} MiB")
    print(f"  worker RSS after the run           {after / MIB:8.1f} MiB")
    growth = (peak - before) / MIB
    print(f"  worker peak RSS (VmHWM)            {peak / MIB:8.1f} MiB  (+{growth:.1f})")
    print(f"  highest RSS, first / last quarter  {first / MIB:8.1f} / {last / MIB:.1f} MiB")
    print(f"  cat | python, line by line, peak   {plain / MIB:8.1f} MiB")
    print(f"  worker peak / plain line reader peak = {peak / plain:.2f}")
    print(f"  last quarter / first quarter (1.00 is flat) = {last / first:.3f}")


if __name__ == "__main__":
    main()
