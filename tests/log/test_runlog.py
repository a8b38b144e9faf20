"""RunLog against real Redis: fence, append guards, snapshot, read, close, retention."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis

from turnkeeper.chunks import Chunk, encode_chunk, validate_chunk
from turnkeeper.config import Settings
from turnkeeper.errors import (
    ConfigError,
    LogClosedError,
    LogFencedError,
    LogGoneError,
    LogNotFencedError,
    LogOffsetError,
    LogUnavailableError,
    SequenceConflictError,
)
from turnkeeper.log import RunLog
from turnkeeper.log.keys import CHUNK_FIELD

from .samples import custom_chunk, text_chunk

HANG_GUARD = 30.0


def chunks(start: int, stop: int) -> list[Chunk]:
    return [text_chunk(n) for n in range(start, stop)]


def numbered(first: int, items: list[Chunk]) -> list[tuple[int, Chunk]]:
    return list(enumerate(items, start=first))


def test_sample_chunks_are_valid_agui_events() -> None:
    for chunk in [text_chunk(1), custom_chunk("x")]:
        validate_chunk(chunk)


def test_fence_raises_epoch_monotonically(runlog: RunLog) -> None:
    assert runlog.state("r").exists is False
    assert runlog.fence("r", 1) == 1
    assert runlog.fence("r", 3) == 3
    assert runlog.fence("r", 2) == 3
    state = runlog.state("r")
    assert (state.exists, state.epoch, state.closed, state.next_seq) == (True, 3, False, 1)


def test_append_assigns_contiguous_seqs_with_entry_ids(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    assert runlog.append("r", 1, 1, chunks(1, 4)) == 3
    assert runlog.append("r", 1, 4, chunks(4, 5)) == 4
    assert runlog.append("r", 1, 5, []) == 4
    assert runlog.snapshot("r") == numbered(1, chunks(1, 5))
    raw = runlog.client.xrange(runlog.keys("r").stream)
    assert [entry_id for entry_id, _ in raw] == [b"0-1", b"0-2", b"0-3", b"0-4"]
    assert raw[0][1] == {CHUNK_FIELD: encode_chunk(text_chunk(1))}
    assert runlog.next_seq("r") == 5


@pytest.mark.parametrize("first_seq", [1, 2, 4])
def test_append_off_the_next_seq_is_a_conflict_and_lands_nothing(
    runlog: RunLog, first_seq: int
) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, chunks(1, 3))
    with pytest.raises(SequenceConflictError) as info:
        runlog.append("r", 1, first_seq, chunks(10, 12))
    assert info.value.fields["expected"] == 3
    assert info.value.run_id == "r"
    assert runlog.snapshot("r") == numbered(1, chunks(1, 3))


def test_append_below_the_fence_is_refused_and_lands_nothing(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, chunks(1, 3))
    runlog.fence("r", 2)
    with pytest.raises(LogFencedError) as info:
        runlog.append("r", 1, 3, chunks(3, 5))
    assert (info.value.epoch, info.value.fields["stored_epoch"]) == (1, 2)
    assert runlog.append("r", 2, 3, chunks(3, 4)) == 3
    assert runlog.snapshot("r") == numbered(1, chunks(1, 4))


def test_append_without_fence_is_refused(runlog: RunLog) -> None:
    with pytest.raises(LogNotFencedError):
        runlog.append("r", 1, 1, chunks(1, 2))
    runlog.fence("r", 1)
    with pytest.raises(LogNotFencedError):
        runlog.append("r", 2, 1, chunks(1, 2))
    assert runlog.snapshot("r") == []


def test_close_refuses_appends_and_is_idempotent(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, chunks(1, 3))
    runlog.close("r", 1)
    runlog.close("r", 1)
    with pytest.raises(LogClosedError):
        runlog.append("r", 1, 3, chunks(3, 4))
    state = runlog.state("r")
    assert (state.closed, state.closed_epoch, state.next_seq, state.first_seq) == (True, 1, 3, 1)
    assert runlog.snapshot("r") == numbered(1, chunks(1, 3))


def test_close_is_fenced(runlog: RunLog) -> None:
    runlog.fence("r", 2)
    with pytest.raises(LogFencedError):
        runlog.close("r", 1)
    assert runlog.state("r").closed is False


def test_close_starts_retention_ttl_on_every_key(redis_url: str, namespace: str) -> None:
    log = RunLog.from_url(redis_url, namespace=namespace, retention_seconds=100, max_chunks=10)
    log.fence("r", 1)
    log.append("r", 1, 1, chunks(1, 2))
    keys = log.keys("r")
    assert [log.client.pttl(k) for k in keys.as_list()] == [-1, -1]
    log.close("r", 1)
    ttls = [log.client.pttl(k) for k in keys.as_list()]
    assert all(0 < ttl <= 100_000 for ttl in ttls), ttls
    log.client.close()


def test_expired_log_is_gone_from_an_offset_and_empty_from_zero(
    redis_url: str, namespace: str
) -> None:
    log = RunLog.from_url(redis_url, namespace=namespace, retention_seconds=0.05, max_chunks=10)
    log.fence("r", 1)
    log.append("r", 1, 1, chunks(1, 4))
    log.close("r", 1)
    deadline = time.monotonic() + HANG_GUARD
    while log.client.exists(*log.keys("r").as_list()):
        assert time.monotonic() < deadline, "hang guard: keys never expired"
        time.sleep(0.02)
    assert log.snapshot("r") == []
    with pytest.raises(LogGoneError):
        log.snapshot("r", after_seq=2)
    with pytest.raises(LogGoneError):
        list(log.read("r", after_seq=2, block_ms=50))
    log.client.close()


def test_trimming_keeps_the_last_max_chunks_and_reports_gone(
    redis_url: str, namespace: str
) -> None:
    log = RunLog.from_url(redis_url, namespace=namespace, retention_seconds=60, max_chunks=5)
    log.fence("r", 1)
    for n in range(1, 13, 3):
        log.append("r", 1, n, chunks(n, n + 3))
    assert log.state("r").first_seq == 8
    assert log.snapshot("r", after_seq=7) == numbered(8, chunks(8, 13))
    assert log.snapshot("r", after_seq=10) == numbered(11, chunks(11, 13))
    with pytest.raises(LogGoneError) as info:
        log.snapshot("r")
    assert info.value.fields["first_seq"] == 8
    with pytest.raises(LogGoneError):
        log.snapshot("r", after_seq=6)
    with pytest.raises(LogGoneError):
        next(log.read("r", after_seq=3, block_ms=50))
    log.close("r", 1)
    assert list(log.read("r", after_seq=7)) == numbered(8, chunks(8, 13))
    log.client.close()


def test_snapshot_pages_through_long_logs(redis_url: str, namespace: str) -> None:
    log = RunLog(
        redis.Redis.from_url(redis_url),
        namespace=namespace,
        retention_seconds=60,
        max_chunks=10_000,
        page_size=7,
    )
    log.fence("r", 1)
    log.append("r", 1, 1, chunks(1, 51))
    assert log.snapshot("r") == numbered(1, chunks(1, 51))
    assert log.snapshot("r", after_seq=14) == numbered(15, chunks(15, 51))
    log.close("r", 1)
    assert log.snapshot("r") == numbered(1, chunks(1, 51))
    assert list(log.read("r", after_seq=20)) == numbered(21, chunks(21, 51))
    log.client.close()


def test_unknown_run_snapshot_is_empty(runlog: RunLog) -> None:
    assert runlog.snapshot("nobody") == []
    assert runlog.state("nobody").exists is False


def test_read_offset_past_the_end_is_refused(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, chunks(1, 3))
    with pytest.raises(LogOffsetError):
        next(runlog.read("r", after_seq=3))
    with pytest.raises(LogOffsetError):
        next(runlog.read("r", after_seq=-1))


def test_read_of_a_closed_log_yields_everything_and_ends(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, chunks(1, 6))
    runlog.close("r", 1)
    assert list(runlog.read("r")) == numbered(1, chunks(1, 6))
    assert list(runlog.read("r", after_seq=3)) == numbered(4, chunks(4, 6))
    assert list(runlog.read("r", after_seq=5)) == []


class Reader(threading.Thread):
    """Follows a log in a thread and records every chunk it gets."""

    def __init__(self, log: RunLog, run_id: str, after_seq: int = 0) -> None:
        super().__init__(daemon=True)
        self.log, self.run_id, self.after_seq = log, run_id, after_seq
        self.got: list[tuple[int, Chunk]] = []
        self.progress = threading.Condition()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for item in self.log.read(self.run_id, self.after_seq, block_ms=10_000):
                with self.progress:
                    self.got.append(item)
                    self.progress.notify_all()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc

    def wait_for(self, count: int) -> None:
        with self.progress:
            ok = self.progress.wait_for(lambda: len(self.got) >= count, timeout=HANG_GUARD)
        assert ok, f"hang guard: reader has {len(self.got)} of {count}"


def test_read_parks_on_an_open_log_and_ends_at_close(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    reader = Reader(runlog, "r")
    reader.start()
    runlog.append("r", 1, 1, chunks(1, 3))
    reader.wait_for(2)
    time.sleep(0.2)  # let the reader park again in XREAD BLOCK
    assert reader.is_alive()
    runlog.append("r", 1, 3, chunks(3, 4))
    reader.wait_for(3)
    # Chunks appended right before close must not be missed.
    runlog.append("r", 1, 4, chunks(4, 40))
    runlog.close("r", 1)
    reader.join(HANG_GUARD)
    assert not reader.is_alive(), "hang guard: reader did not end at close"
    assert reader.error is None
    assert reader.got == numbered(1, chunks(1, 40))


def test_read_from_before_the_log_exists_parks_until_it_does(runlog: RunLog) -> None:
    reader = Reader(runlog, "later")
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive()
    runlog.fence("later", 1)
    runlog.append("later", 1, 1, chunks(1, 3))
    runlog.close("later", 1)
    reader.join(HANG_GUARD)
    assert not reader.is_alive()
    assert reader.got == numbered(1, chunks(1, 3))


def test_many_readers_from_different_offsets_see_exactly_their_suffix(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, chunks(1, 5))
    readers = [Reader(runlog, "r", after) for after in (0, 2, 4)]
    for reader in readers:
        reader.start()
    for n in range(5, 25):
        runlog.append("r", 1, n, [text_chunk(n)])
    runlog.close("r", 1)
    for reader in readers:
        reader.join(HANG_GUARD)
        assert not reader.is_alive()
        assert reader.got == numbered(reader.after_seq + 1, chunks(reader.after_seq + 1, 25))


def test_same_epoch_writers_racing_for_a_seq_land_exactly_one(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        barrier.wait(HANG_GUARD)
        try:
            runlog.append("r", 1, 1, [text_chunk(n)])
            outcome = f"ok {n}"
        except SequenceConflictError as exc:
            outcome = f"conflict {exc.fields['expected']}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD)
    winners = [o for o in outcomes if o.startswith("ok")]
    assert len(winners) == 1
    assert sorted(o for o in outcomes if o.startswith("conflict")) == ["conflict 2"] * 7
    winner = int(winners[0].split()[1])
    assert runlog.snapshot("r") == [(1, text_chunk(winner))]


def test_run_ids_of_any_shape_get_separate_logs(runlog: RunLog) -> None:
    run_ids = ["a", "a}", "{a}", "x" * 255, "ünïcode run", "~" + "0" * 64]
    for index, run_id in enumerate(run_ids):
        runlog.fence(run_id, 1)
        runlog.append(run_id, 1, 1, [text_chunk(index)])
    for index, run_id in enumerate(run_ids):
        assert runlog.snapshot(run_id) == [(1, text_chunk(index))]


def test_decoding_client_is_refused(redis_url: str, namespace: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    with pytest.raises(ConfigError):
        RunLog(client, namespace=namespace)
    client.close()


def test_bad_namespace_is_refused(redis_url: str) -> None:
    with pytest.raises(ConfigError):
        RunLog.from_url(redis_url, namespace="a{b}")


def test_unreachable_redis_raises_log_unavailable(namespace: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = RunLog.from_url(f"redis://127.0.0.1:{port}/0", namespace=namespace)
    with pytest.raises(LogUnavailableError) as info:
        log.fence("r", 1)
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    with pytest.raises(LogUnavailableError):
        log.snapshot("r")
    with pytest.raises(LogUnavailableError):
        next(log.read("r"))


def test_a_closed_log_stays_closed_across_a_later_fence(runlog: RunLog) -> None:
    runlog.fence("r", 1)
    runlog.append("r", 1, 1, chunks(1, 3))
    runlog.close("r", 1)
    assert runlog.fence("r", 2) == 2
    runlog.close("r", 2)
    with pytest.raises(LogClosedError) as info:
        runlog.append("r", 2, 3, chunks(3, 4))
    assert info.value.fields["closed_epoch"] == 1
    assert list(runlog.read("r")) == numbered(1, chunks(1, 3))


def test_from_settings_uses_namespace_retention_and_trim_bound(
    redis_url: str, namespace: str
) -> None:
    settings = Settings(
        redis_url=redis_url, namespace=namespace, log_retention=12.5, log_max_chunks=3
    )
    log = RunLog.from_settings(settings)
    assert (log.namespace, log.retention_ms, log.max_chunks) == (namespace, 12_500, 3)
    log.fence("r", 1)
    log.append("r", 1, 1, chunks(1, 6))
    assert log.snapshot("r", after_seq=2) == numbered(3, chunks(3, 6))
    log.client.close()


def test_meta_hash_holds_epoch_next_and_run_id(runlog: RunLog) -> None:
    runlog.fence("r{1}", 1)
    meta = runlog.keys("r{1}").meta
    assert runlog.client.hgetall(meta) == {b"epoch": b"1", b"next": b"1", b"run_id": b"r{1}"}
    runlog.append("r{1}", 1, 1, chunks(1, 3))
    runlog.fence("r{1}", 2)
    assert runlog.client.hgetall(meta) == {b"epoch": b"2", b"next": b"3", b"run_id": b"r{1}"}
