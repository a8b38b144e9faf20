"""The real Claude Code and Codex CLIs (from npm, installed once) and scripted model servers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.integration.model_server import AnthropicScript, ModelServer, ResponsesScript
from tests.integration.npm_cache import AgentClis, install_agent_clis


@pytest.fixture(scope="session")
def agent_clis() -> AgentClis:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the real agent CLIs come from the npm registry")
    return install_agent_clis()


@pytest.fixture
def anthropic_server() -> Iterator[ModelServer]:
    with ModelServer(AnthropicScript()) as server:
        yield server


@pytest.fixture
def responses_server() -> Iterator[ModelServer]:
    with ModelServer(ResponsesScript()) as server:
        yield server
