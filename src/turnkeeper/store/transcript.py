"""The transcript tree: entries and the session leaf, moved together.

An append is one transaction fenced by the attempt and by a compare-and-set on
the leaf; deterministic entry ids make a replayed append a no-op.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from turnkeeper.errors import InvalidInputError, StoreError, TranscriptConflictError
from turnkeeper.store import sql
from turnkeeper.store.database import StoreBase
from turnkeeper.store.records import (
    Claim,
    NewEntry,
    TranscriptEntry,
    check_claim,
    check_id,
    check_optional_id,
    to_json,
)


class _Leaf:
    """``under``'s default: the chain goes under the expected leaf."""


_LEAF = _Leaf()


class TranscriptMixin(StoreBase):
    """Append to, branch and read a session's transcript."""

    def append_transcript(
        self,
        claim: Claim,
        session_id: str,
        entries: Sequence[NewEntry],
        expected_leaf: str | None,
        *,
        under: str | _Leaf | None = _LEAF,
    ) -> str | None:
        """Append a chain of entries under ``expected_leaf`` and move the leaf to its end.

        ``under``: an earlier entry to append under instead (a branch); the leaf moves
        from ``expected_leaf`` to the chain's end all the same.

        One transaction, fenced by the attempt and by a compare-and-set on the leaf.
        Returns the new leaf; None for a stale attempt. A replay of an append that
        already happened returns its leaf and writes nothing; a moved leaf raises
        TranscriptConflictError (re-read and retry).
        """
        check_claim(claim)
        check_id(session_id, "session_id")
        check_optional_id(expected_leaf, "expected_leaf")
        parent = expected_leaf if isinstance(under, _Leaf) else check_optional_id(under, "under")
        chain = self.chain_of(entries, parent)
        new_leaf = chain[-1]["entry_id"]
        params = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "session_id": session_id,
            "expected_leaf": expected_leaf,
            "leaf_id": new_leaf,
            "entries": json.dumps(chain, ensure_ascii=False),
            "entry_ids": json.dumps([e["entry_id"] for e in chain], ensure_ascii=False),
        }
        fields: dict[str, Any] = {
            "run_id": claim.run_id,
            "attempt_id": claim.attempt_id,
            "session_id": session_id,
        }
        row = self._db.one("append_transcript", sql.transcript.APPEND_TRANSCRIPT, params, **fields)
        assert row is not None  # noqa: S101 - the statement always returns one row
        if not row["owned"]:
            return None
        if row["moved"]:
            if row["inserted"] != len(chain):
                raise StoreError(
                    "the leaf moved but an entry id was taken meanwhile",
                    reason="entry-id-raced",
                    **fields,
                )
            return str(new_leaf)
        # Nothing written: a replay of this very append, or a conflict. Which one?
        with self._db.transaction("append_transcript", **fields) as tx:
            stored = {r["entry_id"]: r for r in tx.rows(sql.transcript.STORED_ENTRIES, params)}
            current = tx.scalar(sql.transcript.CURRENT_LEAF, params)
        if all(
            (s := stored.get(e["entry_id"])) is not None
            and (s["parent_id"], s["kind"], s["body"]) == (e["parent_id"], e["kind"], e["body"])
            for e in chain
        ):
            return str(new_leaf)
        if stored:
            raise TranscriptConflictError(
                "an entry id is already used by a different entry",
                reason="entry-id-taken",
                current_leaf=current,
                **fields,
            )
        raise TranscriptConflictError(
            f"the leaf is {current!r}, not {expected_leaf!r}",
            reason="leaf-moved",
            current_leaf=current,
            **fields,
        )

    @staticmethod
    def chain_of(entries: Sequence[NewEntry], expected_leaf: str | None) -> list[dict[str, Any]]:
        """The entries as rows of a chain under ``expected_leaf``, each under the one
        before it, checked."""
        if isinstance(entries, NewEntry) or not entries:
            raise InvalidInputError("entries must be a non-empty sequence of NewEntry")
        chain: list[dict[str, Any]] = []
        parent = expected_leaf
        seen: set[str] = set()
        for ordinal, entry in enumerate(entries):
            if not isinstance(entry, NewEntry):
                raise InvalidInputError("entries must be NewEntry values")
            check_id(entry.entry_id, "entry_id")
            check_id(entry.kind, "kind")
            if entry.entry_id in seen or entry.entry_id == expected_leaf:
                raise InvalidInputError(f"entry id {entry.entry_id!r} repeats in the chain")
            seen.add(entry.entry_id)
            body = json.loads(to_json(entry.body, "entry body"))
            chain.append(
                {
                    "ord": ordinal,
                    "entry_id": entry.entry_id,
                    "parent_id": parent,
                    "kind": entry.kind,
                    "body": body,
                }
            )
            parent = entry.entry_id
        return chain

    def session_leaf(self, session_id: str) -> str | None:
        """The session's current leaf entry id (None for a new or empty session)."""
        check_id(session_id, "session_id")
        row = self._db.one("session_leaf", sql.transcript.CURRENT_LEAF, {"session_id": session_id})
        return None if row is None else row["leaf_id"]

    def entry_parent(self, session_id: str, entry_id: str) -> tuple[bool, str | None]:
        """Whether ``entry_id`` is stored in the session, and its parent if so."""
        check_id(session_id, "session_id")
        params = {
            "session_id": session_id,
            "entry_ids": json.dumps([check_id(entry_id, "entry_id")]),
        }
        row = self._db.one("entry_parent", sql.transcript.STORED_ENTRIES, params)
        return (False, None) if row is None else (True, row["parent_id"])

    def session_entries(self, session_id: str) -> list[TranscriptEntry]:
        """Every entry of the session's tree, in the order they were stored."""
        params = {"session_id": check_id(session_id, "session_id")}
        rows = self._db.rows("session_entries", sql.transcript.SESSION_ENTRIES, params)
        return [TranscriptEntry.from_row(r) for r in rows]

    def path_to(self, session_id: str, entry_id: str) -> list[TranscriptEntry]:
        """The entries from the root to ``entry_id`` (empty when it is not stored)."""
        params = {
            "session_id": check_id(session_id, "session_id"),
            "entry_id": check_id(entry_id, "entry_id"),
        }
        rows = self._db.rows("path_to", sql.transcript.PATH_TO_ENTRY, params)
        return [TranscriptEntry.from_row(r) for r in rows]

    def active_path(self, session_id: str) -> list[TranscriptEntry]:
        """The entries from the root to the session's leaf."""
        check_id(session_id, "session_id")
        rows = self._db.rows("active_path", sql.transcript.ACTIVE_PATH, {"session_id": session_id})
        return [TranscriptEntry.from_row(r) for r in rows]
