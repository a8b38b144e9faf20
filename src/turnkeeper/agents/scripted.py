"""The bundled scripted agent: a real process that talks like Claude Code.

``python -m turnkeeper.agents.scripted --prompt P --seed S --turns N --pace SECONDS``
prints the stream-json transcript that ``claude -p P --output-format stream-json
--verbose --include-partial-messages`` would print for a model that, in each of
N turns, says a sentence (streamed as several text deltas, then the full
message), calls a tool (streamed as ``input_json_delta`` pieces, then the full
message), and then, in a last turn, says a closing sentence; a ``result`` line
with usage ends the run. The tools really run in the working directory:
``Write`` writes ``notes/turn-<k>.txt``, ``Bash`` runs ``echo WORD`` or ``ls``
(argv, no shell), and their real output is the ``tool_result``.

Deterministic: everything printed comes from the seed, the prompt, the turn
number and the tools' real output; nothing from a clock (``duration_ms`` is
derived from the seed). Turn k's lines are the same whether or not the process
started at turn 0, so ``--start-turn K`` continues an interrupted run as a new
process would (``claude --resume``): an init line with the same session id,
then turns K..N. Every line is flushed at once; ``--pace`` seconds pass after
each line. ``--error MESSAGE`` ends with an ``is_error`` result, ``--exit-code``
sets the exit status (0 by default).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODEL = "scripted-sonnet-1"
VERSION = "scripted-1"
_WORDS = (
    "the", "greeting", "check", "looks", "fine", "and", "workspace", "holds", "a", "fresh",
    "note", "so", "I", "will", "list", "files", "verify", "output", "record", "progress",
    "carefully", "before", "moving", "on", "to", "next", "step",
)  # fmt: skip


class _Agent:
    def __init__(self, *, prompt: str, seed: int, turns: int, session_id: str, cwd: Path) -> None:
        self.prompt = prompt
        self.seed = seed
        self.turns = turns
        self.session_id = session_id
        self.cwd = cwd
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

    def _assistant(self, message_id: str, block: dict[str, Any]) -> dict[str, Any]:
        message = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [block],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1},
        }
        return self._line({"type": "assistant", "message": message, "parent_tool_use_id": None})

    def init(self) -> Iterator[dict[str, Any]]:
        self._enter("init")
        yield self._line(
            {
                "type": "system",
                "subtype": "init",
                "cwd": str(self.cwd),
                "session_id": self.session_id,
                "tools": ["Bash", "Read", "Write"],
                "mcp_servers": [],
                "model": MODEL,
                "permissionMode": "bypassPermissions",
                "apiKeySource": "none",
                "claude_code_version": VERSION,
            }
        )

    def turn(self, k: int) -> Iterator[dict[str, Any]]:
        """Turn k (0-based): text, then a tool call (k < turns) or the end."""
        rng = random.Random(f"{self.seed}:turn:{k}")  # noqa: S311 - a script, not a secret
        message_id = f"msg_scripted_{self.seed}_{k}"
        final = k >= self.turns
        self._enter(f"turn-{k}")
        text = self._sentence(rng, k, final)
        yield self._line({"type": "system", "subtype": "status", "status": "requesting"})
        start: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1},
        }
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
        yield self._assistant(message_id, {"type": "text", "text": text})
        yield self._stream(message_id, {"type": "content_block_stop", "index": 0})
        if final:
            yield from self._stop(message_id, "end_turn", rng)
            return
        tool_id = f"toolu_scripted_{self.seed}_{k}"
        name, arguments, run = self._tool(rng, k)
        tool_block: dict[str, Any] = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
        yield self._stream(
            message_id, {"type": "content_block_start", "index": 1, "content_block": tool_block}
        )
        for piece in _split_json(json.dumps(arguments, ensure_ascii=False), rng):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield self._stream(
                message_id, {"type": "content_block_delta", "index": 1, "delta": delta}
            )
        yield self._assistant(
            message_id, {"type": "tool_use", "id": tool_id, "name": name, "input": arguments}
        )
        yield self._stream(message_id, {"type": "content_block_stop", "index": 1})
        yield from self._stop(message_id, "tool_use", rng)
        output, failed = run()
        result = {"tool_use_id": tool_id, "type": "tool_result", "content": output}
        result["is_error"] = failed
        yield self._line(
            {
                "type": "user",
                "message": {"role": "user", "content": [result]},
                "parent_tool_use_id": None,
                "tool_use_result": {"stdout": output, "stderr": "", "interrupted": False},
            }
        )

    def _stop(self, message_id: str, reason: str, rng: random.Random) -> Iterator[dict[str, Any]]:
        delta = {"stop_reason": reason, "stop_sequence": None}
        usage = {"output_tokens": rng.randint(8, 40)}
        yield self._stream(message_id, {"type": "message_delta", "delta": delta, "usage": usage})
        yield self._stream(message_id, {"type": "message_stop"})

    def _sentence(self, rng: random.Random, k: int, final: bool) -> str:
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 9)))
        if final:
            return f"All {self.turns} steps are done: {words}."
        if k == 0:
            return f"Working on: {self.prompt[:80]}. Step 1, {words}."
        return f"Step {k + 1}, {words}."

    def _tool(self, rng: random.Random, k: int) -> tuple[str, dict[str, Any], Any]:
        kind = ("write", "echo", "ls")[(self.seed + k) % 3]  # every kind within 3 turns
        if kind == "write":
            relative = f"notes/turn-{k + 1}.txt"
            content = f"note {k + 1}: " + " ".join(rng.choice(_WORDS) for _ in range(4)) + "\n"

            def write() -> tuple[str, bool]:
                path = self.cwd / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content, encoding="utf-8")
                return f"File created successfully at: {relative}", False

            return "Write", {"file_path": relative, "content": content}, write
        argv = ["echo", rng.choice(_WORDS)] if kind == "echo" else ["ls"]
        description = "Print a word" if kind == "echo" else "List files"

        def bash() -> tuple[str, bool]:
            done = subprocess.run(argv, cwd=self.cwd, capture_output=True, text=True, check=False)
            return (done.stdout + done.stderr).rstrip("\n"), done.returncode != 0

        return "Bash", {"command": " ".join(argv), "description": description}, bash

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
                    "input_tokens": 12 * turns_run,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 20 * turns_run,
                },
                "permission_denials": [],
            }
        )


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
