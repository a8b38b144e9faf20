"""The transcript and the turn slot, kept in step with the chunks of a run.

Turn boundaries come from the translated stream (``TurnTracker``): the first
tool call that ends moves the slot to ``tool_request_recorded``; when every call
has its result the turn is appended to the session transcript and committed,
and the next turn begins in place. Entry ids are deterministic, so a successor
replaying the same chunks re-issues the same appends (no-ops in the store) and
skips the slot writes its predecessor already made.

A turn's text is kept in parts and up to ``TRANSCRIPT_TEXT_LIMIT`` characters per
message (and per tool call's arguments): past that the entry says ``truncated``,
and the whole text stays in the run log and the segments. The transcript is a
session's history, not its output, and this keeps a worker's memory flat while an
agent prints hundreds of megabytes into one message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from turnkeeper.agents.translator import TurnEvent, TurnTracker
from turnkeeper.chunks import Chunk
from turnkeeper.driver.ownership import Ownership
from turnkeeper.store.records import Claim, NewEntry, TurnPhase, TurnSlot, Verdict
from turnkeeper.store.store import Store
from turnkeeper.store.turns import ToolRequest

_RANK = {
    TurnPhase.BEFORE_PROVIDER: 0,
    TurnPhase.PROVIDER_STARTED: 1,
    TurnPhase.TOOL_REQUEST_RECORDED: 2,
    TurnPhase.COMMITTED: 3,
}
Position = tuple[int, int]
TRANSCRIPT_TEXT_LIMIT = 1 << 20


@dataclass
class _Text:
    """Text kept in parts, up to ``TRANSCRIPT_TEXT_LIMIT`` characters."""

    parts: list[str] = field(default_factory=list)
    length: int = 0
    truncated: bool = False

    def add(self, delta: str) -> None:
        room = TRANSCRIPT_TEXT_LIMIT - self.length
        if len(delta) > room:
            delta, self.truncated = delta[:room], True
        if delta:
            self.parts.append(delta)
            self.length += len(delta)

    def value(self) -> str:
        return "".join(self.parts)


@dataclass
class TurnContent:
    """What one turn said: assistant messages, tool calls and their results."""

    messages: dict[str, _Text] = field(default_factory=dict)
    calls: dict[str, tuple[str, _Text]] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)

    def observe(self, chunk: Chunk) -> None:
        kind = chunk.get("type")
        if kind == "TEXT_MESSAGE_START":
            self.messages.setdefault(chunk["messageId"], _Text())
        elif kind == "TEXT_MESSAGE_CONTENT":
            self.messages.setdefault(chunk["messageId"], _Text()).add(chunk["delta"])
        elif kind == "TOOL_CALL_START":
            self.calls[chunk["toolCallId"]] = (chunk["toolCallName"], _Text())
        elif kind == "TOOL_CALL_ARGS" and chunk["toolCallId"] in self.calls:
            self.calls[chunk["toolCallId"]][1].add(chunk["delta"])
        elif kind == "TOOL_CALL_RESULT":
            self.results.append({"toolCallId": chunk["toolCallId"], "content": chunk["content"]})

    def tool_request(self) -> list[dict[str, Any]]:
        return [
            {"id": call_id, "name": name, "args": args.value(), **_flag(args)}
            for call_id, (name, args) in self.calls.items()
        ]

    def entries(self, run_id: str, turn_index: int) -> list[NewEntry]:
        prefix = f"{run_id}/turn-{turn_index}"
        entries = []
        if self.messages or self.calls:
            body = {
                "messages": [
                    {"id": k, "text": v.value(), **_flag(v)} for k, v in self.messages.items()
                ],
                "toolCalls": self.tool_request(),
            }
            entries.append(NewEntry(f"{prefix}/assistant", "assistant", body))
        if self.results:
            entries.append(NewEntry(f"{prefix}/tools", "tool", {"results": self.results}))
        return entries


def _flag(text: _Text) -> dict[str, bool]:
    return {"truncated": True} if text.truncated else {}


class TurnRecorder:
    def __init__(
        self,
        store: Store,
        claim: Claim,
        session_id: str,
        ownership: Ownership,
        slot: TurnSlot | None,
    ) -> None:
        self.store = store
        self.claim = claim
        self.session_id = session_id
        self.ownership = ownership
        self.tracker = TurnTracker()
        self.turn_index = 0
        self.leaf: str | None = None
        self.journal_key: str | None = None
        self.content = TurnContent()
        self.input_parent: str | None = None
        """The entry the run's input follows (None: the run opened its session's
        conversation), known once ``record_input`` ran."""
        self._recorded: Position = (slot.turn_index, _RANK[slot.phase]) if slot else (-1, -1)
        self._turn_open = False
        self._pending: tuple[Position, ToolRequest] | None = None
        """The turn's tool request, to go with the next store write of the turn."""

    @property
    def input_entry_id(self) -> str:
        return f"{self.claim.run_id}/input"

    def record_input(self, prompt: str, from_entry: str | None = None) -> None:
        """Append the run's input under the session's leaf (or under ``from_entry``, a
        branch: the leaf moves to the input all the same), and begin turn 0."""
        # A successor re-appends under the parent its predecessor used; a fresh run
        # appends under the session's leaf, or the entry it branches from.
        stored, parent = self.store.entry_parent(self.session_id, self.input_entry_id)
        leaf = self.store.session_leaf(self.session_id)
        if not stored:
            parent = from_entry if from_entry is not None else leaf
        self.input_parent = parent
        entry = NewEntry(self.input_entry_id, "user", {"prompt": prompt})
        self.leaf = self._append([entry], leaf, under=parent)
        self._slot_write(
            (0, 0),
            lambda: self.store.begin_turn_slot(
                self.claim, 0, self._turn_id(0), checkpoint_leaf_id=self.leaf
            ),
        )

    def input_recorded(self, parent: str | None) -> None:
        """``record_input``, made by the claim already (``Store.claim_and_begin``): the
        input under ``parent``, turn 0 begun in the slot."""
        self.input_parent = parent
        self.leaf = self.input_entry_id

    def provider_started(self, journal_key: str) -> None:
        self.journal_key = journal_key
        self._turn_open = True
        self._slot_write(
            (self.turn_index, 1),
            lambda: self.store.update_turn_phase(
                self.claim,
                TurnPhase.PROVIDER_STARTED,
                journal_key=journal_key,
                turn_index=self.turn_index,
            ),
        )

    def interrupt(self) -> None:
        """Before interruption marks: the next agent process will stream under its own key."""
        self.journal_key = None

    def close_interrupted_turn(self) -> None:
        """After the marks: commit the turn they cut short (unless their outcome-unknown
        results completed it), so the next process begins a turn, and records its
        journal key, of its own."""
        if self._turn_open:
            self._end_turn(begin_next=True)

    def observe(self, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            self._turn_open = True
            self.content.observe(chunk)
            event = self.tracker.observe(chunk)
            if event is TurnEvent.TOOL_REQUEST_RECORDED:
                position = (self.turn_index, 2)
                if position > self._recorded:
                    self._pending = (position, (self.content.tool_request(), self.leaf))
            elif event is TurnEvent.TURN_COMPLETE:
                self._end_turn(begin_next=True)

    @property
    def pending_tool_request(self) -> ToolRequest | None:
        """The tool request the turn recorded in its output, not written yet: it goes
        with the turn's next write (its next segment, or its end), which comes before
        any chunk that follows it, or on its own before any other slot write."""
        return None if self._pending is None else self._pending[1]

    def tool_request_written(self) -> None:
        """The pending tool request went with a write (made, or refused for its state)."""
        if self._pending is not None:
            self._recorded = max(self._recorded, self._pending[0])
            self._pending = None

    def _write_pending(self) -> None:
        if self._pending is not None:
            position, (request, leaf) = self._pending
            self._pending = None
            self._slot_write(
                position,
                partial(
                    self.store.update_turn_phase,
                    self.claim,
                    TurnPhase.TOOL_REQUEST_RECORDED,
                    tool_request=request,
                    checkpoint_leaf_id=leaf,
                    turn_index=position[0],
                ),
            )

    @property
    def consumption_due(self) -> bool:
        """The journal's end is still to be marked in the slot (its turn not committed)."""
        return self._recorded < (self.turn_index, 3)

    def mark_consumed(self, journal_key: str) -> None:
        if not self.consumption_due:
            return
        self.ownership.check()
        self.ownership.confirm(self.store.mark_journal_consumed(self.claim, journal_key))

    def commit_turn(self) -> None:
        """Commit the last turn (the journal ended)."""
        self._end_turn(begin_next=False)

    def _end_turn(self, *, begin_next: bool) -> None:
        """Commit the turn and, with ``begin_next``, begin the next one: in one store
        statement when none of its writes was made before (``Store.commit_turn``), else
        (a successor's replay) one write at a time, each made only if it is due."""
        entries = self.content.entries(self.claim.run_id, self.turn_index)
        if (self.turn_index, 3) > self._recorded and (entries or self.leaf is not None):
            index = self.turn_index + 1
            journal_key = self.journal_key if begin_next else None
            self.ownership.check()
            verdict = self.store.commit_turn(
                self.claim,
                self.session_id,
                entries,
                self.leaf,
                next_turn=(index, self._turn_id(index)) if begin_next else None,
                next_journal_key=journal_key,
                tool_request=self.pending_tool_request,
            )
            if verdict is Verdict.NOT_OWNER:
                self.ownership.lose("store-fenced")
            if verdict is Verdict.WRONG_STATE:
                self._catch_up(self.store.get_turn_slot(self.claim.run_id))
            if verdict is Verdict.DONE:
                self._pending = None
                if entries:
                    self.leaf = entries[-1].entry_id
                if not begin_next:
                    self._recorded = (self.turn_index, 3)
                    return
                self._next_turn()
                self._recorded = (index, 0)
                if journal_key is not None:
                    self._turn_open = True
                    self._recorded = (index, 1)
                return
        self._commit_turn()
        if begin_next:
            self._begin_next_turn()

    def _catch_up(self, slot: TurnSlot | None) -> None:
        """Before the writes of a refused ``commit_turn`` are made one by one: count as
        recorded what the slot holds, as this attempt's owner left it. A retry whose
        first try committed (its reply lost) left the slot at the next turn, begun and
        started: ``commit_turn_slot`` and the tool request's ``update_turn_phase`` ask
        only for the phase, so made again they would land on that turn, committing it
        at this turn's leaf while it runs."""
        if slot is not None and slot.attempt_id == self.claim.attempt_id:
            self._recorded = max(self._recorded, (slot.turn_index, _RANK[slot.phase]))

    def _commit_turn(self) -> None:
        self._write_pending()
        entries = self.content.entries(self.claim.run_id, self.turn_index)
        if entries:
            self.leaf = self._append(entries, self.leaf, under=self.leaf)
        leaf = self.leaf
        if leaf is not None:
            turn = self.turn_index
            self._slot_write(
                (turn, 3), lambda: self.store.commit_turn_slot(self.claim, leaf, turn_index=turn)
            )

    def _next_turn(self) -> None:
        self.turn_index += 1
        self.content = TurnContent()
        self._turn_open = False

    def _begin_next_turn(self) -> None:
        self._next_turn()
        index = self.turn_index
        self._slot_write(
            (index, 0),
            lambda: self.store.begin_turn_slot(
                self.claim, index, self._turn_id(index), checkpoint_leaf_id=self.leaf
            ),
        )
        if self.journal_key is not None:
            self.provider_started(self.journal_key)

    def _turn_id(self, index: int) -> str:
        return f"{self.claim.run_id}/turn-{index}"

    def _append(self, entries: list[NewEntry], leaf: str | None, *, under: str | None) -> str:
        """Append under ``under``, moving the session's leaf from ``leaf``."""
        self.ownership.check()
        leaf = self.store.append_transcript(self.claim, self.session_id, entries, leaf, under=under)
        if leaf is None:
            self.ownership.lose("store-fenced")
        return leaf

    def _slot_write(self, position: Position, write: Callable[[], Verdict]) -> None:
        """Make a slot write unless this position was recorded before (a tool request
        still pending before it is written first)."""
        if self._pending is not None and position > self._pending[0]:
            self._write_pending()
        if position <= self._recorded:
            return
        self.ownership.check()
        self.ownership.confirm(write())
        self._recorded = position
