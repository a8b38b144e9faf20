"""Claude Code's tools as the scripted agent runs them: real files, real commands, one
directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnkeeper.agents.toolbox import Outcome, Toolbox


@pytest.fixture
def box(tmp_path: Path) -> Toolbox:
    (tmp_path / "ws").mkdir()
    return Toolbox(tmp_path / "ws")


def test_write_read_and_edit_a_file(box: Toolbox) -> None:
    wrote = box.run("Write", {"file_path": "src/a.txt", "content": "one\ntwo\n"})
    assert wrote.content == "File created successfully at: src/a.txt"
    assert (box.cwd / "src" / "a.txt").read_bytes() == b"one\ntwo\n"
    assert box.run("Read", {"file_path": "src/a.txt"}).content == "     1\tone\n     2\ttwo"
    edited = box.run("Edit", {"file_path": "src/a.txt", "old_string": "two", "new_string": "2"})
    assert edited == Outcome(
        "The file src/a.txt has been updated successfully.",
        False,
        {"filePath": "src/a.txt", "oldString": "two", "newString": "2", "replaceAll": False},
    )
    again = box.run("Write", {"file_path": "src/a.txt", "content": "three\n"})
    assert again.content == "The file src/a.txt has been updated successfully."
    assert (box.cwd / "src" / "a.txt").read_text() == "three\n"
    assert box.listing() == frozenset({"src"})


def test_an_edit_must_match_exactly_once(box: Toolbox) -> None:
    (box.cwd / "a.txt").write_text("x x\n")
    twice = box.run("Edit", {"file_path": "a.txt", "old_string": "x", "new_string": "y"})
    assert twice.is_error
    assert twice.content.startswith("<tool_use_error>Found 2 matches of the string to replace")
    missing = box.run("Edit", {"file_path": "a.txt", "old_string": "z", "new_string": "y"})
    assert missing == Outcome(
        "<tool_use_error>String to replace not found in file.\nString: z</tool_use_error>",
        True,
        "Error: String to replace not found in file.\nString: z",
    )
    assert (box.cwd / "a.txt").read_text() == "x x\n", "a refused edit changes nothing"
    gone = box.run("Read", {"file_path": "b.txt"})
    assert (gone.content, gone.is_error) == (
        "<tool_use_error>File does not exist.</tool_use_error>",
        True,
    )


@pytest.mark.parametrize("path", ["../outside.txt", "/tmp/outside.txt", "link/outside.txt"])
def test_files_outside_the_working_directory_are_refused(
    box: Toolbox, tmp_path: Path, path: str
) -> None:
    (box.cwd / "link").symlink_to(tmp_path)
    for tool, extra in (
        ("Write", {"content": "x"}),
        ("Read", {}),
        ("Edit", {"old_string": "a", "new_string": "b"}),
    ):
        outcome = box.run(tool, {"file_path": path, **extra})
        assert outcome.content == (
            f"<tool_use_error>{path} is outside the working directory</tool_use_error>"
        )
        assert outcome.is_error
    assert not (tmp_path / "outside.txt").exists()


def test_a_command_runs_as_argv_in_the_directory_without_a_shell(box: Toolbox) -> None:
    (box.cwd / "a.txt").write_text("hello\n")
    listed = box.run("Bash", {"command": "ls -1", "description": "List"})
    assert listed == Outcome(
        "a.txt", False, {"stdout": "a.txt", "stderr": "", "interrupted": False}
    )
    literal = box.run("Bash", {"command": "echo $HOME; rm a.txt", "description": "No shell"})
    assert literal.content == "$HOME; rm a.txt"
    assert (box.cwd / "a.txt").exists()
    quiet = box.run("Bash", {"command": "true", "description": "Nothing"})
    assert quiet.content == "(Bash completed with no output)"


def test_a_failing_command_reports_its_exit_code(box: Toolbox) -> None:
    failed = box.run("Bash", {"command": "grep -n absent a.txt", "description": "Search"})
    assert failed.is_error
    assert failed.content == "Exit code 2\ngrep: a.txt: No such file or directory"
    unknown = box.run("Bash", {"command": "no-such-tool-here --x", "description": "Nothing"})
    assert (unknown.content, unknown.is_error) == (
        "Exit code 127\nno-such-tool-here: command not found",
        True,
    )
    assert box.run("Glob", {"pattern": "*"}).content == (
        "<tool_use_error>No such tool available: Glob</tool_use_error>"
    )
