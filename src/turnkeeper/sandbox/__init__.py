"""Sandboxes and the run journal: providers, the jail, journaled agents and their readers.

``provider_for`` loads on first access, and with it every provider (bwrap, the local
jail, ssh, the egress proxy): a run's command and journal format are all that the
client needs of this package to write a cancelled run's log (``driver.replay``), and a
``turnkeeper cancel`` a script calls in a loop should not pay for the providers
(bench/cli_start.py). A worker imports ``sandbox.factory`` itself when it starts
(``workers.runtime``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from turnkeeper.sandbox.codec import decode_run_id, encode_run_id, parse_journal_name
from turnkeeper.sandbox.command import PROMPT, PROMPT_FILE, AgentCommand
from turnkeeper.sandbox.journal import JournalPaths, exit_sentinel_line, new_nonce
from turnkeeper.sandbox.provider import (
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxProcess,
    SandboxProvider,
    SandboxRef,
    SandboxSpec,
)
from turnkeeper.sandbox.reader import JournalReader, StopSignal, strategy_for
from turnkeeper.sandbox.runner import (
    JournalHandle,
    latest_journal,
    list_journals,
    spawn_journaled,
    stderr_tail,
)

if TYPE_CHECKING:
    from turnkeeper.sandbox.factory import provider_for

__all__ = [
    "PROMPT",
    "PROMPT_FILE",
    "AgentCommand",
    "Capabilities",
    "ExecResult",
    "JournalHandle",
    "JournalPaths",
    "JournalReader",
    "Sandbox",
    "SandboxProcess",
    "SandboxProvider",
    "SandboxRef",
    "SandboxSpec",
    "StopSignal",
    "decode_run_id",
    "encode_run_id",
    "exit_sentinel_line",
    "latest_journal",
    "list_journals",
    "new_nonce",
    "parse_journal_name",
    "provider_for",
    "spawn_journaled",
    "stderr_tail",
    "strategy_for",
]


def __getattr__(name: str) -> Any:
    if name == "provider_for":
        return importlib.import_module("turnkeeper.sandbox.factory").provider_for
    raise AttributeError(name)
