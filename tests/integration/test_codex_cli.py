"""The real Codex CLI, offline against the scripted Responses API, through the translator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.agent_runs import (
    CODEX_FLAGS,
    PROMPT,
    codex_chunks,
    codex_env,
    json_lines,
    only,
    responses_tool_outputs,
    run_cli,
    translate,
)
from tests.integration.model_server import ModelServer
from tests.integration.npm_cache import AgentClis

pytestmark = pytest.mark.slow

RUN = "run-cx"


def test_codex_exec_json_translates_to_the_expected_chunks(
    agent_clis: AgentClis, responses_server: ModelServer, tmp_path: Path
) -> None:
    argv = [str(agent_clis.codex), "exec", "--json", *CODEX_FLAGS, PROMPT]
    done = run_cli(argv, codex_env(agent_clis, responses_server, tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]

    # Codex asked twice; the second request carried the command's real output.
    requests = responses_server.requests
    assert [(r.method, r.path) for r in requests] == [("POST", "/v1/responses")] * 2
    assert responses_tool_outputs(requests[0]) == []
    [output] = responses_tool_outputs(requests[1])
    assert output["call_id"] == "call_scripted_1"
    assert output["output"].endswith("Output:\nhello-from-tool\n")

    events = json_lines(done.stdout)
    [ran] = [
        e["item"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"
    ]
    assert (ran["aggregated_output"], ran["exit_code"]) == ("hello-from-tool\n", 0)
    thread = only(events, type="thread.started")

    chunks = translate("codex", done.stdout.splitlines(keepends=True), RUN)
    assert chunks == codex_chunks(RUN, thread_id=thread["thread_id"])
