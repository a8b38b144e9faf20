"""The real CLIs started the way a worker starts them: preset argv, journaled, jailed.

Each CLI runs detached in the default provider's jail (bwrap, as a sandbox uid, no
network), with only the sandbox's minimal environment plus what its spec names (HOME is
the workspace). It sees its install through ``TURNKEEPER_SANDBOX_RO_BINDS`` (exactly the
npm cache directory) and reaches its scripted model server, on the host's loopback, only
through the egress proxy, whose allowlist names that server alone. Its stdout goes to
the run journal, and the journal read back through :class:`JournalReader` must
translate to exactly the chunks a direct run gives.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integration.agent_runs import (
    PROMPT,
    RUN_TIMEOUT,
    claude_chunks,
    claude_env,
    codex_chunks,
    codex_env,
    json_lines,
    only,
    translate,
)
from tests.integration.model_server import ModelServer
from tests.integration.npm_cache import AgentClis, cache_root
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.config import Settings
from turnkeeper.sandbox import (
    JournalReader,
    SandboxSpec,
    StopSignal,
    spawn_journaled,
    stderr_tail,
)
from turnkeeper.sandbox.egress import stop_proxies
from turnkeeper.sandbox.factory import provider_for
from turnkeeper.sandbox.local import SandboxState
from turnkeeper.sandbox.uids import UidPool

pytestmark = pytest.mark.slow


def run_journaled(
    tmp_path: Path,
    server: ModelServer,
    run_id: str,
    spec: AgentSpec,
    env_for: Callable[[Path], dict[str, str]],
) -> tuple[list[bytes], int | None]:
    """Spawn the spec's command journaled in a fresh jail; its lines and exit code."""
    settings = Settings(
        data_dir=tmp_path / "data",
        sandbox_ro_binds=str(cache_root()),
        sandbox_egress=f"127.0.0.1:{server.port}",
    )
    provider = provider_for("bwrap", settings)
    ref = provider.create(run_id, SandboxSpec())
    # HOME stays the sandbox's own (its workspace), where the env builder writes configs
    # that the agent's uid must own.
    env = {k: v for k, v in env_for(Path(ref.workspace)).items() if k != "HOME"}
    uid = SandboxState.read(Path(ref.root)).uid
    if uid is not None:
        group = UidPool(*settings.sandbox_uid_range).group
        for path in [Path(ref.workspace), *Path(ref.workspace).rglob("*")]:
            os.chown(path, uid, group)
    sandbox = provider.resume(ref)
    assert sandbox is not None
    stop = StopSignal()
    guard = threading.Timer(RUN_TIMEOUT, stop.set)  # a hang guard, not an expectation
    guard.start()
    try:
        command = replace(spec.start_command(), env={**env, **spec.env})
        handle = spawn_journaled(sandbox, run_id, command, prompt=PROMPT.encode())
        reader = JournalReader(
            sandbox,
            handle.paths,
            nonce=handle.nonce,
            stop=stop,
            first_byte_timeout=RUN_TIMEOUT,
        )
        lines = [line for line, _ in reader]
        if reader.exit_code != 0:  # what the CLI said, in the assertion's report
            print(b"\n".join(lines).decode(errors="replace")[-3000:])
            print(stderr_tail(sandbox, handle.paths).decode(errors="replace"))
        return lines, reader.exit_code
    finally:
        guard.cancel()
        stop.close()
        provider.destroy(ref)
        stop_proxies(settings.data_dir)


def test_claude_code_preset_journaled_translates_like_a_direct_run(
    agent_clis: AgentClis, anthropic_server: ModelServer, tmp_path: Path
) -> None:
    run_id = "run-cc-journaled"
    spec = AgentSpec.from_payload("claude-code")  # as shipped: its tool call must run
    lines, exit_code = run_journaled(
        tmp_path,
        anthropic_server,
        run_id,
        spec,
        lambda home: claude_env(agent_clis, anthropic_server, home),
    )
    assert exit_code == 0
    events = json_lines(b"\n".join(lines))
    assert only(events, type="user")["tool_use_result"]["stdout"] == "hello-from-tool"
    init = only(events, type="system", subtype="init")
    assert init["cwd"].endswith("/workspace")
    assert init["model"] == anthropic_server.requests[0].body["model"]
    result = only(events, type="result")
    # the preset streams partial messages
    assert translate(spec.format, lines, run_id) == claude_chunks(
        run_id, session_id=init["session_id"], model=init["model"], result=result, partial=True
    )


def test_codex_preset_journaled_translates_like_a_direct_run(
    agent_clis: AgentClis, responses_server: ModelServer, tmp_path: Path
) -> None:
    run_id = "run-cx-journaled"
    spec = AgentSpec.from_payload("codex")  # as shipped: outside git, no nested sandbox
    lines, exit_code = run_journaled(
        tmp_path,
        responses_server,
        run_id,
        spec,
        lambda home: codex_env(agent_clis, responses_server, home),
    )
    assert exit_code == 0
    events = json_lines(b"\n".join(lines))
    [ran] = [
        e["item"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"
    ]
    assert (ran["aggregated_output"], ran["exit_code"]) == ("hello-from-tool\n", 0)
    thread = only(events, type="thread.started")
    assert translate(spec.format, lines, run_id) == codex_chunks(
        run_id, thread_id=thread["thread_id"]
    )
