"""What the scripted agent works on: small coding chores, one tool call per turn.

A :class:`Plan` is a pure function of the prompt, the seed and the turn number, so a
process started at turn K says and does exactly what the first process did there.
The one input from outside is the list of files at the start of the turn that
creates the chore's file (the wording says whether the workspace was empty), and
that list is the same for both processes when their workspaces are.

Every plan opens the same way (list the workspace, create the chore's file, read it
back), then does the chore's own work (an edit, a check, a second edit, a second
check), and after that goes over the file again in passes of three steps (read,
check, note the pass in ``worklog.md``) for as many turns as it is given.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

WORKLOG = "worklog.md"
_TASK_CHARS = 80


@dataclass(frozen=True)
class Step:
    """One turn: what the agent says, then the tool it calls with Claude Code's input."""

    text: str
    tool: str  # "Bash" | "Read" | "Write" | "Edit"
    input: dict[str, Any]
    done: str | None = None  # what the step achieved, a clause for the summary


def bash(text: str, argv: list[str], description: str, done: str | None = None) -> Step:
    return Step(text, "Bash", {"command": shlex.join(argv), "description": description}, done)


def edit(text: str, path: str, old: str, new: str, done: str | None = None) -> Step:
    return Step(text, "Edit", {"file_path": path, "old_string": old, "new_string": new}, done)


@dataclass(frozen=True)
class Chore:
    keywords: tuple[str, ...]  # a prompt word starting with one of these picks the chore
    file: str  # the file the agent creates and works on
    purpose: str  # completes "I'll create <file> ..."
    draft: str  # its first content; ``{task}`` stands for the prompt
    created: str
    work: tuple[Step, ...]
    check: list[str]  # the command each later pass re-runs
    finished: str  # said in the summary once all the work is done


_OLD_NAME_GONE = 'import greet; print(hasattr(greet, "hello"), greet.greet("Bob"))'
_PARSE_TOML = ["python3", "-B", "-c", 'import tomllib; print(tomllib.load(open("app.toml", "rb")))']
_TEST_SLUG = ["python3", "-B", "test_slug.py"]
_TEST_CONTENT = """\
from slug import slugify


def test_slugify() -> None:
    assert slugify("Hello World") == "hello-world"


if __name__ == "__main__":
    test_slugify()
    print("test_slugify passed")
"""

CHORES: tuple[Chore, ...] = (
    Chore(
        keywords=("test",),
        file="slug.py",
        purpose="with a small function that needs a test",
        draft=(
            "# Task: {task}\n\n\ndef slugify(title: str) -> str:\n"
            '    return "-".join(title.lower().split())\n'
        ),
        created="created slug.py with a `slugify` function",
        work=(
            Step(
                "`slugify` lowercases a title and joins its words with dashes. "
                "I'll add a test for that.",
                "Write",
                {"file_path": "test_slug.py", "content": _TEST_CONTENT},
                "added test_slug.py",
            ),
            bash("Now let me run it.", _TEST_SLUG, "Run the test", "ran it"),
            edit(
                "It passes. Extra spaces are worth covering too, so I'll add that case.",
                "test_slug.py",
                '    assert slugify("Hello World") == "hello-world"\n',
                '    assert slugify("Hello World") == "hello-world"\n'
                '    assert slugify("  Many   spaces ") == "many-spaces"\n',
                "added a case for extra spaces",
            ),
            bash("And run it again.", _TEST_SLUG, "Run the test again", "ran it again"),
        ),
        check=_TEST_SLUG,
        finished="The test covers the common case and extra spaces, and it passes.",
    ),
    Chore(
        keywords=("rename", "function"),
        file="greet.py",
        purpose="with a small function to work on",
        draft='# Task: {task}\n\n\ndef hello(name):\n    return "Hello, " + name + "!"\n',
        created="created greet.py with a small greeting function",
        work=(
            edit(
                "`hello` doesn't say what the function is for; I'll rename it to `greet` "
                "and add type hints.",
                "greet.py",
                "def hello(name):\n",
                "def greet(name: str) -> str:\n",
                "renamed `hello` to `greet` with type hints",
            ),
            bash(
                "Let me make sure it still works under the new name.",
                ["python3", "-B", "-c", 'from greet import greet; print(greet("Ada"))'],
                "Call the renamed function",
                "checked that it still runs",
            ),
            edit(
                "It prints “Hello, Ada!”. The string concatenation reads better as an f-string.",
                "greet.py",
                '    return "Hello, " + name + "!"\n',
                '    return f"Hello, {name}!"\n',
                "switched it to an f-string",
            ),
            bash(
                "One more check: the old name should be gone and the new one should still work.",
                ["python3", "-B", "-c", _OLD_NAME_GONE],
                "Check that the old name is gone",
                "confirmed the old name is gone",
            ),
        ),
        check=["python3", "-B", "-c", 'from greet import greet; print(greet("Ada"))'],
        finished="`greet` is the only name left, and it greets exactly as before.",
    ),
    Chore(
        keywords=("config", "setting", "toml"),
        file="app.toml",
        purpose="with the settings a small app needs",
        draft=(
            '# Task: {task}\nport = 8080\nhost = "127.0.0.1"\ndebug = true\nlog_level = "debug"\n'
        ),
        created="created app.toml with a few settings",
        work=(
            edit(
                "Debug mode and debug logging shouldn't be the defaults; I'll turn both down.",
                "app.toml",
                'debug = true\nlog_level = "debug"\n',
                'debug = false\nlog_level = "info"\n',
                "turned debugging off by default",
            ),
            bash(
                "Let me check that it still parses.",
                _PARSE_TOML,
                "Parse the config",
                "checked that it parses",
            ),
            edit(
                "It parses. I'll group the settings into [server] and [logging] tables so "
                "they're easier to find.",
                "app.toml",
                'port = 8080\nhost = "127.0.0.1"\ndebug = false\nlog_level = "info"\n',
                '\n[server]\nhost = "127.0.0.1"\nport = 8080\ndebug = false\n\n'
                '[logging]\nlevel = "info"\n',
                "grouped the settings into [server] and [logging]",
            ),
            bash(
                "And parse it once more to be sure the tables came out right.",
                _PARSE_TOML,
                "Parse the config again",
                "parsed it again",
            ),
        ),
        check=_PARSE_TOML,
        finished="app.toml now has [server] and [logging] tables with safe defaults.",
    ),
    Chore(
        keywords=("typo", "spell", "readme", "proofread"),
        file="README.md",
        purpose="stating the task",
        draft=(
            "# Workspace\n\nTask: {task}\n\nThis workspace holds the files for the task. "
            "Each change is\nrecieved as a small, seperate step.\n"
        ),
        created="created README.md stating the task",
        work=(
            edit(
                "Reading it back, I misspelled “received” and “separate”; fixing both.",
                "README.md",
                "recieved as a small, seperate step.\n",
                "received as a small, separate step.\n",
                "fixed two typos",
            ),
            bash(
                "Let me check the corrected line.",
                ["grep", "-n", "-E", "received|separate", "README.md"],
                "Show the corrected line",
                "checked the corrected line",
            ),
            edit(
                "That's spelled right now, but “each change is received” is vague about who "
                "makes the changes; I'll reword it.",
                "README.md",
                "Each change is\nreceived as a small, separate step.\n",
                "I make each\nchange as a small, separate step.\n",
                "reworded a vague sentence",
            ),
            bash(
                "A final look at the reworded line.",
                ["grep", "-n", "-F", "separate step", "README.md"],
                "Show the reworded line",
                "checked the result",
            ),
        ),
        check=["grep", "-n", "-F", "separate step", "README.md"],
        finished="README.md states the task, with no typos left.",
    ),
    Chore(
        keywords=("note", "tidy"),
        file="notes.md",
        purpose="with the task and a short plan",
        draft=(
            "# Notes\n\nTask: {task}\n\n## Plan\n- [ ] look at the workspace\n"
            "- [ ] write these notes\n- [ ] tidy them up\n- [ ] check the result\n"
        ),
        created="created notes.md with the task and a plan",
        work=(
            edit(
                "The first two items are already done, so I'll tick them off.",
                "notes.md",
                "- [ ] look at the workspace\n- [ ] write these notes\n",
                "- [x] look at the workspace\n- [x] write these notes\n",
                "ticked off the finished items",
            ),
            bash(
                "Let me see which items are still open.",
                ["grep", "-n", "-F", "[ ]", "notes.md"],
                "List the open items",
                "checked which items were still open",
            ),
            edit(
                "Two are left, and this tidy-up covers both; I'll tick them and add a "
                "one-line summary.",
                "notes.md",
                "- [ ] tidy them up\n- [ ] check the result\n",
                "- [x] tidy them up\n- [x] check the result\n\n## Summary\n\n"
                "Everything in the plan is done.\n",
                "ticked the rest and added a summary",
            ),
            bash(
                "A last check: all four items should be ticked now.",
                ["grep", "-c", "-F", "[x]", "notes.md"],
                "Count the ticked items",
                "confirmed all four are ticked",
            ),
        ),
        check=["grep", "-c", "-F", "[x]", "notes.md"],
        finished="notes.md now has the task, a finished plan and a summary.",
    ),
)

_OPENINGS = (
    "I'll work on “{task}”. First, let me see what's in the workspace.",
    "Starting on “{task}”. I'll look at what's in the workspace first.",
    "Task: “{task}”. I'll begin by listing the workspace.",
)
_READ_BACKS = (
    "Let me read it back before going on.",
    "I'll read {file} back to check it.",
    "Let me read the file back.",
)
_PASS_READS = (
    "Pass {p}: let me read {file} again and look for anything I missed.",
    "I'll go over {file} once more (pass {p}).",
    "Another look at {file} (pass {p}), in case something else needs fixing.",
)
_PASS_CHECKS = (
    "Nothing else needs changing. Let me re-run the check.",
    "It reads fine. I'll run the check again to be sure.",
    "No further changes there; re-running the check.",
)
_PASS_LOGS = (
    "Still passing; I'll note pass {p} in worklog.md.",
    "Same result as before. Noting pass {p} in worklog.md.",
)
_SUMMARIES = ("Done with “{task}”.", "That's “{task}” done.", "Finished “{task}”.")
_OPENING_STEPS = 3  # list, create, read back


class Plan:
    """The steps and the closing summary of one run of the scripted agent."""

    def __init__(self, prompt: str, seed: int) -> None:
        self.seed = seed
        self.task = _task(prompt)
        self.chore = _pick(self.task, seed)

    @property
    def work_steps(self) -> int:
        """Turns before the passes begin."""
        return _OPENING_STEPS + len(self.chore.work)

    def step(self, k: int, files: frozenset[str] = frozenset()) -> Step:
        """Turn k's step; ``files``, the workspace's names at the turn's start, matter
        only to the turn that creates the chore's file."""
        chore = self.chore
        if k == 0:
            text = _rotate(_OPENINGS, self.seed).replace("{task}", self.task)
            done = "looked at the workspace"
            return bash(text, ["ls", "-1"], "List the files in the workspace", done)
        if k == 1:
            return self._create(files)
        if k == 2:
            text = _rotate(_READ_BACKS, self.seed + 1).replace("{file}", chore.file)
            return Step(text, "Read", {"file_path": chore.file})
        if k < self.work_steps:
            return chore.work[k - _OPENING_STEPS]
        return self._pass_step(k - self.work_steps)

    def summary(self, turns: int) -> str:
        """The closing message after ``turns`` tool-using turns."""
        intro = _rotate(_SUMMARIES, self.seed + 2).replace("{task}", self.task)
        if turns == 0:
            return f"{intro} I haven't needed to change anything."
        clauses = [s.done for k in range(min(turns, self.work_steps)) if (s := self.step(k)).done]
        passes = turns - self.work_steps
        if passes > 0:
            rounds = (passes + 2) // 3
            logged = ", noting each pass in worklog.md" if passes >= 3 else ""
            clauses.append(f"went over {self.chore.file} {_more(rounds)}{logged}")
        said = f"{intro} I {_join(clauses)}."
        return f"{said} {self.chore.finished}" if turns >= self.work_steps else said

    def _create(self, files: frozenset[str]) -> Step:
        chore = self.chore
        if not files:
            text = f"The workspace is empty, so I'll create {chore.file} {chore.purpose}."
        elif chore.file in files:
            text = f"{chore.file} is already here; I'll start it over {chore.purpose}."
        else:
            text = f"There's no {chore.file} yet, so I'll create it {chore.purpose}."
        content = chore.draft.replace("{task}", self.task)
        return Step(text, "Write", {"file_path": chore.file, "content": content}, chore.created)

    def _pass_step(self, j: int) -> Step:
        """Pass p's read, check or log."""
        p, phase = j // 3 + 1, j % 3
        file = self.chore.file
        if phase == 0:
            text = _rotate(_PASS_READS, self.seed + p).replace("{p}", str(p))
            return Step(text.replace("{file}", file), "Read", {"file_path": file})
        if phase == 1:
            text = _rotate(_PASS_CHECKS, self.seed + p)
            return bash(text, self.chore.check, "Re-run the check")
        line = self._log_line(p)
        if p == 1:
            text = "The check still passes. I'll start worklog.md to keep track of these passes."
            return Step(text, "Write", {"file_path": WORKLOG, "content": f"# Worklog\n\n{line}"})
        text = _rotate(_PASS_LOGS, self.seed + p).replace("{p}", str(p))
        previous = self._log_line(p - 1)
        return edit(text, WORKLOG, previous, previous + line)

    def _log_line(self, p: int) -> str:
        check = shlex.join(self.chore.check)
        return f"- Pass {p}: re-read {self.chore.file} and re-ran `{check}`; nothing to change.\n"


def _rotate(choices: tuple[str, ...], n: int) -> str:
    """The seed picks the wording, so runs differ; consecutive passes never repeat."""
    return choices[n % len(choices)]


def _task(prompt: str) -> str:
    """The prompt on one line, short enough to quote in a sentence."""
    task = " ".join(prompt.split()) or "(no task given)"
    return task if len(task) <= _TASK_CHARS else task[: _TASK_CHARS - 1].rstrip() + "…"


def _pick(task: str, seed: int) -> Chore:
    """The chore the prompt names, else one chosen by the seed."""
    words = re.findall(r"[a-z]+", task.lower())
    for chore in CHORES:
        if any(word.startswith(chore.keywords) for word in words):
            return chore
    return CHORES[seed % len(CHORES)]


def _more(n: int) -> str:
    return {1: "once more", 2: "twice more"}.get(n, f"{n} more times")


def _join(clauses: list[str]) -> str:
    if len(clauses) <= 2:
        return " and ".join(clauses)
    return ", ".join(clauses[:-1]) + ", and " + clauses[-1]
