"""Agents: what to run (specs and presets) and how to read what it prints (translators)."""
