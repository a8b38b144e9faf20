"""``turnkeeper chat``: a conversation in the terminal, one run per message.

Type a message and watch the reply stream, tool calls included; type the next one,
which continues the agent's own conversation in the session's workspace
(docs/architecture.md, "Sessions"). Ctrl-C cancels the running turn, not the chat;
Ctrl-D (end of input) leaves it. The session stays: ``turnkeeper chat SESSION`` goes
on with it later.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer
from rich.text import Text
from uuid6 import uuid7

from turnkeeper.cli.context import console
from turnkeeper.cli.render import ConversationRenderer
from turnkeeper.cli.runs import client_from_env, parse_env
from turnkeeper.client import Client
from turnkeeper.conversation import Session

PROMPT = "you> "


def chat(
    session: Annotated[
        str | None, typer.Argument(help="The session to go on with (default: a new one).")
    ] = None,
    agent: Annotated[
        str, typer.Option("--agent", help="Preset: scripted, claude-code, codex.")
    ] = "scripted",
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE for the agent (repeatable).")
    ] = None,
    on_behalf_of: Annotated[
        str | None,
        typer.Option("--as", help="Chat on behalf of this API key (the session is its tenant's)."),
    ] = None,
) -> None:
    """An interactive chat: each message a run of SESSION, following up the last."""
    session_id = session or str(uuid7())
    with client_from_env() as client:
        conversation = client.session(
            session_id, agent, env=parse_env(env or []), key_name=on_behalf_of
        )
        console.print(
            f"session {session_id} · {agent} · Ctrl-C cancels a turn, Ctrl-D leaves",
            style="dim",
            highlight=False,
        )
        while (message := _read_message()) is not None:
            if message.strip():
                _turn(client, conversation, message)
    console.print(f"\nsession {session_id}", style="dim", highlight=False)


def _read_message() -> str | None:
    """The next message; None at the end of input. Ctrl-C here clears the line."""
    while True:
        try:
            return input(PROMPT)
        except EOFError:
            return None
        except KeyboardInterrupt:
            console.print()


def _turn(client: Client, conversation: Session, message: str) -> None:
    """Send one message and show its run until its log closes; a Ctrl-C cancels the run
    and the reply goes on to its end (the cancel's final chunk)."""
    reply = conversation.send(message)
    renderer = ConversationRenderer(console)
    after = 0
    cancelled = False
    while True:
        try:
            for seq, chunk in reply.events(after):
                after = seq
                renderer.render(chunk)
            break
        except KeyboardInterrupt:
            if not cancelled:
                cancelled = True
                renderer.close()
                console.print(Text("● cancelling the turn…", style="yellow"))
                with contextlib.suppress(Exception):
                    client.cancel(reply.run.run_id)
    renderer.close()
