"""The docs' shell blocks, run as written, in order, against a real stack.

Every ```sh block of README.md, docs/api.md and docs/agents.md runs, unless the line
before its fence says why not (``<!-- not run: ... -->``: what CI itself runs, a
reference of every command with placeholders, a model key the tests do not have, a
system-wide install). The only change made to a block is its port: 8000 becomes a free
one, so the test can run beside others. Each curl answers 2xx: a harness function wraps
curl to print the status after the body, never changing what the command asks for.

docs/agents.md's walkthrough runs Claude Code from npm against the scripted model
server of tests/integration: the key typed at its prompt is a made-up one, and between
its steps 5 and 6 the test adds what the walkthrough itself says a home-directory
install and a gateway add (the CLI's directories, the model's endpoint and its egress).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.model_server import AnthropicScript, ModelServer
from tests.integration.npm_cache import AgentClis, install_agent_clis
from tests.test_dev import DevStack
from turnkeeper.web.serve import free_port

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"(?P<before>[^\n]*)\n```sh\n(?P<body>.*?)```", re.DOTALL)
_STATUS = re.compile(r"^\[http (\d{3})\]$", re.MULTILINE)
# Appends the status of every curl to $CURL_STATUSES (its stdout stays the command's):
# what the test checks. A file of its own, not the shell's stderr, where a stack started
# in the background writes its logs and could run a line into a status. A block that
# fails stops the stack it started in the background.
_HARNESS = """set -euo pipefail
curl() { command curl -w '%{stderr}[http %{http_code}]\\n' "$@" 2>>"$CURL_STATUSES"; }
trap 'jobs -p | xargs -r kill -TERM 2>/dev/null || true; wait' EXIT
"""
_ERRORS = re.compile(r'"code":"([^"]*)","message":"[^"]*","type":"RUN_ERROR"')


def shell_blocks(markdown: Path) -> list[str]:
    """The ```sh blocks of ``markdown`` that are meant to run, in order."""
    return [
        match["body"]
        for match in _FENCE.finditer(markdown.read_text())
        if not match["before"].startswith("<!-- not run:")
    ]


def _env(tmp_path: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(TURNKEEPER_WEB_PORT=str(port), COLUMNS="200", PYTHONUNBUFFERED="1")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # where `make demo` installed it
    return env


def _run(
    script: str, tmp_path: Path, env: dict[str, str], port: int, typed: str | None = None
) -> tuple[list[str], str]:
    """Run ``script`` (``typed`` on its stdin); the status of each curl it ran, in order,
    and what it printed."""
    statuses_file = Path(tempfile.mkstemp(prefix="curl-statuses-", dir=tmp_path)[1])
    with subprocess.Popen(
        ["bash", "-c", _HARNESS + script.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
        cwd=tmp_path,
        env={**env, "CURL_STATUSES": str(statuses_file)},
        stdin=None if typed is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as shell:
        try:
            out, err = shell.communicate(typed, timeout=600)  # a hang guard
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            out, err = shell.communicate()
            raise AssertionError(f"the blocks hung\n{out[-6000:]}\n{err[-6000:]}") from None
    curls = statuses_file.read_text()
    assert shell.returncode == 0, f"{out[-6000:]}\n{err[-6000:]}\n{curls}"
    # 000: nothing answered yet (a loop that waits for the web app to come up).
    statuses = [status for status in _STATUS.findall(curls) if status != "000"]
    assert [s for s in statuses if not s.startswith("2")] == [], f"{curls}\n{err[-6000:]}"
    return statuses, out


@pytest.mark.slow
@pytest.mark.fleet  # the README's demo
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "turnkeeper").exists(), reason="no .venv")
def test_the_readme_blocks_run_as_written(tmp_path: Path) -> None:
    blocks = shell_blocks(ROOT / "README.md")
    assert len(blocks) == 1, blocks  # the HTTP API walk-through; the others say why not
    port = free_port()
    statuses, out = _run(blocks[0], tmp_path, _env(tmp_path, port), port)
    assert statuses == ["200", "201", "200"]  # up, the run, its events
    assert _ERRORS.findall(out) == [], out  # and the run did its work
    assert out.count('"type":"RUN_FINISHED"') == 1, out


@pytest.mark.slow
@pytest.mark.fleet  # the blocks run against `turnkeeper dev`
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "turnkeeper").exists(), reason="no .venv")
def test_the_api_doc_blocks_run_in_order(tmp_path: Path) -> None:
    port = free_port()
    env = _env(tmp_path, port)
    dev = DevStack({**env, "TURNKEEPER_DATA_DIR": str(tmp_path / ".turnkeeper")})
    try:
        assert dev.up.wait(240), "".join(dev.lines)  # a hang guard
        blocks = "\n".join(shell_blocks(ROOT / "docs" / "api.md"))
        statuses, out = _run(blocks, tmp_path, env, port)
    finally:
        assert dev.stop() == 0, "".join(dev.lines)
    assert len(statuses) == 20, statuses
    # order-42 is cancelled as the doc shows: each of its three reads ends so, but the
    # one resumed after seq 1 reads nothing if the cancel came before any worker did.
    errors = _ERRORS.findall(out)
    assert set(errors) == {"cancelled"}, out
    assert len(errors) in (2, 3), out
    assert out.count('"type":"RUN_FINISHED"') == 1, out  # the AG-UI run


# The doc's "load the settings again" for a second terminal, as it spells it.
_RELOAD = re.compile(r"load the settings again\s*\(`(?P<command>[^`]+)`\)")


def _settings(env_file: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a file ``set -a; . FILE`` loads (a later line wins)."""
    loaded: dict[str, str] = {}
    for line in env_file.read_text().splitlines():
        name, equals, value = line.partition("=")
        if equals:
            loaded[name] = value
    return loaded


@pytest.fixture(scope="module")
def agent_clis() -> AgentClis:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the real agent CLIs come from the npm registry")
    return install_agent_clis()


@pytest.mark.slow
@pytest.mark.fleet
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "turnkeeper").exists(), reason="no .venv")
def test_the_agents_walkthrough_runs_claude_code_against_a_scripted_model(
    tmp_path: Path, agent_clis: AgentClis
) -> None:
    doc = ROOT / "docs" / "agents.md"
    key, catalog, settings, dev_block, doctor, *runs = shell_blocks(doc)
    assert dev_block == "turnkeeper dev\n"  # run below as a DevStack, in the background
    reload = _RELOAD.search(doc.read_text())
    assert reload is not None, "step 6 no longer says how to load the settings again"
    port = free_port()
    env = _env(tmp_path, port)
    env["HOME"] = str(tmp_path / "home")  # ~/.config/turnkeeper/anthropic.key goes here
    with ModelServer(AnthropicScript()) as model:
        # Step 2's home-directory install and a gateway: what they add to each file.
        path = f"{agent_clis.bin_dir}:/usr/local/bin:/usr/bin:/bin"
        additions = f"""
cat >> agents.toml <<EOF
env = {{ PATH = "{path}", ANTHROPIC_BASE_URL = "{model.base_url}" }}
EOF
cat >> turnkeeper.env <<EOF
TURNKEEPER_SANDBOX_RO_BINDS={agent_clis.prefix / "node_modules"}
TURNKEEPER_SANDBOX_EGRESS=$TURNKEEPER_SANDBOX_EGRESS,127.0.0.1:{model.port}
EOF
"""
        _run(key + catalog + settings + additions, tmp_path, env, port, typed="sk-ant-typed\n")
        key_file = tmp_path / "home" / ".config" / "turnkeeper" / "anthropic.key"
        assert key_file.read_text() == "sk-ant-typed\n"
        assert key_file.stat().st_mode & 0o777 == 0o600
        loaded = _settings(tmp_path / "turnkeeper.env")
        dev = DevStack({**env, **loaded, "TURNKEEPER_DATA_DIR": str(tmp_path / ".turnkeeper")})
        try:
            assert dev.up.wait(240), "".join(dev.lines)  # a hang guard
            script = "\n".join([reload["command"], doctor, *runs])
            _, out = _run(script, tmp_path, env, port, typed="and once more\n")  # for chat
        finally:
            assert dev.stop() == 0, "".join(dev.lines)
    assert re.search(
        r"^ok +agent +claude +\S+/claude; 127\.0\.0\.1:\d+ allowed; "
        r"ANTHROPIC_API_KEY from \S+/anthropic\.key$",
        out,
        re.MULTILINE,
    ), out
    # Four runs (the first submit, the session's two, chat's one), each to its end; the
    # three first turns of a conversation ran the model's tool in the jail.
    assert out.count("● finished") == 4, out
    assert out.count("⎿ hello-from-tool") == 3, out
    # A first turn asks twice (the tool call, then its result), a follow-up once.
    assert len(model.scripted_requests()) == 7
