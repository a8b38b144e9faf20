"""Claude Code's Bash, Read, Write and Edit tools, run for real by the scripted agent.

Each takes Claude Code's input shape and answers as Claude Code would (the same
result texts, ``<tool_use_error>`` for a refused call). Everything stays inside one
working directory: paths are relative to it and may not leave it (symlinks
included), and a command runs as an argv in it, never through a shell.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMMAND_TIMEOUT = 120.0  # seconds, Claude Code's default for Bash


@dataclass(frozen=True)
class Outcome:
    """A tool's answer: the ``tool_result`` content and the line's ``tool_use_result``."""

    content: str
    is_error: bool = False
    detail: Any = None


class Toolbox:
    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd.resolve()

    def run(self, tool: str, arguments: dict[str, Any]) -> Outcome:
        if tool == "Bash":
            return self._bash(str(arguments["command"]))
        if tool not in ("Read", "Write", "Edit"):
            return _refused(f"No such tool available: {tool}")
        shown = str(arguments["file_path"])
        try:
            path = self._inside(shown)
            if tool == "Read":
                return _read(path, shown)
            if tool == "Write":
                return _write(path, shown, str(arguments["content"]))
            return _edit(path, shown, str(arguments["old_string"]), str(arguments["new_string"]))
        except (OSError, ValueError) as exc:  # outside the directory, a directory, not text
            return _refused(str(exc))

    def listing(self) -> frozenset[str]:
        """The names ``ls -1`` would print here."""
        return frozenset(p.name for p in self.cwd.iterdir() if not p.name.startswith("."))

    def _inside(self, relative: str) -> Path:
        path = (self.cwd / relative).resolve()
        if not path.is_relative_to(self.cwd):
            raise ValueError(f"{relative} is outside the working directory")
        return path

    def _bash(self, command: str) -> Outcome:
        argv = shlex.split(command)
        try:
            done = subprocess.run(
                argv,
                cwd=self.cwd,
                capture_output=True,
                text=True,
                check=False,
                timeout=COMMAND_TIMEOUT,
            )
        except FileNotFoundError:
            return _command_failed(127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return _command_failed(143, "", f"Command timed out after {COMMAND_TIMEOUT:g}s")
        stdout, stderr = done.stdout.rstrip("\n"), done.stderr.rstrip("\n")
        if done.returncode != 0:
            return _command_failed(done.returncode, stdout, stderr)
        content = "\n".join(part for part in (stdout, stderr) if part)
        return Outcome(
            content or "(Bash completed with no output)",
            detail={"stdout": stdout, "stderr": stderr, "interrupted": False},
        )


def _command_failed(code: int, stdout: str, stderr: str) -> Outcome:
    output = "\n".join(part for part in (stdout, stderr) if part)
    return Outcome(
        f"Exit code {code}\n{output}".rstrip("\n"),
        is_error=True,
        detail={"stdout": stdout, "stderr": stderr, "interrupted": False},
    )


def _read(path: Path, shown: str) -> Outcome:
    if not path.is_file():
        return _refused("File does not exist.")
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    numbered = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines, start=1))
    file = {"filePath": shown, "content": text, "numLines": len(lines), "startLine": 1}
    return Outcome(numbered, detail={"type": "text", "file": {**file, "totalLines": len(lines)}})


def _write(path: Path, shown: str, content: str) -> Outcome:
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8", newline="")
    kind = "update" if existed else "create"
    message = (
        f"The file {shown} has been updated successfully."
        if existed
        else f"File created successfully at: {shown}"
    )
    return Outcome(message, detail={"type": kind, "filePath": shown, "content": content})


def _edit(path: Path, shown: str, old: str, new: str) -> Outcome:
    if not path.is_file():
        return _refused("File does not exist.")
    text = path.read_text(encoding="utf-8")
    found = text.count(old) if old else 0
    if found == 0:
        return _refused(f"String to replace not found in file.\nString: {old}")
    if found > 1:
        return _refused(
            f"Found {found} matches of the string to replace, but replace_all is false. "
            "To replace all occurrences, set replace_all to true. To replace only one "
            "occurrence, please provide more context to uniquely identify the instance.\n"
            f"String: {old}"
        )
    path.write_text(text.replace(old, new, 1), encoding="utf-8", newline="")
    return Outcome(
        f"The file {shown} has been updated successfully.",
        detail={"filePath": shown, "oldString": old, "newString": new, "replaceAll": False},
    )


def _refused(message: str) -> Outcome:
    return Outcome(f"<tool_use_error>{message}</tool_use_error>", True, f"Error: {message}")
