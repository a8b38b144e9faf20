"""Agents: what to run (specs and presets) and how to read what it prints (translators)."""

from __future__ import annotations

from turnkeeper.agents.translator import (
    Boundary,
    Translator,
    TurnEvent,
    TurnTracker,
    boundary,
    formats,
    translator_for,
)

__all__ = [
    "Boundary",
    "Translator",
    "TurnEvent",
    "TurnTracker",
    "boundary",
    "formats",
    "translator_for",
]
