"""What the examples' tests share: an example started as the README starts it (a process
of its own, on the HTTP API alone), and the conversation a page should show for a run,
worked out from the run's log."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from turnkeeper.chunks import Chunk
from turnkeeper.web.serve import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # .venv/bin
MANAGE = "examples/django_chat/manage.py"
USERS = {"ada": "lovelace", "grace": "hopper"}
# Markup a page must show as the text it is: run as HTML, it would set window.pwned. Short
# enough (80 characters) that the scripted agent quotes it whole in its reply.
MARKUP = '<img src=x onerror="pwned=1"><script>pwned=2</script><b>b</b>&amp;'
assert len(MARKUP) <= 80

Item = tuple[str, ...]
"""One item of a rendered conversation: (run id, kind, what it shows...)."""

# The conversation as the page shows it, read off the DOM: each item of #conversation
# with its run and what it shows (a tool call: its name, arguments and result).
READ_CONVERSATION = """nodes => nodes.map(node => {
  const text = (selector) => node.querySelector(selector).textContent;
  const kind = node.className;
  if (kind.split(" ")[0] === "tool") {
    return [node.dataset.run, kind, text(".tool-name"), text(".tool-args"), text(".tool-result")];
  }
  return [node.dataset.run, kind, node.textContent];
})"""


def conversation_of(run_id: str, prompt: str, log: list[tuple[int, Chunk]]) -> list[Item]:
    """The items a page shows for a message and its reply: the prompt, then each text
    message (its deltas joined), each tool call (name, arguments joined, result), each
    error, in the order their first event has in the log."""
    items: list[list[str]] = [[run_id, "user", prompt]]
    messages: dict[str, list[str]] = {}
    tools: dict[str, list[str]] = {}
    for _, chunk in log:
        kind = chunk["type"]
        if kind in {"TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"}:
            if chunk["messageId"] not in messages:
                messages[chunk["messageId"]] = [run_id, "assistant", ""]
                items.append(messages[chunk["messageId"]])
            messages[chunk["messageId"]][2] += chunk.get("delta", "")
        elif kind in {"TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_RESULT"}:
            if chunk["toolCallId"] not in tools:
                tools[chunk["toolCallId"]] = [run_id, "tool", "", "", ""]
                items.append(tools[chunk["toolCallId"]])
            tool = tools[chunk["toolCallId"]]
            if kind == "TOOL_CALL_START":
                tool[2] = chunk["toolCallName"]
            elif kind == "TOOL_CALL_ARGS":
                tool[3] += chunk["delta"]
            else:
                tool[4] = chunk["content"]
                if (chunk.get("metadata") or {}).get("isError"):
                    tool[1] = "tool failed"
        elif kind == "RUN_ERROR":
            items.append([run_id, "error", f"error: {chunk['message']}"])
        elif kind == "CUSTOM" and chunk["name"] == "turnkeeper.interrupted":
            items.append([run_id, "note", "the agent's process was lost; it goes on in a new one"])
    return [tuple(item) for item in items]


def rendered(page: Any) -> list[Item]:
    cells = page.eval_on_selector_all("#conversation > li", READ_CONVERSATION)
    return [tuple(str(cell) for cell in item) for item in cells]


def send(page: Any, prompt: str, replies: int) -> None:
    """Type a message and send it; back once the page has settled its ``replies``th reply."""
    page.fill("#prompt", prompt)
    page.click("#ask button[type=submit]")
    page.wait_for_selector(f'#conversation[data-replies="{replies}"]', state="attached")


@dataclass
class Example:
    """An example's server, a process of its own started from the repository's root."""

    proc: subprocess.Popen[bytes]
    base_url: str
    log: Path

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], port: int, log: Path) -> Example:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        example = cls(proc=proc, base_url=f"http://127.0.0.1:{port}", log=log)
        example.wait_serving()
        return example

    def wait_serving(self, timeout: float = 120.0) -> None:
        """Until the server answers a request, whatever its status (a hang guard)."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                httpx.get(self.base_url, timeout=5)
            except httpx.TransportError:
                assert time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.1)
            else:
                return

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def example_env(turnkeeper_url: str, api_key: str, **extra: str) -> dict[str, str]:
    """The environment the README gives an example: turnkeeper's URL and a key, nothing of
    the store (no database or Redis URL, no server secret)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "DJANGO_"))}
    return {**env, "TURNKEEPER_URL": turnkeeper_url, "TURNKEEPER_API_KEY": api_key, **extra}


def start_fastapi_chat(turnkeeper_url: str, api_key: str, tmp_path: Path) -> Example:
    """``.venv/bin/uvicorn examples.fastapi_chat.app:app --port N``, with ada and grace as
    its users."""
    users = ",".join(f"{name}:{password}" for name, password in USERS.items())
    env = example_env(turnkeeper_url, api_key, CHAT_USERS=users)
    port = free_port()
    argv = [str(BIN / "uvicorn"), "examples.fastapi_chat.app:app", "--port", str(port)]
    return Example.start(argv, env, port, tmp_path / "fastapi_chat.log")


def start_django_chat(turnkeeper_url: str, api_key: str, tmp_path: Path) -> Example:
    """The README's steps: ``migrate``, ``createsuperuser`` for ada and grace, then
    ``runserver N`` (without the reloader, which would watch the tree)."""
    env = example_env(turnkeeper_url, api_key, CHAT_DATABASE=str(tmp_path / "chat.sqlite3"))
    python = str(BIN / "python")
    subprocess.run([python, MANAGE, "migrate"], cwd=REPO, env=env, check=True)
    for name, password in USERS.items():
        subprocess.run(
            [python, MANAGE, "createsuperuser", "--noinput", "--username", name,
             "--email", f"{name}@example.com"],
            cwd=REPO, env={**env, "DJANGO_SUPERUSER_PASSWORD": password}, check=True,
        )  # fmt: skip
    port = free_port()
    argv = [python, MANAGE, "runserver", "--noreload", str(port)]
    return Example.start(argv, env, port, tmp_path / "django_chat.log")


@contextlib.contextmanager
def signed_in(example: Example, user: str) -> Iterator[httpx.Client]:
    """A client of the Django example, signed in on its login form, sending the CSRF token."""
    with httpx.Client(base_url=example.base_url, timeout=60) as client:
        form = client.get("/login").text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token is not None, form
        login = {"csrfmiddlewaretoken": token[1], "username": user, "password": USERS[user]}
        signed = client.post("/login", data={**login, "next": "/"})
        assert (signed.status_code, signed.headers["Location"]) == (302, "/")
        client.headers["X-CSRFToken"] = client.cookies["csrftoken"]  # rotated at the sign-in
        yield client
