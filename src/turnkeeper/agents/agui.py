"""Lines that already are AG-UI events (one JSON event per line).

A line that validates against the ag-ui-protocol models passes through as the
agent wrote it (its own ids are as deterministic as its bytes), with two
exceptions, because the driver owns the run's lifecycle: ``RUN_STARTED`` and
``RUN_FINISHED`` are dropped, and ``RUN_ERROR`` becomes a fatal CUSTOM
``turnkeeper.agent_error`` (and sets :attr:`failure`). A JSON object that is
not a valid AG-UI event is RAW.
"""

from __future__ import annotations

from typing import Any

from turnkeeper.agents.translator import BaseTranslator, _Unusable
from turnkeeper.chunks import Chunk, validate_chunk
from turnkeeper.errors import AgentError

_DRIVER_OWNED = frozenset({"RUN_STARTED", "RUN_FINISHED"})


class AguiTranslator(BaseTranslator):
    format = "agui"

    def translate(self, event: dict[str, Any]) -> list[Chunk]:
        try:
            validate_chunk(event)
        except AgentError as exc:
            raise _Unusable from exc
        kind = event["type"]
        if kind in _DRIVER_OWNED:
            return []
        if kind == "RUN_ERROR":
            return [self.report_failure(str(event.get("message") or "agent reported RUN_ERROR"))]
        return [event]
