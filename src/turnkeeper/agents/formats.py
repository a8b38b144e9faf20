"""The agents' output formats by name, and a fresh translator for one of them.

The translator base (``translator``) imports no format; this registry imports each
built-in one beside it, so a format module can use the base's helpers without the
base ever importing a format.
"""

from __future__ import annotations

from collections.abc import Callable

from turnkeeper.agents.agui import AguiTranslator
from turnkeeper.agents.claude_code import ClaudeCodeTranslator
from turnkeeper.agents.codex import CodexTranslator
from turnkeeper.agents.text import TextTranslator
from turnkeeper.agents.translator import Translator
from turnkeeper.errors import UnknownAgentError

_BY_NAME: dict[str, Callable[[str], Translator]] = {
    translator.format: translator
    for translator in (AguiTranslator, ClaudeCodeTranslator, CodexTranslator, TextTranslator)
}


def formats() -> list[str]:
    return sorted(_BY_NAME)


def translator_for(format_name: str, run_id: str) -> Translator:
    """A fresh translator for one run (a replay must use a fresh one too)."""
    try:
        factory = _BY_NAME[format_name]
    except KeyError:
        raise UnknownAgentError(
            f"unknown agent output format {format_name!r}; known: {', '.join(formats())}",
            run_id=run_id,
            reason="unknown-format",
        ) from None
    return factory(run_id)
