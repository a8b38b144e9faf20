"""The bundled scripted agent: a real process that talks like Claude Code.

``python -m turnkeeper.agents.scripted --prompt P --seed S --turns N --pace SECONDS``
prints the stream-json transcript that ``claude -p P --output-format stream-json
--verbose --include-partial-messages`` would print for a model doing a small coding
chore (see :mod:`turnkeeper.agents.chores`): in each of N turns it says a sentence
(streamed as text deltas split at word boundaries, then the full message) and calls
one of Claude Code's tools (``Bash``, ``Read``, ``Write``, ``Edit``, with their input
shapes, streamed as ``input_json_delta`` pieces, then the full message); a last turn
summarises what it did, and a ``result`` line with usage ends the run. The tools
really run in the working directory (:mod:`turnkeeper.agents.toolbox`), and their
real output is the ``tool_result``. Paths stay relative to the working directory, so
two runs in different directories print the same bytes.

Deterministic: everything printed comes from the seed, the prompt, the turn number
and the tools' real output, which shows only what the agent itself wrote; nothing
from a clock (``duration_ms`` is derived from the seed). Turn k's lines are the same
whether or not the process started at turn 0, so ``--start-turn K`` continues an
interrupted run as a new process would (``claude --resume``): an init line with the
same session id, then turns K..N. Every line is flushed at once; ``--pace`` seconds
pass after each line. ``--error MESSAGE`` ends with an ``is_error`` result,
``--exit-code`` sets the exit status (0 by default).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from turnkeeper.agents.chores import Plan
from turnkeeper.agents.toolbox import Toolbox

MODEL = "scripted-sonnet-1"
VERSION = "scripted-1"
TOOLS = ["Bash", "Edit", "Read", "Write"]


class _Agent:
    def __init__(self, *, prompt: str, seed: int, turns: int, session_id: str, cwd: Path) -> None:
        self.plan = Plan(prompt, seed)
        self.toolbox = Toolbox(cwd)
        self.seed = seed
        self.turns = turns
        self.session_id = session_id
        self.cwd = cwd
        self.input_tokens = 0  # summed over the turns this process printed
        self.output_tokens = 0
        self._scope = "init"  # line uuids depend on (scope, index), so a turn is the
        self._lines = 0  # same whichever process printed it

    def _enter(self, scope: str) -> None:
        self._scope, self._lines = scope, 0

    def _line(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._lines += 1
        rng = random.Random(f"{self.seed}:{self._scope}:{self._lines}")  # noqa: S311 - ids only
        obj.setdefault("session_id", self.session_id)
        obj.setdefault("uuid", str(uuid.UUID(int=rng.getrandbits(128), version=4)))
        return obj

    def _stream(self, message_id: str, event: dict[str, Any]) -> dict[str, Any]:
        return self._line(
            {
                "type": "stream_event",
                "event": event,
                "parent_tool_use_id": None,
                "api_message_id": message_id,
            }
        )

    def _message(self, message_id: str, content: list[dict[str, Any]], k: int) -> dict[str, Any]:
        return {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": _context_tokens(k), "output_tokens": 1},
        }

    def _assistant(self, message_id: str, block: dict[str, Any], k: int) -> dict[str, Any]:
        message = self._message(message_id, [block], k)
        return self._line({"type": "assistant", "message": message, "parent_tool_use_id": None})

    def init(self) -> Iterator[dict[str, Any]]:
        self._enter("init")
        yield self._line(
            {
                "type": "system",
                "subtype": "init",
                "cwd": str(self.cwd),
                "session_id": self.session_id,
                "tools": TOOLS,
                "mcp_servers": [],
                "model": MODEL,
                "permissionMode": "bypassPermissions",
                "apiKeySource": "none",
                "claude_code_version": VERSION,
            }
        )

    def turn(self, k: int) -> Iterator[dict[str, Any]]:
        """Turn k (0-based): text, then a tool call (k < turns) or the summary."""
        rng = random.Random(f"{self.seed}:turn:{k}")  # noqa: S311 - a script, not a secret
        message_id = f"msg_scripted_{self.seed}_{k}"
        final = k >= self.turns
        self._enter(f"turn-{k}")
        step = None if final else self.plan.step(k, self.toolbox.listing())
        text = self.plan.summary(self.turns) if step is None else step.text
        yield self._line({"type": "system", "subtype": "status", "status": "requesting"})
        start = self._message(message_id, [], k)
        yield self._stream(message_id, {"type": "message_start", "message": start})
        block = {"type": "text", "text": ""}
        yield self._stream(
            message_id, {"type": "content_block_start", "index": 0, "content_block": block}
        )
        for piece in _split(text, rng):
            delta = {"type": "text_delta", "text": piece}
            yield self._stream(
                message_id, {"type": "content_block_delta", "index": 0, "delta": delta}
            )
        yield self._assistant(message_id, {"type": "text", "text": text}, k)
        yield self._stream(message_id, {"type": "content_block_stop", "index": 0})
        if step is None:
            yield from self._stop(message_id, "end_turn", k, len(text))
            return
        tool_id = f"toolu_scripted_{self.seed}_{k}"
        arguments = json.dumps(step.input, ensure_ascii=False)
        tool_block: dict[str, Any] = {"type": "tool_use", "id": tool_id, "name": step.tool}
        opened = {**tool_block, "input": {}}
        yield self._stream(
            message_id, {"type": "content_block_start", "index": 1, "content_block": opened}
        )
        for piece in _split_json(arguments, rng):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield self._stream(
                message_id, {"type": "content_block_delta", "index": 1, "delta": delta}
            )
        yield self._assistant(message_id, {**tool_block, "input": step.input}, k)
        yield self._stream(message_id, {"type": "content_block_stop", "index": 1})
        yield from self._stop(message_id, "tool_use", k, len(text) + len(arguments))
        outcome = self.toolbox.run(step.tool, step.input)
        result = {
            "tool_use_id": tool_id,
            "type": "tool_result",
            "content": outcome.content,
            "is_error": outcome.is_error,
        }
        yield self._line(
            {
                "type": "user",
                "message": {"role": "user", "content": [result]},
                "parent_tool_use_id": None,
                "tool_use_result": outcome.detail,
            }
        )

    def _stop(self, message_id: str, reason: str, k: int, chars: int) -> Iterator[dict[str, Any]]:
        """End one API message; its usage counts towards the result line's."""
        output_tokens = max(1, chars // 4)  # roughly a token per four characters
        self.input_tokens += _context_tokens(k)
        self.output_tokens += output_tokens
        delta = {"stop_reason": reason, "stop_sequence": None}
        usage = {"output_tokens": output_tokens}
        yield self._stream(message_id, {"type": "message_delta", "delta": delta, "usage": usage})
        yield self._stream(message_id, {"type": "message_stop"})

    def result(self, *, turns_run: int, error: str | None, final_text: str) -> dict[str, Any]:
        rng = random.Random(f"{self.seed}:result")  # noqa: S311 - a script, not a secret
        self._enter("result")
        return self._line(
            {
                "type": "result",
                "subtype": "error_during_execution" if error else "success",
                "is_error": error is not None,
                "duration_ms": rng.randint(500, 5000),
                "duration_api_ms": rng.randint(100, 500),
                "num_turns": turns_run,
                "result": error or final_text,
                "stop_reason": "end_turn",
                "total_cost_usd": 0.0,
                "usage": {
                    "input_tokens": self.input_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": self.output_tokens,
                },
                "permission_denials": [],
            }
        )


def _context_tokens(k: int) -> int:
    """The prompt a request sends grows with the conversation before it."""
    return 1500 + 120 * k


def _split(text: str, rng: random.Random) -> list[str]:
    """Text deltas of one to three words, spaces kept, as the API streams them."""
    words = text.split(" ")
    pieces: list[str] = []
    while words:
        size = rng.randint(1, 3)
        pieces.append(" ".join(words[:size]) + (" " if len(words) > size else ""))
        words = words[size:]
    return pieces


def _split_json(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(3, len(text) - 1)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if a < b]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m turnkeeper.agents.scripted")
    parser.add_argument("--prompt", default="say hello")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turns", type=int, default=2, help="tool-using turns before the end")
    parser.add_argument("--pace", type=float, default=0.01, help="seconds after each line")
    parser.add_argument("--start-turn", type=int, default=0, help="continue from this turn")
    parser.add_argument("--session-id", default=None, help="default: derived from the seed")
    parser.add_argument("--error", default=None, help="end with an is_error result")
    parser.add_argument("--exit-code", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    seed_rng = random.Random(f"{args.seed}:session")  # noqa: S311 - an id, not a secret
    session_id = args.session_id or str(uuid.UUID(int=seed_rng.getrandbits(128), version=4))
    agent = _Agent(
        prompt=args.prompt,
        seed=args.seed,
        turns=max(args.turns, 0),
        session_id=session_id,
        cwd=Path.cwd(),
    )
    out = sys.stdout.buffer

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        out.flush()
        if args.pace > 0:
            time.sleep(args.pace)

    final_text = ""
    try:
        for line in agent.init():
            emit(line)
        first = min(max(args.start_turn, 0), agent.turns)
        for k in range(first, agent.turns + 1):
            for line in agent.turn(k):
                if line["type"] == "assistant":
                    block = line["message"]["content"][0]
                    final_text = block.get("text", final_text)
                emit(line)
        turns_run = agent.turns + 1 - first
        emit(agent.result(turns_run=turns_run, error=args.error, final_text=final_text))
    except BrokenPipeError:
        return 141
    return int(args.exit_code)


if __name__ == "__main__":
    sys.exit(main())
