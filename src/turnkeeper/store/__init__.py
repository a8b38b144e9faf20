"""The run store on PostgreSQL: who owns a run and how far each of its turns got."""

from turnkeeper.store.records import (
    Claim,
    NewEntry,
    Run,
    RunStatus,
    Segment,
    TranscriptEntry,
    TurnPhase,
    TurnSlot,
    Verdict,
)
from turnkeeper.store.store import Store

__all__ = [
    "Claim",
    "NewEntry",
    "Run",
    "RunStatus",
    "Segment",
    "Store",
    "TranscriptEntry",
    "TurnPhase",
    "TurnSlot",
    "Verdict",
]
