"""The run log on Redis Streams, and the alignment of a replayed journal against it."""

from turnkeeper.log.aio import AsyncRunLog
from turnkeeper.log.alignment import (
    DEFAULT_MAX_OUT_OF_BAND_SKIP,
    OUT_OF_BAND_KINDS,
    Aligner,
    AlignmentSummary,
    Snapshot,
    StoredChunks,
    chunk_kind,
)
from turnkeeper.log.entries import LogState
from turnkeeper.log.keys import RunKeys, run_tag
from turnkeeper.log.origin import LogOrigin, LogSource
from turnkeeper.log.runlog import RunLog

__all__ = [
    "DEFAULT_MAX_OUT_OF_BAND_SKIP",
    "OUT_OF_BAND_KINDS",
    "Aligner",
    "AlignmentSummary",
    "AsyncRunLog",
    "LogOrigin",
    "LogSource",
    "LogState",
    "RunKeys",
    "RunLog",
    "Snapshot",
    "StoredChunks",
    "chunk_kind",
    "run_tag",
]
