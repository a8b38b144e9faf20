"""Worker memory while one 200 MB line streams through it, against plain Python reads.

A real worker (the default provider, its journal, the reader, the driver's segments and
log appends) runs a text agent that prints a single line of ``--mb`` MB (``x`` bytes)
and a short one after it. The peak RSS (``VmHWM``) of the worker process that drove the
run is compared with a bare Python process reading the same bytes from ``cat`` through a
pipe, in 64 KiB blocks (flat, the floor) and with one ``readline`` (the line held
whole, what an uncapped reader would need). Run:
    .venv/bin/python bench/long_line_rss.py [--mb 200]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from _fleet import bench_fleet
from turnkeeper.client import Client
from turnkeeper.logconfig import configure_logging
from turnkeeper.owner import owner_pid

BLOCKS = "import sys\nr = sys.stdin.buffer\nwhile r.read(65536): pass\n"
WHOLE = "import sys\nline = sys.stdin.buffer.readline()\nassert len(line) > 1\n"
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child would report
# its parent's peak.
REPORT = (
    "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
)


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def plain_peak_kib(path: Path, code: str) -> int:
    with subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE) as cat:
        out = subprocess.run(
            [sys.executable, "-c", code + REPORT], stdin=cat.stdout, capture_output=True, check=True
        )
    return int(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    size = args.mb * 1_000_000
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    agent = {
        "command": ["/bin/sh", "-c", f"head -c {size} /dev/zero | tr '\\0' x; echo; echo done"],
        "format": "text",
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_fleet(Path(tmp) / "data", journal_max_bytes=size + (1 << 20)) as fleet,
    ):
        fleet.worker()
        client = Client.from_settings(fleet.settings)
        warmup = client.submit({"command": ["/bin/sh", "-c", "echo warm"], "format": "text"}, "w")
        while not client.require(warmup.run_id).status.is_terminal:
            time.sleep(0.1)
        owner = client.require(warmup.run_id).owner
        pid = owner_pid(str(owner))
        before = status_kib(pid, "VmRSS")
        started = time.monotonic()
        run = client.submit(agent, "one long line")
        while not (done := client.require(run.run_id)).status.is_terminal:
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        assert done.owner == owner, "the warm worker process drove the run"
        peak = status_kib(pid, "VmHWM")
        chunks = client.log.state(run.run_id).next_seq - 1
        client.close()
        status = done.status.value
        journal = Path(tmp) / "line"
        with journal.open("wb") as out:
            block = b"x" * (1 << 20)
            for _ in range(size // len(block)):
                out.write(block)
            out.write(b"x" * (size % len(block)) + b"\ndone\n")
        blocks = plain_peak_kib(journal, BLOCKS)
        whole = plain_peak_kib(journal, WHOLE)
    mib = 1024.0
    print(f"one line of {args.mb} MB through a worker: run {status}, {chunks} chunks,", end=" ")
    print(f"{elapsed:.1f}s")
    print(f"  worker process RSS before the run  {before / mib:8.1f} MiB")
    growth = (peak - before) / mib
    print(f"  worker process peak RSS (VmHWM)    {peak / mib:8.1f} MiB  (+{growth:.1f})")
    print(f"  cat | python, 64 KiB reads, peak   {blocks / mib:8.1f} MiB")
    print(f"  cat | python, readline, peak       {whole / mib:8.1f} MiB")
    print(f"  worker peak / 64 KiB reader peak = {peak / blocks:.2f}")
    print(f"  worker peak / readline peak      = {peak / whole:.2f}")


if __name__ == "__main__":
    main()
