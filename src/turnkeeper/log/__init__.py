"""The run log on Redis Streams, and the alignment of a replayed journal against it."""

from turnkeeper.log.aio import AsyncRunLog
from turnkeeper.log.alignment import (
    DEFAULT_MAX_OUT_OF_BAND_SKIP,
    Aligner,
    AlignmentSummary,
    align,
    is_custom_chunk,
)
from turnkeeper.log.entries import LogState
from turnkeeper.log.keys import RunKeys, run_tag
from turnkeeper.log.runlog import RunLog

__all__ = [
    "DEFAULT_MAX_OUT_OF_BAND_SKIP",
    "Aligner",
    "AlignmentSummary",
    "AsyncRunLog",
    "LogState",
    "RunKeys",
    "RunLog",
    "align",
    "is_custom_chunk",
    "run_tag",
]
