"""Takeover alignment cost: replaying a journal against a long stored log.

The stored log holds N chunks (a ``text`` agent's output, one chunk per line);
the journal has those lines plus 1,000 more that the dead attempt never
appended. We time what a takeover does (snapshot once, re-read and translate
the whole journal, align, compute the chunks to append) against the floor it
cannot avoid: only reading the snapshot plus only parsing and translating the
journal. The ratio is the price of the alignment itself.

    .venv/bin/python bench/log_align.py [--quick] [--chunks N] [--url URL]

The default N is 200,000; ``--chunks 1000000`` is the issue's full case.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import uuid

import redis

from turnkeeper.agents.formats import translator_for
from turnkeeper.log import Aligner, RunLog
from turnkeeper.logconfig import configure_logging

EXTRA_LINES = 1_000
RUN_ID = "align-bench"


def make_journal(lines: int) -> bytes:
    return b"".join(
        b"line %d of the agent's answer, a realistic sixty-byte line\n" % n for n in range(lines)
    )


def fill_log(log: RunLog, journal: bytes, stored_lines: int) -> int:
    """Store what a crash-free attempt would have appended for the first lines."""
    log.fence(RUN_ID, 1)
    translator = translator_for("text", RUN_ID)
    batch: list[dict[str, object]] = []
    seq = 1
    for line in journal.splitlines(keepends=True)[:stored_lines]:
        batch.extend(translator.feed(line))
        if len(batch) >= 5_000:
            seq = log.append(RUN_ID, 1, seq, batch) + 1
            batch = []
    if batch:
        seq = log.append(RUN_ID, 1, seq, batch) + 1
    return seq - 1


def only_snapshot(log: RunLog) -> int:
    return len(log.snapshot(RUN_ID))


def only_parse(journal: bytes) -> int:
    translator = translator_for("text", RUN_ID)
    count = 0
    for line in journal.splitlines(keepends=True):
        count += len(translator.feed(line))
    return count + len(translator.finish())


def takeover_alignment(log: RunLog, journal: bytes) -> int:
    aligner = Aligner(RUN_ID, log.snapshot(RUN_ID))
    translator = translator_for("text", RUN_ID)
    to_append = []
    for line in journal.splitlines(keepends=True):
        for chunk in translator.feed(line):
            to_append.extend(aligner.feed(chunk))
    for chunk in translator.finish():
        to_append.extend(aligner.feed(chunk))
    aligner.finish()
    return len(to_append)


def timed(fn: object, *args: object) -> tuple[float, int]:
    gc.collect()
    began = time.perf_counter()
    result = fn(*args)  # type: ignore[operator]
    return time.perf_counter() - began, result


def main() -> None:
    configure_logging("WARNING")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("TURNKEEPER_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20,000 chunks, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.rounds = 20_000, 2

    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(args.url)
    log = RunLog(client, namespace=namespace, retention_seconds=600, max_chunks=10_000_000)
    # A text journal: the first line gives two chunks (start + content), every other one.
    journal = make_journal(args.chunks - 1 + EXTRA_LINES)
    try:
        began = time.perf_counter()
        stored = fill_log(log, journal, args.chunks - 1)
        print(
            f"stored {stored:,} chunks in {time.perf_counter() - began:.1f}s; journal "
            f"{len(journal) / 1e6:.1f} MB, {args.chunks - 1 + EXTRA_LINES:,} lines"
        )
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, fn, fn_args in (
                ("snapshot", only_snapshot, (log,)),
                ("parse", only_parse, (journal,)),
                ("takeover", takeover_alignment, (log, journal)),
            ):
                elapsed, result = timed(fn, *fn_args)
                best[name] = min(best.get(name, elapsed), elapsed)
                if name == "takeover":
                    assert result == EXTRA_LINES + 1, result  # the new lines and the END
                if name == "snapshot":
                    assert result == stored
        floor = best["snapshot"] + best["parse"]
        print(f"snapshot only        {best['snapshot']:8.3f}s")
        print(f"parse+translate only {best['parse']:8.3f}s")
        print(f"floor (sum)          {floor:8.3f}s")
        print(f"takeover with align  {best['takeover']:8.3f}s")
        print(f"ratio takeover/floor {best['takeover'] / floor:8.2f}")
        print(f"alignment per stored chunk {(best['takeover'] - floor) / stored * 1e6:.2f} us")
    finally:
        log.delete(RUN_ID)
        client.close()


if __name__ == "__main__":
    main()
