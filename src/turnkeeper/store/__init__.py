"""The run store on PostgreSQL: who owns a run and how far each of its turns got."""

from turnkeeper.store.records import (
    Claim,
    NewEntry,
    Run,
    RunStatus,
    StreamSegment,
    TranscriptEntry,
    TurnJournal,
    TurnPhase,
)
from turnkeeper.store.store import Store

__all__ = [
    "Claim",
    "NewEntry",
    "Run",
    "RunStatus",
    "Store",
    "StreamSegment",
    "TranscriptEntry",
    "TurnJournal",
    "TurnPhase",
]
