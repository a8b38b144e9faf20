"""One turn's life on a worker, fresh or taken over (docs/architecture.md, "Takeover")."""

from __future__ import annotations

from turnkeeper.driver.attempt import run_turn, take_over

__all__ = ["run_turn", "take_over"]
