"""The merged writes (``claim_and_begin``, ``commit_turn``, ``append_segment``,
``settle_run``) under attack, with real workers, Postgres and Redis.

Three ways an owner can be stopped around one of them, for a run of two tool turns
and a closing answer:

- SIGKILLed at a line boundary of its agent's output, where a tool request waits in
  memory for the next write, or just after a turn's merged commit began the next turn;
- frozen (SIGSTOP) there past its lease and woken after a takeover: each of its
  writes is refused and it appends nothing to the log;
- the reply of a merged write lost after the write committed (``ReplyCutter``, a
  proxy in front of Postgres that drops the connection once the server answered): the
  retry is refused for its state and the owner goes on, making nothing twice.

Each time the whole log is the crash-free oracle element by element and the
transcript holds each turn once.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.driver.fleet import (
    Fleet,
    _output_lines,
    chunks_while_held,
    expected_log,
    held_agent,
    release_held,
    transcript_of_tool_turns,
    wait_held,
)
from tests.driver.test_takeover import _assert_segments_whole, _attempts
from turnkeeper.agents.formats import translator_for
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.config import Settings
from turnkeeper.store.records import Run, RunStatus, TurnPhase, TurnSlot
from turnkeeper.workers.failpoints import release

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 2, "pace": 0.02, "seed": 7}
PROMPT = "two tools, then an answer"


@dataclass(frozen=True)
class Lines:
    """Where AGENT's output (for PROMPT) crosses a turn's boundaries: per turn, the
    line of its first ``TOOL_CALL_END`` (the tool request: recorded with the owner's
    next write), of the ``TOOL_CALL_RESULT`` that completes it (the merged commit), and
    one in the middle of its text."""

    tool_end: list[int]
    tool_result: list[int]
    mid_text: list[int]


@cache
def _lines() -> Lines:
    spec = AgentSpec.from_payload(AGENT)
    translator = translator_for(spec.format, "lines")
    texts: dict[int, list[int]] = {}
    found = Lines([], [], [])
    with tempfile.TemporaryDirectory() as workdir:
        output = _output_lines(spec, PROMPT, Path(workdir))
    for number, line in enumerate(output, start=1):
        kinds = [chunk["type"] for chunk in translator.feed(line)]
        turn = len(found.tool_result)
        if "TOOL_CALL_END" in kinds and len(found.tool_end) == turn:
            found.tool_end.append(number)
        if "TOOL_CALL_RESULT" in kinds:
            found.tool_result.append(number)
        if "TEXT_MESSAGE_CONTENT" in kinds:
            texts.setdefault(turn, []).append(number)
    found.mid_text.extend(numbers[len(numbers) // 2] for _, numbers in sorted(texts.items()))
    assert len(found.tool_result) == AGENT["turns"] == len(found.tool_end)
    assert len(found.mid_text) == AGENT["turns"] + 1
    return found


# --- the oracle -------------------------------------------------------------------------


def _assert_log_is_oracle(fleet: Fleet, run: Run, tmp_path: Path) -> None:
    stored = fleet.log_of(run.run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    oracle = expected_log(run.run_id, run.session_id, AGENT, PROMPT, tmp_path / "oracle")
    assert [chunk for _, chunk in stored] == oracle


def _assert_transcript_once(fleet: Fleet, run: Run) -> None:
    ids = [entry.entry_id for entry in fleet.client.transcript(run.session_id)]
    assert ids == transcript_of_tool_turns(run, AGENT["turns"])


def _assert_finished_once(fleet: Fleet, run: Run, tmp_path: Path, *, epoch: int) -> None:
    done = fleet.wait_settled(run.run_id, timeout=180)
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (epoch, epoch), fleet.dump_logs()
    history = _attempts(fleet.settings.require_database_url(), run.run_id)
    assert history == [(1, "superseded")] * (epoch - 1) + [(epoch, "completed")]
    _assert_log_is_oracle(fleet, done, tmp_path)
    _assert_transcript_once(fleet, done)
    _assert_segments_whole(fleet, done)
    _assert_last_turn_committed(fleet, done)


def _assert_last_turn_committed(fleet: Fleet, run: Run) -> None:
    slot = fleet.client.store.get_turn_slot(run.run_id)
    assert slot is not None
    last = AGENT["turns"]
    assert (slot.turn_index, slot.phase, slot.committed_leaf_id) == (
        last,
        TurnPhase.COMMITTED,
        f"{run.run_id}/turn-{last}/assistant",
    )


def _held_at(fleet: Fleet, tmp_path: Path, lines: int, first: int | None = None) -> tuple[Run, str]:
    """Submit AGENT held after ``lines`` lines; return once the owner showed them all.

    With ``first``, the agent is held there before: the owner reads the lines up to it
    apart from the rest, however fast they came, so a write due with "the next lines"
    (a tool request's) is made with the lines after ``first``."""
    token = uuid.uuid4().hex
    holds = [lines] if first is None else [first, lines]
    run = fleet.client.submit(held_agent(AGENT, token, holds), PROMPT)
    for held in holds:
        shown = chunks_while_held(run.run_id, AGENT, PROMPT, held, tmp_path / f"held-{held}")
        fleet.wait_chunks(run.run_id, shown)  # the agent stops itself right after them
        wait_held(token)
        assert len(fleet.log_of(run.run_id)) == shown
        if held != lines:
            release_held(token)
    return fleet.client.require(run.run_id), token


# --- 1. SIGKILL at the merged writes' line boundaries ------------------------------------

STARTED, RECORDED = TurnPhase.PROVIDER_STARTED, TurnPhase.TOOL_REQUEST_RECORDED
Point = tuple[str, int, int]
"""A line of AGENT's output: a field of ``Lines``, a turn, and lines after it."""
KILL_POINTS: dict[str, tuple[Point, tuple[int, TurnPhase]]] = {
    # name: (the last line shown, the slot as the owner leaves it there)
    "turn-0-tool-request-pending": (("tool_end", 0, 0), (0, STARTED)),
    "turn-0-committed": (("tool_result", 0, 0), (1, STARTED)),
    "turn-1-streaming": (("mid_text", 1, 0), (1, STARTED)),
    "turn-1-tool-request-pending": (("tool_end", 1, 0), (1, STARTED)),
    "turn-1-tool-request-recorded": (("tool_end", 1, 2), (1, RECORDED)),
    "turn-1-committed": (("tool_result", 1, 0), (2, STARTED)),
    "closing-turn-streaming": (("mid_text", 2, 0), (2, STARTED)),
}


def _line(point: Point) -> int:
    field_name, turn, after = point
    numbers: list[int] = getattr(_lines(), field_name)
    return numbers[turn] + after


def _wait_slot(fleet: Fleet, run: Run, position: tuple[int, TurnPhase]) -> TurnSlot:
    """Until the owner's slot writes for what it showed are made (a hang guard): the
    chunks go to the log before the turn's commit that they complete."""
    deadline = time.monotonic() + 60
    while True:
        slot = fleet.client.store.get_turn_slot(run.run_id)
        if slot is not None and (slot.turn_index, slot.phase) == position:
            return slot
        assert time.monotonic() < deadline, (slot and (slot.turn_index, slot.phase), position)
        time.sleep(0.02)


@pytest.mark.parametrize(("point", "slot"), list(KILL_POINTS.values()), ids=list(KILL_POINTS))
def test_sigkill_at_a_merged_write_boundary_of_a_two_tool_run(
    settings: Settings, tmp_path: Path, point: Point, slot: tuple[int, TurnPhase]
) -> None:
    """The owner dies with a tool request held for its next write, or just after a
    merged write: the successor replays from byte 0, nothing lost or doubled."""
    fleet = Fleet.create(settings, tmp_path / "logs")
    token = ""
    try:
        fleet.start_pair()
        field_name, turn, after = point
        first = _line((field_name, turn, 0)) if after else None
        owned, token = _held_at(fleet, tmp_path, _line(point), first)
        _wait_slot(fleet, owned, slot)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        release_held(token)
        _assert_finished_once(fleet, owned, tmp_path, epoch=2)
    finally:
        if token:
            release_held(token)
        fleet.stop()


# --- 2. a zombie owner between its fence and its next merged write ----------------------


Settled = tuple[list[Any], list[Any], TurnSlot | None, list[tuple[int, int]]]


def _settled_by_successor(fleet: Fleet, frozen: Run) -> Settled:
    """With the owner frozen: the successor finishes the run; what it left."""
    done = fleet.wait_settled(frozen.run_id, timeout=180)
    assert (done.status, done.epoch) == (RunStatus.COMPLETED, 2), fleet.dump_logs()
    assert fleet.events("attempt.stopped", needle=frozen.attempt_id or "") == []
    return (
        fleet.log_of(frozen.run_id),
        fleet.client.transcript(frozen.session_id),
        fleet.client.store.get_turn_slot(frozen.run_id),
        _segments(fleet, frozen),
    )


def _segments(fleet: Fleet, run: Run) -> list[tuple[int, int]]:
    """The run's stored journal bytes, as (byte_start, byte_end) per segment."""
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT byte_start, byte_end FROM segments WHERE run_id = %s"
            " ORDER BY journal_key, byte_start",
            (run.run_id,),
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


def _assert_zombie_changed_nothing(
    fleet: Fleet, frozen: Run, settled: Settled, tmp_path: Path
) -> None:
    (event,) = fleet.wait_events(
        "attempt.stopped", needle=frozen.attempt_id or "", files="worker-*.log"
    )
    assert event["epoch"] == 1
    assert event["reason"] in ("store-fenced", "log-fenced", "lease-lost"), event
    assert (
        fleet.log_of(frozen.run_id),
        fleet.client.transcript(frozen.session_id),
        fleet.client.store.get_turn_slot(frozen.run_id),
        _segments(fleet, frozen),
    ) == settled
    _assert_finished_once(fleet, frozen, tmp_path, epoch=2)


@pytest.mark.parametrize(
    "point", ["turn-1-tool-request-pending", "turn-0-committed"], ids=lambda name: name
)
def test_a_zombie_woken_with_a_write_due_is_refused(
    settings: Settings, tmp_path: Path, point: str
) -> None:
    """Frozen with a tool request held for its next segment (or just after a merged
    commit), woken after the successor finished: refused, nothing appended."""
    fleet = Fleet.create(settings, tmp_path / "logs")
    pgid: int | None = None
    token = ""
    try:
        fleet.start_pair()
        line, slot = KILL_POINTS[point]
        owned, token = _held_at(fleet, tmp_path, _line(line))
        _wait_slot(fleet, owned, slot)
        pgid = fleet.signal_worker_of(owned, signal.SIGSTOP)
        release_held(token)  # the agent goes on: the successor attaches to it
        settled = _settled_by_successor(fleet, owned)
        os.killpg(pgid, signal.SIGCONT)
        pgid = None
        _assert_zombie_changed_nothing(fleet, owned, settled, tmp_path)
    finally:
        if pgid is not None:
            os.killpg(pgid, signal.SIGCONT)
        if token:
            release_held(token)
        fleet.stop()


@pytest.mark.parametrize("point", ["after-sentinel", "sentinel-stored"])
def test_a_zombie_paused_around_its_sentinel_is_refused(
    settings: Settings, tmp_path: Path, point: str
) -> None:
    """Paused (and frozen) before or after storing its sentinel, the last turn not
    committed: woken after the successor finished, its sentinel append, commit and
    settle are refused, and it appends nothing to the log."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints=f"{point}=pause")
    pgid: int | None = None
    try:
        fleet.start_pair()
        run = fleet.client.submit(AGENT, PROMPT)
        fleet.wait_failpoint(point)
        owned = fleet.client.require(run.run_id)
        pgid = fleet.signal_worker_of(owned, signal.SIGSTOP)
        release(fleet.settings, point)
        settled = _settled_by_successor(fleet, owned)
        os.killpg(pgid, signal.SIGCONT)
        pgid = None
        _assert_zombie_changed_nothing(fleet, owned, settled, tmp_path)
    finally:
        if pgid is not None:
            os.killpg(pgid, signal.SIGCONT)
        fleet.stop()


# --- 3. a merged write whose reply was lost ---------------------------------------------


class ReplyCutter:
    """A TCP proxy in front of Postgres that, for the ``nth`` request (the client's
    bytes between two answers) that ``matches``, forwards the request, waits until the
    server said it is ready for the next one (``ReadyForQuery``: the statement ran and
    committed), and then ends both connections instead of forwarding the answer.

    What a connection dropped right after a commit does to its client: the write is
    made, its reply lost, and the client retries it."""

    def __init__(self, upstream: str, matches: Callable[[bytes], bool], nth: int = 1) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.matches = matches
        self.nth = nth
        self.seen = 0
        self.cut = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        query = "sslmode=disable&gssencmode=disable"
        netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
        self.url = urlunsplit((parts.scheme, netloc, parts.path, query, ""))
        self._closed = False

    def start(self) -> ReplyCutter:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        request = bytearray()
        answer = bytearray()  # the server's bytes not yet split into messages
        counted = cutting = False
        try:
            while True:
                ready, _, _ = select.select([client, server], [], [])
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        return
                    request += data
                    if not counted and self.matches(bytes(request)):
                        counted = True
                        with self._lock:
                            self.seen += 1
                            cutting = self.seen == self.nth
                    server.sendall(data)
                if server in ready:
                    data = server.recv(65536)
                    if not data:
                        return
                    answer += data
                    if cutting:
                        if _ready_for_query(answer):
                            self.cut.set()
                            return  # the answer is never forwarded
                        continue
                    client.sendall(data)
                    if _ready_for_query(answer):
                        request.clear()
                        counted = False
                    del answer[: _whole_messages(answer)]
        except OSError:
            return
        finally:
            client.close()
            server.close()


def _messages(buffer: bytes | bytearray) -> Iterator[tuple[int, int]]:
    """The backend messages wholly in ``buffer``: (type byte, end offset)."""
    at = 0
    while at + 5 <= len(buffer):
        (length,) = struct.unpack_from("!I", buffer, at + 1)
        if at + 1 + length > len(buffer):
            return
        yield buffer[at], at + 1 + length
        at += 1 + length


def _ready_for_query(buffer: bytes | bytearray) -> bool:
    return any(kind == ord("Z") for kind, _ in _messages(buffer))


def _whole_messages(buffer: bytes | bytearray) -> int:
    end = 0
    for _, end in _messages(buffer):  # noqa: B007 - the last one's end
        pass
    return end


def _statement(marker: bytes) -> Callable[[bytes], bool]:
    return lambda request: marker in request


COMMIT_TURN = _statement(b"open_turn AS")  # only store.sql.turn_slot.COMMIT_TURN says this
SETTLE_RUN = _statement(b"agent_session_id = COALESCE")  # only SETTLE_RUN


def _cut_fleet(settings: Settings, tmp_path: Path, cutter: ReplyCutter) -> Fleet:
    return Fleet.create(settings.model_copy(update={"database_url": cutter.url}), tmp_path / "logs")


@pytest.mark.parametrize(
    ("nth", "held_in"),
    [(1, ("mid_text", 1, 0)), (2, ("mid_text", 2, 0)), (3, None)],
    ids=["turn-0-commit", "turn-1-commit", "last-commit"],
)
def test_a_commit_turn_whose_reply_was_lost_is_made_once(
    settings: Settings, tmp_path: Path, nth: int, held_in: Point | None
) -> None:
    """The ``nth`` merged commit commits and its reply is lost; the retry is refused
    for its state (WRONG_STATE), and the owner goes on without writing anything of
    that commit again: the next turn's slot stays begun and started (not committed in
    the lost commit's place), the log and transcript are the crash-free ones."""
    cutter = ReplyCutter(settings.require_database_url(), COMMIT_TURN, nth).start()
    fleet = _cut_fleet(settings, tmp_path, cutter)
    token = ""
    try:
        fleet.start_worker()
        fleet.start_beat()
        if held_in is None:
            run = fleet.client.submit(AGENT, PROMPT)
        else:
            run, token = _held_at(fleet, tmp_path, _line(held_in))
            assert cutter.cut.is_set(), fleet.dump_logs()
            slot = fleet.client.store.get_turn_slot(run.run_id)
            assert slot is not None
            assert (slot.turn_index, slot.phase, slot.committed_leaf_id) == (
                nth,
                TurnPhase.PROVIDER_STARTED,
                None,
            ), slot
            release_held(token)
        _assert_finished_once(fleet, run, tmp_path, epoch=1)
        assert cutter.cut.is_set()
        retried = fleet.events("service.retrying", files="worker-*.log")
        assert [e["error"].split(":")[0] for e in retried] == ["commit_turn"], retried
    finally:
        if token:
            release_held(token)
        fleet.stop()
        cutter.close()


def test_a_settle_whose_reply_was_lost_ends_the_run_once(
    settings: Settings, tmp_path: Path
) -> None:
    """The settle commits, its reply is lost; the retry finds the run settled by this
    attempt (WRONG_STATE) and the owner appends the final chunk once."""
    cutter = ReplyCutter(settings.require_database_url(), SETTLE_RUN).start()
    fleet = _cut_fleet(settings, tmp_path, cutter)
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(AGENT, PROMPT)
        _assert_finished_once(fleet, run, tmp_path, epoch=1)
        assert cutter.cut.is_set()
        retried = fleet.events("service.retrying", files="worker-*.log")
        assert [e["error"].split(":")[0] for e in retried] == ["settle_run"], retried
    finally:
        fleet.stop()
        cutter.close()
