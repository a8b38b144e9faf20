"""The trusted client makes the admission's prompt decision too (``AgentSpec.check_prompt``):
a prompt the agent can never be given is refused before a run exists, not failed by
its spawn after a worker took it."""

from __future__ import annotations

import asyncio

import pytest

from tests.driver.fleet import Fleet
from turnkeeper.client import AsyncClient
from turnkeeper.errors import PromptTooLongError
from turnkeeper.sandbox.command import MAX_ARGUMENT_BYTES


def test_the_client_refuses_a_prompt_the_agent_cannot_take(fleet: Fleet) -> None:
    client = fleet.client
    with pytest.raises(PromptTooLongError) as caught:
        client.submit("scripted", "ü" * 100_000, run_id="too-long")  # 200,000 bytes
    assert (caught.value.reason, caught.value.fields) == (
        "prompt-too-long",
        {"prompt_bytes": 200_000, "limit_bytes": MAX_ARGUMENT_BYTES},
    )
    assert caught.value.message.startswith("the prompt is 200000 bytes (UTF-8)")

    async def submit_async() -> None:
        async with AsyncClient.from_settings(fleet.settings) as aclient:
            await aclient.submit("scripted", "x" * (MAX_ARGUMENT_BYTES + 1), run_id="async")

    with pytest.raises(PromptTooLongError):
        asyncio.run(submit_async())
    assert client.list_runs() == []
    # At the limit, on standard input, or empty (a trusted command may read no input):
    # admitted.
    client.submit("scripted", "x" * MAX_ARGUMENT_BYTES, run_id="at-limit")
    client.submit("claude-code", "ü" * 100_000, run_id="on-stdin")
    client.submit({"command": ["true"], "format": "text"}, "", run_id="no-input")
    assert sorted(run.run_id for run in client.list_runs()) == ["at-limit", "no-input", "on-stdin"]
