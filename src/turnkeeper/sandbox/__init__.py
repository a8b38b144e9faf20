"""Sandboxes and the run journal: providers, journaled agents, readers, probes and pruning."""

from __future__ import annotations

from turnkeeper.sandbox.codec import decode_run_id, encode_run_id, parse_journal_name
from turnkeeper.sandbox.factory import provider_for
from turnkeeper.sandbox.journal import JournalPaths, exit_sentinel_line, sentinel_nonce
from turnkeeper.sandbox.preflight import RunStatusLookup, await_attachable_journal
from turnkeeper.sandbox.probe import ExitProbe, cleanup_journal, probe_exit, stderr_tail
from turnkeeper.sandbox.provider import (
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxProcess,
    SandboxProvider,
    SandboxRef,
    SandboxSpec,
)
from turnkeeper.sandbox.prune import PruneResult, prune_journals
from turnkeeper.sandbox.reader import JournalReader, StopSignal, strategy_for
from turnkeeper.sandbox.runner import (
    JournalHandle,
    latest_journal,
    list_journals,
    nonce_for,
    spawn_journaled,
)

__all__ = [
    "Capabilities",
    "ExecResult",
    "ExitProbe",
    "JournalHandle",
    "JournalPaths",
    "JournalReader",
    "PruneResult",
    "RunStatusLookup",
    "Sandbox",
    "SandboxProcess",
    "SandboxProvider",
    "SandboxRef",
    "SandboxSpec",
    "StopSignal",
    "await_attachable_journal",
    "cleanup_journal",
    "decode_run_id",
    "encode_run_id",
    "exit_sentinel_line",
    "latest_journal",
    "list_journals",
    "nonce_for",
    "parse_journal_name",
    "probe_exit",
    "provider_for",
    "prune_journals",
    "sentinel_nonce",
    "spawn_journaled",
    "stderr_tail",
    "strategy_for",
]
