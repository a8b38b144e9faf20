"""One turn's life on a worker, fresh or taken over (docs/architecture.md, "Takeover").

``run_turn`` and ``take_over`` load on first access (``driver.attempt`` and with it the
sandboxes and the agents' translators): the client imports this package's light parts
(``lifecycle``, ``output``) to end a cancelled run's log, and a ``turnkeeper cancel`` a
script calls in a loop should not pay for what only a worker runs (bench/cli_start.py).
The worker imports ``driver.attempt`` itself when it starts (``tasks``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnkeeper.driver.attempt import run_turn, take_over

__all__ = ["run_turn", "take_over"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("turnkeeper.driver.attempt"), name)
    raise AttributeError(name)
