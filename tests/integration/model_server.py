"""Scripted model APIs on loopback, so the real CLIs run offline and deterministically.

Both servers play the same two-step script. A request whose conversation does not yet
hold a tool result is answered with a sentence and one tool call running
``echo hello-from-tool``; a request that carries the tool's result is answered with a
closing sentence. The answer depends only on the request, never on how many requests
came before, so a CLI's extra calls cannot shift the script; every request is recorded
for the tests to inspect.

- :class:`AnthropicScript`: ``POST /v1/messages``, Messages API streaming events
  (what Claude Code speaks);
- :class:`ResponsesScript`: ``POST /v1/responses``, Responses API streaming events
  (what Codex speaks).

``python model_server.py --api anthropic --host 0.0.0.0 --port 8080 --pace 0.2`` serves one
script until interrupted (the file needs only the standard library, so it runs in any
container with a Python); ``--pace`` spaces the stream events out, so a run lasts long
enough to be disrupted, without changing a byte of what is sent.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENING = "I will run a command to check."
CLOSING = "The command printed hello-from-tool. All done."
TOOL_COMMAND = "echo hello-from-tool"
TOOL_OUTPUT = "hello-from-tool"
ARGS_PIECE = 12  # the tool input streams in pieces of this many characters

Event = tuple[str, dict[str, Any]]


@dataclass
class Request:
    method: str
    path: str
    body: Any


def words(text: str) -> list[str]:
    """The text deltas of a sentence: one word each, its following space kept."""
    parts = text.split(" ")
    return [part + " " for part in parts[:-1]] + [parts[-1]]


def pieces(text: str) -> list[str]:
    return [text[i : i + ARGS_PIECE] for i in range(0, len(text), ARGS_PIECE)]


def _contains(value: Any, needle: str) -> bool:
    """True when any dict in the JSON value has ``type == needle``."""
    if isinstance(value, dict):
        return value.get("type") == needle or any(_contains(v, needle) for v in value.values())
    if isinstance(value, list):
        return any(_contains(v, needle) for v in value)
    return False


class Script:
    """One API's answers; subclasses turn a request body into stream events.

    ``tool_command`` is the shell command the scripted tool call runs (a slow one keeps
    a turn inside its tool call long enough to be disrupted there)."""

    endpoint = ""

    def __init__(self, tool_command: str = TOOL_COMMAND) -> None:
        self.tool_command = tool_command

    def events(self, body: dict[str, Any]) -> list[Event]:
        raise NotImplementedError

    def message(self, body: dict[str, Any]) -> dict[str, Any]:
        """The non-streaming answer; only a side request would ask for one."""
        return {"error": {"type": "invalid_request_error", "message": "only streaming here"}}


class AnthropicScript(Script):
    endpoint = "/v1/messages"

    @property
    def tool_input(self) -> dict[str, str]:
        return {"command": self.tool_command, "description": "Print a greeting"}

    def _answered(self, body: dict[str, Any]) -> bool:
        return _contains(body.get("messages"), "tool_result")

    def events(self, body: dict[str, Any]) -> list[Event]:
        answered = self._answered(body)
        message_id = "msg_scripted_closing" if answered else "msg_scripted_opening"
        model = str(body.get("model", "claude-scripted"))
        usage = {"input_tokens": 12, "output_tokens": 1}
        out: list[Event] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": message_id,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": usage,
                    },
                },
            )
        ]
        out += self._text_block(0, CLOSING if answered else OPENING)
        if not answered:
            out.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 1,
                        "content_block": {
                            "type": "tool_use",
                            "id": "toolu_01",
                            "name": "Bash",
                            "input": {},
                        },
                    },
                )
            )
            for piece in pieces(json.dumps(self.tool_input)):
                out.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 1,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                    )
                )
            out.append(("content_block_stop", {"type": "content_block_stop", "index": 1}))
        out.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": "end_turn" if answered else "tool_use",
                        "stop_sequence": None,
                    },
                    "usage": {"output_tokens": 21},
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    @staticmethod
    def _text_block(index: int, text: str) -> list[Event]:
        out: list[Event] = [
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
        ]
        out.extend(
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": word},
                },
            )
            for word in words(text)
        )
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return out

    def message(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "msg_scripted_side",
            "type": "message",
            "role": "assistant",
            "model": str(body.get("model", "claude-scripted")),
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }


class ResponsesScript(Script):
    endpoint = "/v1/responses"

    def _answered(self, body: dict[str, Any]) -> bool:
        return _contains(body.get("input"), "function_call_output")

    def tool_call(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Whichever shell tool the CLI offered, called with the scripted command."""
        names = {
            tool.get("name")
            for tool in body.get("tools") or []
            if isinstance(tool, dict) and tool.get("type") == "function"
        }
        if "exec_command" in names or not names:
            return "exec_command", {"cmd": self.tool_command}
        return "shell", {"command": ["bash", "-lc", self.tool_command]}

    def events(self, body: dict[str, Any]) -> list[Event]:
        answered = self._answered(body)
        response_id = "resp_scripted_closing" if answered else "resp_scripted_opening"
        model = str(body.get("model", "gpt-scripted"))
        shell = {"id": response_id, "object": "response", "model": model, "output": []}
        out: list[Event] = [
            ("response.created", {"type": "response.created", "response": {**shell}}),
            (
                "response.in_progress",
                {"type": "response.in_progress", "response": {**shell, "status": "in_progress"}},
            ),
        ]
        text = CLOSING if answered else OPENING
        message_id = f"{response_id}_msg"
        done_message = {
            "type": "message",
            "id": message_id,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        out.append(
            (
                "response.output_item.added",
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {**done_message, "status": "in_progress", "content": []},
                },
            )
        )
        out.extend(
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": message_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": word,
                },
            )
            for word in words(text)
        )
        out.append(
            (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": done_message},
            )
        )
        if not answered:
            name, arguments = self.tool_call(body)
            call = {
                "type": "function_call",
                "id": "fc_scripted_1",
                "call_id": "call_scripted_1",
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
            out.append(
                (
                    "response.output_item.added",
                    {"type": "response.output_item.added", "output_index": 1, "item": call},
                )
            )
            encoded = json.dumps(arguments)
            out.extend(
                (
                    "response.function_call_arguments.delta",
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": call["id"],
                        "output_index": 1,
                        "delta": piece,
                    },
                )
                for piece in pieces(encoded)
            )
            done_call = {**call, "arguments": encoded, "status": "completed"}
            out.append(
                (
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": 1, "item": done_call},
                )
            )
        usage = {
            "input_tokens": 20,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 30,
        }
        out.append(
            (
                "response.completed",
                {
                    "type": "response.completed",
                    "response": {**shell, "status": "completed", "usage": usage},
                },
            )
        )
        return out


@dataclass
class ModelServer:
    """A threaded HTTP server on 127.0.0.1 answering one script; use as a context manager."""

    script: Script
    requests: list[Request] = field(default_factory=list)
    host: str = "127.0.0.1"
    port_wanted: int = 0
    pace: float = 0.0
    """Seconds between two stream events."""
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def scripted_requests(self) -> list[Request]:
        """The model calls: POSTs to the script's endpoint (Codex's WebSocket attempts,
        GETs this server cannot upgrade, are not calls)."""
        return [
            r
            for r in self.requests
            if r.method == "POST" and r.path.split("?")[0] == self.script.endpoint
        ]

    def __enter__(self) -> ModelServer:
        self._server = ThreadingHTTPServer((self.host, self.port_wanted), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _handler_for(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            pass  # keep test output clean; requests are recorded instead

        def _record(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", errors="replace")
            with lock:
                server.requests.append(Request(self.command, self.path, body))
            return body

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._record()
            if self.path.split("?")[0].endswith("/models"):
                self._json(200, {"object": "list", "data": [], "models": []})
            else:
                self._json(404, {"error": {"type": "not_found", "message": self.path}})

        def do_HEAD(self) -> None:
            self._record()
            self.send_response(200)
            self.end_headers()

        def do_POST(self) -> None:
            body = self._record()
            if self.path.split("?")[0] != server.script.endpoint or not isinstance(body, dict):
                self._json(404, {"error": {"type": "not_found", "message": self.path}})
                return
            if body.get("stream") is not True:
                self._json(200, server.script.message(body))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for frame in _sse(server.script.events(body)):
                self.wfile.write(frame)
                self.wfile.flush()
                if server.pace:
                    time.sleep(server.pace)
            self.close_connection = True

    return Handler


def _sse(events: list[Event]) -> Iterator[bytes]:
    for name, data in events:
        yield f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


SCRIPTS: dict[str, type[Script]] = {"anthropic": AnthropicScript, "responses": ResponsesScript}


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a scripted model API until interrupted.")
    parser.add_argument("--api", choices=sorted(SCRIPTS), default="anthropic")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--pace", type=float, default=0.0, help="seconds between stream events")
    args = parser.parse_args()
    server = ModelServer(SCRIPTS[args.api](), host=args.host, port_wanted=args.port, pace=args.pace)
    with server:
        print(f"serving {args.api} on {server.base_url}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
