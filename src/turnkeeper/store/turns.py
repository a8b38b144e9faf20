"""The turn slot and the segments: how far a run's turn got.

Every write is one statement guarded by the attempt and answers a ``Verdict``;
a committed turn refuses every later write to it, from any attempt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from turnkeeper.errors import InvalidInputError, SegmentConflictError, StoreError
from turnkeeper.store import sql
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import (
    PHASE_PREDECESSORS,
    Claim,
    NewEntry,
    Segment,
    TurnPhase,
    TurnSlot,
    Verdict,
    check_claim,
    check_id,
    check_limit,
    check_optional_id,
    check_phase,
    to_json,
)
from turnkeeper.store.transcript import TranscriptMixin

ToolRequest = tuple[Any, str | None]
"""A turn's tool request, and the leaf its turn checkpoints at."""


def _tool_request_params(tool_request: ToolRequest | None) -> dict[str, Any]:
    if tool_request is None:
        return {"tool_request": None, "checkpoint_leaf_id": None}
    request, leaf = tool_request
    return {
        "tool_request": to_json(request, "tool_request"),
        "checkpoint_leaf_id": check_optional_id(leaf, "checkpoint_leaf_id"),
    }


class TurnsMixin(StoreBase):
    """The per-run turn slot and the journal bytes stored as segments."""

    def begin_turn_slot(
        self, claim: Claim, turn_index: int, turn_id: str, checkpoint_leaf_id: str | None
    ) -> Verdict:
        """Start a new turn in the run's slot (reset in place, revision + 1).

        Refused for a stale attempt and for a turn index that is not past the current one.
        """
        check_claim(claim)
        if isinstance(turn_index, bool) or not isinstance(turn_index, int) or turn_index < 0:
            raise InvalidInputError(f"turn_index must be a non-negative integer: {turn_index!r}")
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "turn_index": turn_index,
            "turn_id": check_id(turn_id, "turn_id"),
            "checkpoint_leaf_id": check_optional_id(checkpoint_leaf_id, "checkpoint_leaf_id"),
        }
        return self._owner_write("begin_turn_slot", sql.turn_slot.BEGIN_TURN_SLOT, params, claim)

    def update_turn_phase(
        self,
        claim: Claim,
        phase: TurnPhase | str,
        *,
        journal_key: str | None = None,
        tool_request: Any = None,
        checkpoint_leaf_id: str | None = None,
        turn_index: int | None = None,
    ) -> Verdict:
        """Move the current turn forward one phase; absent options keep stored values.
        With ``turn_index``, only that turn: a slot at another answers WRONG_STATE."""
        check_claim(claim)
        target = check_phase(phase)
        if target is TurnPhase.COMMITTED:
            raise InvalidInputError(
                "a turn is committed with commit_turn_slot", reason="use-commit"
            )
        if target is TurnPhase.BEFORE_PROVIDER:
            raise InvalidInputError(
                "before_provider starts a turn: use begin_turn_slot", reason="use-begin"
            )
        predecessors = PHASE_PREDECESSORS[target]
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "phase": target.value,
            "from_a": predecessors[0].value,
            "from_b": predecessors[-1].value,
            "journal_key": check_optional_id(journal_key, "journal_key"),
            "tool_request": None if tool_request is None else to_json(tool_request, "tool_request"),
            "checkpoint_leaf_id": check_optional_id(checkpoint_leaf_id, "checkpoint_leaf_id"),
            "turn_index": turn_index,
        }
        return self._owner_write("update_turn_phase", sql.turn_slot.UPDATE_PHASE, params, claim)

    def commit_turn_slot(
        self, claim: Claim, committed_leaf_id: str, *, turn_index: int | None = None
    ) -> Verdict:
        """Commit the current turn; afterwards every write to that turn is WRONG_STATE.
        With ``turn_index``, only that turn: a slot at another answers WRONG_STATE."""
        check_claim(claim)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "committed_leaf_id": check_id(committed_leaf_id, "committed_leaf_id"),
            "turn_index": turn_index,
        }
        return self._owner_write("commit_turn_slot", sql.turn_slot.COMMIT_TURN_SLOT, params, claim)

    def commit_turn(
        self,
        claim: Claim,
        session_id: str,
        entries: Sequence[NewEntry],
        expected_leaf: str | None,
        *,
        next_turn: tuple[int, str] | None = None,
        next_journal_key: str | None = None,
        tool_request: ToolRequest | None = None,
    ) -> Verdict:
        """End the current turn in one statement: ``append_transcript`` of ``entries``
        (none: the leaf stays), ``commit_turn_slot`` at the new leaf, and with
        ``next_turn`` (its index and id) ``begin_turn_slot`` of it there, and with
        ``next_journal_key`` its provider started (``update_turn_phase``); with
        ``tool_request`` (the request and its checkpoint leaf), first the turn's
        ``update_turn_phase`` to ``tool_request_recorded``.

        DONE: all of it made. NOT_OWNER: a stale attempt, nothing made. WRONG_STATE:
        nothing made, because one of the writes would not be made as it stands (the
        append already made, the leaf moved, the slot elsewhere): make them one by one.
        """
        check_claim(claim)
        check_id(session_id, "session_id")
        check_optional_id(expected_leaf, "expected_leaf")
        chain = TranscriptMixin.chain_of(entries, expected_leaf) if entries else []
        leaf = chain[-1]["entry_id"] if chain else expected_leaf
        if leaf is None:
            raise InvalidInputError("a turn is committed at a leaf", reason="no-leaf")
        next_index, next_turn_id = next_turn if next_turn is not None else (None, None)
        if next_index is not None and (isinstance(next_index, bool) or next_index < 0):
            raise InvalidInputError(f"turn_index must be a non-negative integer: {next_index!r}")
        if next_turn is None and next_journal_key is not None:
            raise InvalidInputError("a journal key starts the next turn's provider")
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "session_id": session_id,
            "expected_leaf": expected_leaf,
            "leaf_id": leaf,
            "entries": json.dumps(chain, ensure_ascii=False),
            "next_index": next_index,
            "next_turn_id": check_optional_id(next_turn_id, "turn_id"),
            "next_journal_key": check_optional_id(next_journal_key, "journal_key"),
            "writes": 1
            + (next_index is not None)
            + (next_journal_key is not None)
            + (tool_request is not None),
            **_tool_request_params(tool_request),
        }
        params["tool_checkpoint"] = params.pop("checkpoint_leaf_id")
        fields: dict[str, Any] = {"run_id": claim.run_id, "attempt_id": claim.attempt_id}
        row = self._db.one("commit_turn", sql.turn_slot.COMMIT_TURN, params, **fields)
        assert row is not None  # noqa: S101 - the statement always returns one row
        if not row["owned"]:
            return Verdict.NOT_OWNER
        if not row["done"]:
            return Verdict.WRONG_STATE
        if row["inserted"] != row["entries"]:
            raise StoreError(
                "the leaf moved but an entry id was taken meanwhile",
                reason="entry-id-raced",
                **fields,
            )
        return Verdict.DONE

    def mark_journal_consumed(self, claim: Claim, journal_key: str) -> Verdict:
        """Record, once, that the turn's journal was read to its end."""
        check_claim(claim)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "journal_key": check_id(journal_key, "journal_key"),
        }
        return self._owner_write(
            "mark_journal_consumed", sql.turn_slot.MARK_JOURNAL_CONSUMED, params, claim
        )

    def get_turn_slot(self, run_id: str) -> TurnSlot | None:
        check_id(run_id, "run_id")
        row = self._db.one(
            "get_turn_slot", sql.turn_slot.GET_TURN_SLOT, {"run_id": run_id}, run_id=run_id
        )
        return None if row is None else TurnSlot.from_row(row)

    def append_segment(
        self,
        claim: Claim,
        journal_key: str,
        byte_start: int,
        body: bytes,
        *,
        mark_consumed: bool = False,
        tool_request: ToolRequest | None = None,
    ) -> Verdict:
        """Store journal bytes once, contiguously, fenced by the attempt. Once they
        are stored, in the same write: with ``mark_consumed`` (the segment that ends
        the journal) the journal is marked consumed (``mark_journal_consumed``); with
        ``tool_request`` (the request and its checkpoint leaf) the turn moves to
        ``tool_request_recorded`` (``update_turn_phase``). A DONE answers for the
        segment: that slot write is made, or it would have been refused for its state.

        DONE: stored. NOT_OWNER: a stale attempt. WRONG_STATE: this exact segment
        was already stored. SegmentConflictError: a different body at a stored
        offset, a gap, or a journal key that belongs to another run.
        """
        check_claim(claim)
        check_id(journal_key, "journal_key")
        if isinstance(byte_start, bool) or not isinstance(byte_start, int) or byte_start < 0:
            raise InvalidInputError(f"byte_start must be a non-negative integer: {byte_start!r}")
        if not isinstance(body, bytes | bytearray | memoryview) or len(body) == 0:
            raise InvalidInputError("body must be non-empty bytes")
        data = bytes(body)
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "journal_key": journal_key,
            "byte_start": byte_start,
            "byte_end": byte_start + len(data),
            "body": data,
            "mark_consumed": bool(mark_consumed),
            **_tool_request_params(tool_request),
        }
        if mark_consumed and tool_request is not None:
            raise InvalidInputError("one slot write rides on a segment, not two")
        fields: dict[str, Any] = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "journal_key": journal_key,
        }
        row = self._db.one("append_segment", sql.segments.APPEND_SEGMENT, params, **fields)
        assert row is not None  # noqa: S101 - the statement always returns one row
        if row["inserted"]:
            return Verdict.DONE
        if not row["owned"]:
            return Verdict.NOT_OWNER
        if row["other_run"]:
            raise SegmentConflictError(
                "the journal key belongs to another run", reason="foreign-journal", **fields
            )
        found = self._db.one("append_segment", sql.segments.STORED_SEGMENT, params, **fields)
        stored = None if found is None else found["body"]
        if stored is not None:
            if bytes(stored) == data:
                return Verdict.WRONG_STATE
            raise SegmentConflictError(
                f"a different body is stored at byte {byte_start}",
                reason="body-differs",
                byte_start=byte_start,
                **fields,
            )
        raise SegmentConflictError(
            f"segment at byte {byte_start} does not continue the stream, which ends at "
            f"byte {row['tip']}",
            reason="not-contiguous",
            byte_start=byte_start,
            stream_end=row["tip"],
            **fields,
        )

    def segments(
        self,
        journal_key: str,
        from_byte: int = 0,
        *,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> list[Segment]:
        """The stored bytes from ``from_byte`` on, in order (the first segment trimmed);
        at most ``limit`` segments, so a long journal can be read in pages, and with
        ``max_bytes`` only the segments that start within that many bytes of the page's
        start (the first one always), so a page of big segments stays small."""
        check_id(journal_key, "journal_key")
        if isinstance(from_byte, bool) or not isinstance(from_byte, int) or from_byte < 0:
            raise InvalidInputError(f"from_byte must be a non-negative integer: {from_byte!r}")
        params = {
            "journal_key": journal_key,
            "from_byte": from_byte,
            "limit": None if limit is None else check_limit(limit),
        }
        if max_bytes is None:
            rows = self._db.rows("segments", sql.segments.SEGMENTS, params)
        else:
            params["max_bytes"] = check_limit(max_bytes)
            rows = self._db.rows("segments", sql.segments.SEGMENTS_BOUNDED, params)
        segments = []
        for row in rows:
            start, body = row["byte_start"], bytes(row["body"])
            if start < from_byte:
                body, start = body[from_byte - start :], from_byte
            segments.append(Segment(row["journal_key"], start, row["byte_end"], body))
        return segments

    def last_segment(self, journal_key: str) -> Segment | None:
        """The segment that ends a journal's stored bytes (its sentinel, once it ended)."""
        check_id(journal_key, "journal_key")
        row = self._db.one("last_segment", sql.segments.LAST_SEGMENT, {"journal_key": journal_key})
        if row is None:
            return None
        return Segment(row["journal_key"], row["byte_start"], row["byte_end"], bytes(row["body"]))
