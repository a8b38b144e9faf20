"""What runs as the agent: its argv, its environment, and how its prompt reaches it.

The prompt and the environment's values are never on an argv that anything but the
agent itself holds: the writer stores them in files of the journal directory, and the
agent's own shell, already inside its sandbox, reads them. An argv element that is
exactly ``{prompt}`` becomes the prompt (read from its file, byte-exact, trailing
newlines included), one that is exactly ``{prompt_file}`` the path of that file; with
``stdin_prompt`` the prompt is also the agent's standard input, which is otherwise
empty. A command given as a string is shell code (tests, trusted operators) that gets
the prompt on standard input.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from turnkeeper.errors import SandboxError

PROMPT = "{prompt}"
PROMPT_FILE = "{prompt_file}"
ENV_FD = 6
"""The writer opens the agent's environment file on this descriptor."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_ARGUMENT_BYTES = 128 * 1024 - 1
"""Linux refuses a single argument longer than this (MAX_ARG_STRLEN, NUL included)."""


@dataclass(frozen=True, slots=True)
class AgentCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    stdin_prompt: bool = False
    read_only: tuple[str, ...] = ()
    """Host paths the agent needs read-only (a preset's interpreter); never a request's."""


@dataclass(frozen=True, slots=True)
class AgentLaunch:
    """Shell code for the writer: ``code`` runs the agent, ``after_exit`` runs once it
    exited, and ``stop`` (for the disk watcher, with the pid of ``code`` in ``$agent``)
    SIGKILLs every process of the agent and no other, even after seconds in which the
    agent's pids may have been freed and taken; empty, the watcher kills the agent's
    process tree as it reads it right then. ``members`` is a file that lists the pid of every
    process of the agent (its cgroup's); without one the watcher reads the agent's process
    tree from every process's parent, which costs a read of each process on the host."""

    code: str
    after_exit: str = ""
    stop: str = ""
    members: str = ""


def env_file(env: Mapping[str, str]) -> bytes:
    """The agent's environment as shell assignments its own shell sources (``set -a``)."""
    lines = []
    for name, value in env.items():
        if ENV_NAME.fullmatch(name) is None or "\x00" in value:
            raise SandboxError(f"invalid environment variable {name!r}", reason="bad-env")
        lines.append(f"{name}={shlex.quote(value)}\n")
    return "".join(lines).encode()


def check_command(command: AgentCommand | str, prompt: bytes, run_id: str) -> None:
    """Refuse, before anything starts, a prompt or an environment variable the kernel
    could not pass to the agent's exec: each is one string there, at most
    ``MAX_ARGUMENT_BYTES`` (``NAME=value`` for a variable)."""
    env = command.env if isinstance(command, AgentCommand) else {}
    for name, value in env.items():
        size = len(name.encode()) + 1 + len(value.encode())
        if size > MAX_ARGUMENT_BYTES:
            raise SandboxError(
                f"the environment variable {name} is {size} bytes as NAME=value, more than "
                f"the {MAX_ARGUMENT_BYTES} one exec can pass: give the agent a file instead",
                run_id=run_id,
                reason="env-too-long",
            )
    as_argument = isinstance(command, AgentCommand) and PROMPT in command.argv
    refusal = prompt_refusal(prompt, as_argument=as_argument)
    if refusal is not None:
        raise SandboxError(refusal.message, run_id=run_id, reason=refusal.reason, **refusal.fields)


@dataclass(frozen=True, slots=True)
class PromptRefusal:
    """Why an agent cannot be given a prompt: ``reason`` is a stable code."""

    reason: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)


def prompt_refusal(prompt: bytes, *, as_argument: bool) -> PromptRefusal | None:
    """Why ``prompt`` (the UTF-8 bytes the agent receives) cannot reach an agent, or None.

    The one decision, made twice: at admission (``AgentSpec.check_prompt``), so that a
    request is refused before a run exists, and again at spawn (``check_command``),
    where the prompt may have grown by the transcript a follow-up recalls. Through
    ``{prompt_file}`` or standard input any prompt goes; as one argument (``{prompt}``)
    the kernel takes at most ``MAX_ARGUMENT_BYTES``, and no NUL.
    """
    if not as_argument:
        return None
    if len(prompt) > MAX_ARGUMENT_BYTES:
        return PromptRefusal(
            "prompt-too-long",
            f"the prompt is {len(prompt)} bytes (UTF-8), and the agent takes it as one "
            f"command-line argument, at most {MAX_ARGUMENT_BYTES} bytes: shorten it, or "
            f"give the agent {PROMPT_FILE} or its standard input instead",
            {"prompt_bytes": len(prompt), "limit_bytes": MAX_ARGUMENT_BYTES},
        )
    if b"\x00" in prompt:
        return PromptRefusal("bad-prompt", "a prompt argument cannot hold NUL")
    return None


def agent_script(
    command: AgentCommand | str, prompt_path: str, rlimits: tuple[int, int] | None = None
) -> str:
    """The shell code, run inside the sandbox, that becomes the agent.

    It reads the prompt first (while PATH is still the base one), then loads the
    agent's environment from ``ENV_FD`` and closes it, then execs the agent.
    ``rlimits`` (memory bytes, processes) caps it where no cgroup can: ``RLIMIT_DATA``
    and ``RLIMIT_NPROC``, never ``RLIMIT_AS``, which breaks Node (V8 reserves far
    more address space than it uses).
    """
    prompt = shlex.quote(prompt_path)
    lines = []
    if rlimits is not None:
        memory, processes = rlimits
        lines.append(f"prlimit --pid $$ --data={memory} --nproc={processes} || exit 125")
    if isinstance(command, AgentCommand) and PROMPT in command.argv:
        lines.append(f"p=$(cat {prompt} && printf x) || exit 125; p=${{p%x}}")
    # Read through the descriptor: a root worker's file cannot be reopened by the agent.
    lines.append(f'set -a; eval "$(cat <&{ENV_FD})" || exit 125; set +a; exec {ENV_FD}<&-')
    if isinstance(command, str):
        lines.append(f"exec <{prompt}\n{command}")
        return "\n".join(lines)
    words = [
        '"$p"' if arg == PROMPT else prompt if arg == PROMPT_FILE else shlex.quote(arg)
        for arg in command.argv
    ]
    stdin = prompt if command.stdin_prompt else "/dev/null"
    lines.append(f"exec {' '.join(words)} <{stdin}")
    return "\n".join(lines)
