"""The real Claude Code CLI, offline against the scripted Messages API, through the translator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.agent_runs import (
    CLAUDE_FLAGS,
    PROMPT,
    anthropic_tool_results,
    claude_chunks,
    claude_env,
    json_lines,
    only,
    run_cli,
    translate,
)
from tests.integration.model_server import ModelServer
from tests.integration.npm_cache import AgentClis

pytestmark = pytest.mark.slow

RUN = "run-cc"
TOOL_RESULT = {"tool_use_id": "toolu_01", "type": "tool_result", "content": "hello-from-tool"}


@pytest.mark.parametrize("partial", [False, True], ids=["full-messages", "partial-messages"])
def test_claude_code_stream_json_translates_to_the_expected_chunks(
    agent_clis: AgentClis, anthropic_server: ModelServer, tmp_path: Path, partial: bool
) -> None:
    flags = [*CLAUDE_FLAGS, "--include-partial-messages"] if partial else CLAUDE_FLAGS
    argv = [str(agent_clis.claude), "-p", PROMPT, *flags]
    done = run_cli(argv, claude_env(agent_clis, anthropic_server, tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]

    # The CLI asked twice, and its second request carried the tool's real output.
    requests = anthropic_server.requests
    assert [(r.method, r.path.split("?")[0]) for r in requests] == [("POST", "/v1/messages")] * 2
    results = [
        [{k: v for k, v in block.items() if k != "cache_control"} for block in blocks]
        for blocks in map(anthropic_tool_results, requests)
    ]
    assert results == [[], [{**TOOL_RESULT, "is_error": False}]]
    events = json_lines(done.stdout)
    tool_line = only(events, type="user")
    assert tool_line["message"]["content"] == [{**TOOL_RESULT, "is_error": False}]
    assert tool_line["tool_use_result"]["stdout"] == "hello-from-tool"
    assert any(e["type"] == "stream_event" for e in events) is partial

    init = only(events, type="system", subtype="init")
    assert init["model"] == requests[0].body["model"]
    result = only(events, type="result")
    assert (result["is_error"], result["result"]) == (
        False,
        "The command printed hello-from-tool. All done.",
    )

    chunks = translate("claude-code", done.stdout.splitlines(keepends=True), RUN)
    assert chunks == claude_chunks(
        RUN, session_id=init["session_id"], model=init["model"], result=result, partial=partial
    )
