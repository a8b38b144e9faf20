"""An agent's escape sequences never drive the operator's terminal: ``submit --follow``,
``tail`` and ``chat`` show what it wrote without its control characters, ``--raw`` as
it wrote them, and ``tail --json`` escapes every one of them (JSON itself asks only C0).

The agent writes AG-UI lines (format ``agui``), so that each place a conversation shows
its words holds one: the text, a tool's name, its arguments and result, the error."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet
from turnkeeper.driver import lifecycle

TURNKEEPER = [sys.executable, "-m", "turnkeeper"]
ESC, BEL, CSI, DEL = "\x1b", "\x07", "\x9b", "\x7f"

TEXT = (
    f"title {ESC}]0;owned{BEL}clear {ESC}[2J{ESC}[H"
    f"clipboard {ESC}]52;c;ZXZpbA=={ESC}\\csi {CSI}31m"
    f"del {DEL}cr \rbs \x08\n\tline two"
)
TOOL = f"sh{ESC}[31mell"
ARGS = json.dumps({f"c{ESC}]0;x{BEL}md": "ls"})  # the renderer shows keys as they are
RESULT = f"out{ESC}]52;c;eA=={BEL}put{CSI}2J"
FAILURE = f"bad {ESC}[2Jend{CSI}"
EVENTS = [
    {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": TEXT},
    {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
    {"type": "TOOL_CALL_START", "toolCallId": "t1", "toolCallName": TOOL},
    {"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": ARGS},
    {"type": "TOOL_CALL_END", "toolCallId": "t1"},
    {"type": "TOOL_CALL_RESULT", "messageId": "r1", "toolCallId": "t1", "content": RESULT},
    {"type": "RUN_ERROR", "message": FAILURE},
]
# json.dumps escapes every control character and all of non-ASCII: the script is ASCII.
# (No NUL: the payload, and every transcript entry, is jsonb, which has none.)
SCRIPT = "printf '%s\\n' " + " ".join(shlex.quote(json.dumps(event)) for event in EVENTS)
COMMAND = ["/bin/sh", "-c", SCRIPT]


def shown(*, raw: bool) -> str:
    """The conversation as the terminal gets it, after its first line (the run's id)."""
    if raw:  # as the agent wrote it, past rich (which expands tabs and drops a BEL)
        return f'\n{TEXT}\n⏺ {TOOL}(c{ESC}]0;x{BEL}md="ls")\n  ⎿ {RESULT}\n● error: {FAILURE}\n'
    return (
        "\ntitle ]0;ownedclear [2J[Hclipboard ]52;c;ZXZpbA==\\csi 31mdel cr bs \n"
        "        line two\n"  # rich's tab, 8 columns
        '⏺ sh[31mell(c]0;xmd="ls")\n'
        "  ⎿ out]52;c;eA==put2J\n"
        "● error: bad [2Jend\n"
    )


def cli(fleet: Fleet, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """The command's exit code, stdout and stderr, decoded as they are (no newline
    translation: a carriage return stays one)."""
    done = subprocess.run(
        [*TURNKEEPER, *args],
        env=fleet.env,
        input=stdin.encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.fixture
def hostile_fleet(fleet: Fleet, tmp_path: Path) -> Fleet:
    """A worker, and the agent in the catalog too (``chat`` takes catalog agents only)."""
    agents = tmp_path / "agents.toml"
    agents.write_text(f'[agents.hostile]\ncommand = {json.dumps(COMMAND)}\nformat = "agui"\n')
    fleet.env["TURNKEEPER_AGENTS_FILE"] = str(agents)
    fleet.start_worker()
    fleet.wait_ready()  # the commands' own hang guards then time them alone
    return fleet


def test_follow_tail_and_chat_strip_what_an_agent_sends_the_terminal(
    hostile_fleet: Fleet,
) -> None:
    fleet = hostile_fleet
    followed = cli(
        fleet, "submit", "--command", shlex.join(COMMAND), "--format", "agui",
        "--prompt", "hi", "--run-id", "esc", "--follow",
    )  # fmt: skip
    assert followed == (1, "● run esc\n" + shown(raw=False), "")

    tailed = cli(fleet, "tail", "esc")
    assert tailed == (1, "● run esc\n" + shown(raw=False), "")

    raw = cli(fleet, "tail", "esc", "--raw")
    assert raw == (1, "● run esc\n" + shown(raw=True), "")

    chatted = cli(fleet, "chat", "talk", "--agent", "hostile", stdin="hi\n")
    run_id = fleet.client.store.list_runs(session_id="talk", limit=10)[0].run_id
    assert chatted[0] == 0
    assert chatted[1:] == (
        "session talk · hostile · Ctrl-C cancels a turn, Ctrl-D leaves\n"
        f"you> ● run {run_id}\n" + shown(raw=False) + "you> \nsession talk\n",
        "",
    )


def test_raw_follow_and_chat_pass_the_bytes(hostile_fleet: Fleet) -> None:
    fleet = hostile_fleet
    followed = cli(
        fleet, "submit", "--command", shlex.join(COMMAND), "--format", "agui",
        "--prompt", "hi", "--run-id", "raw", "--follow", "--raw",
    )  # fmt: skip
    assert followed == (1, "● run raw\n" + shown(raw=True), "")

    chatted = cli(fleet, "chat", "talk", "--agent", "hostile", "--raw", stdin="hi\n")
    run_id = fleet.client.store.list_runs(session_id="talk", limit=10)[0].run_id
    assert chatted[0] == 0
    assert chatted[1:] == (
        "session talk · hostile · Ctrl-C cancels a turn, Ctrl-D leaves\n"
        f"you> ● run {run_id}\n" + shown(raw=True) + "you> \nsession talk\n",
        "",
    )


def test_tail_json_escapes_every_control_character(hostile_fleet: Fleet) -> None:
    """JSON needs only C0 escaped: DEL and the C1 controls (0x9b is a CSI to a terminal
    that reads them) are escaped too, and the lines still decode to the log."""
    fleet = hostile_fleet
    submitted = cli(
        fleet, "submit", "--command", shlex.join(COMMAND), "--format", "agui",
        "--prompt", "hi", "--run-id", "js",
    )  # fmt: skip
    assert submitted[0] == 0, submitted
    tailed = subprocess.run(
        [*TURNKEEPER, "tail", "js", "--json"],
        env=fleet.env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert tailed.returncode == 1, tailed.stderr
    text = tailed.stdout.decode("utf-8")
    assert [ch for ch in text if ch != "\n" and (ord(ch) < 32 or 127 <= ord(ch) < 160)] == []
    for escaped in ("\\u001b", "\\u0007", "\\u009b", "\\u007f"):
        assert escaped in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines == [{"seq": seq, "chunk": chunk} for seq, chunk in fleet.log_of("js")]
    assert lines[-1]["chunk"] == lifecycle.run_error(FAILURE, "agent-error")
