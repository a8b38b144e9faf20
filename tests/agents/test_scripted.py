"""The bundled scripted agent, run as a real process and translated."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agents.helpers import translate_all
from turnkeeper.agents.chores import CHORES, Plan
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.agents.translator import TurnEvent, TurnTracker

DEMO_PROMPT = "Tidy the workspace and take notes"


def _run(
    workspace: Path, prompt: str = DEMO_PROMPT, *extra: str, seed: int = 1, turns: int = 4
) -> subprocess.CompletedProcess[bytes]:
    workspace.mkdir(parents=True, exist_ok=True)
    options = {"preset": "scripted", "seed": seed, "turns": turns, "pace": 0}
    argv = AgentSpec.from_payload(options).argv(prompt) + list(extra)
    done = subprocess.run(argv, cwd=workspace, capture_output=True, check=False, timeout=120)
    assert done.stderr == b""
    return done


def _conversation(stdout: bytes) -> list[tuple[Any, ...]]:
    """What a reader sees: each full message's text or tool call, each tool result."""
    said: list[tuple[Any, ...]] = []
    for line in map(orjson.loads, stdout.splitlines()):
        for block in line.get("message", {}).get("content", []):
            if block["type"] == "text":
                said.append(("say", block["text"]))
            elif block["type"] == "tool_use":
                said.append(("call", block["name"], block["input"]))
            elif block["type"] == "tool_result":
                said.append(("result", block["content"], block["is_error"]))
    return said


def _files(workspace: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(workspace.iterdir())}


NOTES_DRAFT = (
    "# Notes\n\nTask: Tidy the workspace and take notes\n\n## Plan\n"
    "- [ ] look at the workspace\n- [ ] write these notes\n- [ ] tidy them up\n"
    "- [ ] check the result\n"
)


def test_the_demo_run_reads_like_a_coding_agent_at_work(tmp_path: Path) -> None:
    done = _run(tmp_path / "ws")
    assert done.returncode == 0
    ticked = "- [x] look at the workspace\n- [x] write these notes\n"
    assert _conversation(done.stdout) == [
        (
            "say",
            (
                "Starting on “Tidy the workspace and take notes”. "
                "I'll look at what's in the workspace first."
            ),
        ),
        ("call", "Bash", {"command": "ls -1", "description": "List the files in the workspace"}),
        ("result", "(Bash completed with no output)", False),
        ("say", "The workspace is empty, so I'll create notes.md with the task and a short plan."),
        ("call", "Write", {"file_path": "notes.md", "content": NOTES_DRAFT}),
        ("result", "File created successfully at: notes.md", False),
        ("say", "Let me read the file back."),
        ("call", "Read", {"file_path": "notes.md"}),
        (
            "result",
            (
                "     1\t# Notes\n     2\t\n     3\tTask: Tidy the workspace and take notes\n"
                "     4\t\n     5\t## Plan\n     6\t- [ ] look at the workspace\n"
                "     7\t- [ ] write these notes\n     8\t- [ ] tidy them up\n"
                "     9\t- [ ] check the result"
            ),
            False,
        ),
        ("say", "The first two items are already done, so I'll tick them off."),
        (
            "call",
            "Edit",
            {
                "file_path": "notes.md",
                "old_string": ticked.replace("[x]", "[ ]"),
                "new_string": ticked,
            },
        ),
        ("result", "The file notes.md has been updated successfully.", False),
        (
            "say",
            (
                "Done with “Tidy the workspace and take notes”. I looked at the workspace, created "
                "notes.md with the task and a plan, and ticked off the finished items."
            ),
        ),
    ]
    assert _files(tmp_path / "ws") == {
        "notes.md": NOTES_DRAFT.replace(ticked.replace("[x]", "[ ]"), ticked)
    }
    result = orjson.loads(done.stdout.splitlines()[-1])
    assert (result["num_turns"], result["is_error"]) == (5, False)
    assert result["result"] == _conversation(done.stdout)[-1][1]
    # each request's context grows by 120 tokens a turn; outputs are a quarter of the chars
    assert result["usage"]["input_tokens"] == sum(1500 + 120 * k for k in range(5))


def test_a_long_run_does_the_chore_then_goes_over_it_in_passes(tmp_path: Path) -> None:
    done = _run(tmp_path / "ws", "add a test", seed=0, turns=13)
    assert done.returncode == 0
    said = _conversation(done.stdout)
    calls = [(c[1], c[2].get("file_path") or c[2]["command"]) for c in said if c[0] == "call"]
    assert calls == [
        ("Bash", "ls -1"),
        ("Write", "slug.py"),
        ("Read", "slug.py"),
        ("Write", "test_slug.py"),
        ("Bash", "python3 -B test_slug.py"),
        ("Edit", "test_slug.py"),
        ("Bash", "python3 -B test_slug.py"),
        *[("Read", "slug.py"), ("Bash", "python3 -B test_slug.py")],
        ("Write", "worklog.md"),
        *[("Read", "slug.py"), ("Bash", "python3 -B test_slug.py")],
        ("Edit", "worklog.md"),
    ]
    results = [c for c in said if c[0] == "result"]
    assert [r[1] for r in results if r[1].startswith("test_")] == ["test_slugify passed"] * 4
    assert not any(r[2] for r in results)
    texts = [c[1] for c in said if c[0] == "say"]
    assert len(set(texts)) == len(texts), "no sentence is said twice"
    assert texts[-1] == (
        "Finished “add a test”. I looked at the workspace, created slug.py with a `slugify` "
        "function, added test_slug.py, ran it, added a case for extra spaces, ran it again, and "
        "went over slug.py twice more, noting each pass in worklog.md. The test covers the "
        "common case and extra spaces, and it passes."
    )
    log = "re-read slug.py and re-ran `python3 -B test_slug.py`; nothing to change.\n"
    assert _files(tmp_path / "ws")["worklog.md"] == f"# Worklog\n\n- Pass 1: {log}- Pass 2: {log}"
    assert sorted(_files(tmp_path / "ws")) == ["slug.py", "test_slug.py", "worklog.md"]


@pytest.mark.parametrize("seed", range(len(CHORES)))
def test_every_chore_translates_cleanly_with_no_tool_failing(tmp_path: Path, seed: int) -> None:
    """Each chore (picked by the seed for a prompt that names none) through the claude-code
    translator, line by line: no RAW chunk, no CUSTOM one but the session and the usage."""
    done = _run(tmp_path / "ws", "check the greeting", seed=seed, turns=13)
    chunks = translate_all("claude-code", done.stdout, run_id="s")
    assert not [c for c in chunks if c["type"] == "RAW"]
    customs = [c["name"] for c in chunks if c["type"] == "CUSTOM"]
    assert customs == ["turnkeeper.session", "turnkeeper.usage"]
    assert (chunks[0]["name"], chunks[-1]["name"]) == tuple(customs)

    said = _conversation(done.stdout)
    assert [r for r in said if r[0] == "result" and r[2]] == [], "every tool call succeeded"
    assert [c["content"] for c in chunks if c["type"] == "TOOL_CALL_RESULT"] == [
        r[1] for r in said if r[0] == "result"
    ]
    pieces: dict[str, list[str]] = {}
    for chunk in chunks:
        if chunk["type"] == "TEXT_MESSAGE_CONTENT":
            pieces.setdefault(chunk["messageId"], []).append(chunk["delta"])
    assert ["".join(p) for p in pieces.values()] == [s[1] for s in said if s[0] == "say"]
    for message in pieces.values():  # cut only after a space: at word boundaries
        assert len(message) > 1
        assert all(p.endswith(" ") for p in message[:-1])
        assert not message[-1].endswith(" ")
        assert not any(p.startswith(" ") for p in message)
    kinds = [c["type"] for c in chunks]
    assert kinds.count("TEXT_MESSAGE_START") == kinds.count("TEXT_MESSAGE_END") == 14
    assert kinds.count("TOOL_CALL_START") == kinds.count("TOOL_CALL_END") == 13
    tracker = TurnTracker()
    events = [e for c in chunks if (e := tracker.observe(c)) is not None]
    assert events == [TurnEvent.TOOL_REQUEST_RECORDED, TurnEvent.TURN_COMPLETE] * 13
    args = [c for c in chunks if c["type"] == "TOOL_CALL_ARGS"]
    assert len(args) > 13, "each tool input streams in several pieces"


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    first = _run(tmp_path / "ws", "add a test", seed=0, turns=13)
    (tmp_path / "ws").rename(tmp_path / "first")
    second = _run(tmp_path / "ws", "add a test", seed=0, turns=13)  # the same path, fresh
    assert first.stdout != b""
    assert second.stdout == first.stdout
    assert _files(tmp_path / "ws") == _files(tmp_path / "first")
    # the tool output is real: a workspace that already holds the file reads differently
    third = _run(tmp_path / "ws", "add a test", seed=0, turns=13)
    assert third.stdout != first.stdout
    again = "slug.py is already here; I'll start it over with a small function that needs a test."
    assert _conversation(third.stdout)[3:6] == [
        ("say", again),
        _conversation(first.stdout)[4],
        ("result", "The file slug.py has been updated successfully.", False),
    ]


def test_another_seed_another_chore_and_wording(tmp_path: Path) -> None:
    runs = [_run(tmp_path / f"ws{seed}", "check the greeting", seed=seed) for seed in (0, 1)]
    first, second = (_conversation(run.stdout) for run in runs)
    assert first[0] != second[0]
    assert first[4][2]["file_path"] == "slug.py"
    assert second[4][2]["file_path"] == "greet.py"


def test_a_continuation_prints_exactly_the_remaining_turns(tmp_path: Path) -> None:
    """``--start-turn K``, in a workspace where turns 0..K-1 already ran, prints what the
    uninterrupted process printed from turn K on, for every K. Every run uses the same
    directory, as the init line names it."""
    seed, turns, workspace = 4, 13, tmp_path / "ws"  # the README chore, into its passes
    whole = _run(workspace, "check the greeting", seed=seed, turns=turns).stdout.splitlines()
    finished = _files(workspace)
    for k in range(turns + 1):
        shutil.rmtree(workspace)
        _run(workspace, "check the greeting", seed=seed, turns=k)  # turns 0..k-1, a summary
        resumed = _run(
            workspace, "check the greeting", "--start-turn", str(k), seed=seed, turns=turns
        )
        rest = resumed.stdout.splitlines()
        message = f'"msg_scripted_{seed}_{k}"'.encode()
        status = next(i for i, line in enumerate(whole) if message in line) - 1
        assert rest[0] == whole[0], "the same init line, session id included"
        assert rest[1:-1] == whole[status:-1], f"turn {k} on, from its status line"
        assert orjson.loads(rest[-1])["num_turns"] == turns + 1 - k
        assert _files(workspace) == finished


def test_error_and_exit_code_options(tmp_path: Path) -> None:
    done = _run(tmp_path / "ws", "x", "--error", "model overloaded", "--exit-code", "3", turns=0)
    assert done.returncode == 3
    chunks = translate_all("claude-code", done.stdout, run_id="s")
    assert chunks[-1] == {
        "type": "CUSTOM",
        "name": "turnkeeper.agent_error",
        "value": {"agent": "claude-code", "message": "model overloaded", "fatal": True},
    }


def test_the_plan_picks_the_chore_the_prompt_names() -> None:
    picked = {
        prompt: Plan(prompt, seed=0).chore.file
        for prompt in (
            "fix a typo in the docs",
            "add a test for slugify",
            "tidy the config",
            "rename a function",
            "tidy up the notes",
        )
    }
    assert picked == {
        "fix a typo in the docs": "README.md",
        "add a test for slugify": "slug.py",
        "tidy the config": "app.toml",
        "rename a function": "greet.py",
        "tidy up the notes": "notes.md",
    }
    assert {Plan("do it", seed).chore.file for seed in range(5)} == {c.file for c in CHORES}


def test_the_file_it_creates_is_announced_as_the_workspace_stands() -> None:
    plan = Plan("tidy up the notes", seed=0)
    assert [plan.step(1, frozenset(names)).text for names in ([], ["a.txt"], ["notes.md"])] == [
        "The workspace is empty, so I'll create notes.md with the task and a short plan.",
        "There's no notes.md yet, so I'll create it with the task and a short plan.",
        "notes.md is already here; I'll start it over with the task and a short plan.",
    ]


def test_a_long_prompt_is_quoted_on_one_line_and_clipped() -> None:
    plan = Plan("  fix\nthe   typo " + "x" * 200, seed=2)
    assert plan.task == "fix the typo " + "x" * 66 + "…"
    assert len(plan.task) == 80
    assert f"“{plan.task}”" in plan.step(0).text
    assert plan.summary(0) == f"That's “{plan.task}” done. I haven't needed to change anything."


def test_the_passes_go_on_for_any_number_of_turns() -> None:
    plan = Plan("tidy up the notes", seed=3)
    steps = [plan.step(k) for k in range(9_990, 10_000)]
    assert [s.tool for s in steps] == ["Edit", "Read", "Bash"] * 3 + ["Edit"]
    reads = [s.text for s in steps if s.tool == "Read"]
    assert all(a != b for a, b in itertools.pairwise(reads)), "passes in a row read differently"
    log = steps[-1].input
    assert log["new_string"] == log["old_string"] + log["old_string"].replace("3330", "3331")
    assert "went over notes.md 3331 more times" in plan.summary(10_000)


def test_the_module_runs_with_python_dash_m(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnkeeper.agents.scripted", "--help"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0
    assert b"--start-turn" in done.stdout
