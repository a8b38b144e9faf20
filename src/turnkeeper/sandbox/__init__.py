"""Sandboxes and the run journal: providers, the jail, journaled agents and their readers."""

from __future__ import annotations

from turnkeeper.sandbox.codec import decode_run_id, encode_run_id, parse_journal_name
from turnkeeper.sandbox.command import PROMPT, PROMPT_FILE, AgentCommand
from turnkeeper.sandbox.factory import provider_for
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
