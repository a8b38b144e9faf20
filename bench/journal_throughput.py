"""Reader throughput on a large finished journal, as a ratio to ``cat file > /dev/null``.

Run: .venv/bin/python bench/journal_throughput.py [--quick] [--mb N]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import structlog

from turnkeeper.sandbox import JournalReader, SandboxSpec, exit_sentinel_line, new_nonce
from turnkeeper.sandbox.journal import JournalPaths
from turnkeeper.sandbox.local import LocalProvider


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mb", type=int, default=None)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    size_mb = args.mb or (20 if args.quick else 100)
    provider = LocalProvider(Path(tempfile.mkdtemp(prefix="tk-bench-")))
    ref = provider.create("bench", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    paths = JournalPaths(ref.journal_dir, "bench", 1)
    nonce = new_nonce()
    line = b'{"type":"TEXT_MESSAGE_CONTENT","messageId":"bench-0","delta":"' + b"x" * 60 + b'"}\n'
    count = size_mb * 1024 * 1024 // len(line)
    with Path(paths.journal).open("wb") as journal:
        journal.writelines(line * 1000 for _ in range(count // 1000))
        journal.write(exit_sentinel_line(0, nonce))
    Path(paths.lock).touch()
    size = Path(paths.journal).stat().st_size
    print(f"journal: {size / 1e6:.1f} MB, {count // 1000 * 1000} lines")

    def cat() -> None:
        subprocess.run(["sh", "-c", f"cat '{paths.journal}' > /dev/null"], check=True)

    def read(strategy: str) -> None:
        reader = JournalReader(
            sandbox,
            paths,
            nonce=nonce,
            strategy=strategy,  # type: ignore[arg-type]
        )
        n = sum(1 for _ in reader)
        assert reader.exit_code == 0
        assert n == count // 1000 * 1000

    timed(cat)  # warm the page cache
    base = min(timed(cat) for _ in range(3))
    print(f"cat > /dev/null        {base * 1000:8.1f} ms  {size / base / 1e6:8.0f} MB/s")
    for strategy in ("follow", "poll"):
        took = min(timed(lambda s=strategy: read(s)) for _ in range(2))
        print(
            f"reader ({strategy:6s})       {took * 1000:8.1f} ms  {size / took / 1e6:8.0f} MB/s"
            f"   ratio to cat: {took / base:.1f}x"
        )
    provider.destroy(ref)


if __name__ == "__main__":
    main()
