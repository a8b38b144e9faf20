"""``turnkeeper chat``: a conversation in the terminal, one run per message.

Type a message and watch the reply stream, tool calls included; type the next one,
which continues the agent's own conversation in the session's workspace
(docs/architecture.md, "Sessions"). Ctrl-C cancels the running turn, not the chat;
Ctrl-D (end of input) leaves it. The session stays: ``turnkeeper chat SESSION`` goes
on with it later.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Annotated

import typer

from turnkeeper.cli.context import console
from turnkeeper.cli.params import checked_id, checked_key_name
from turnkeeper.cli.render import ConversationRenderer
from turnkeeper.cli.runs import RAW_HELP, catalog_agent, client_from_env, parse_env

if TYPE_CHECKING:
    from turnkeeper.client import Client
    from turnkeeper.conversation import Session

PROMPT = "you> "


def chat(
    session: Annotated[
        str | None,
        typer.Argument(
            metavar="SESSION",
            help="The session to go on with (default: a new one).",
            callback=checked_id("session_id"),
        ),
    ] = None,
    agent: Annotated[
        str,
        typer.Option(
            "--agent",
            metavar="AGENT",
            help="Preset (scripted, claude-code, codex) or an agent of TURNKEEPER_AGENTS_FILE.",
        ),
    ] = "scripted",
    env: Annotated[
        list[str] | None,
        typer.Option("--env", metavar="KEY=VALUE", help="A variable for the agent (repeatable)."),
    ] = None,
    on_behalf_of: Annotated[
        str | None,
        typer.Option(
            "--as",
            metavar="KEY_NAME",
            help="Chat on behalf of this API key (the session is its tenant's).",
            callback=checked_key_name,
        ),
    ] = None,
    raw: Annotated[bool, typer.Option("--raw", help=RAW_HELP)] = False,
) -> None:
    """An interactive chat: each message a run of SESSION, following up the last."""
    from uuid6 import uuid7

    session_id = session or str(uuid7())
    with client_from_env() as client:
        spec, options = catalog_agent(client.settings, agent, parse_env(env or []))
        conversation = client.session(session_id, spec, key_name=on_behalf_of, **options)
        console.print(
            f"session {session_id} · {agent} · Ctrl-C cancels a turn, Ctrl-D leaves",
            style="dim",
            highlight=False,
        )
        while (message := _read_message()) is not None:
            if message.strip():
                _turn(client, conversation, message, raw=raw)
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


def _turn(client: Client, conversation: Session, message: str, *, raw: bool) -> None:
    """Send one message and show its run until its log closes; a Ctrl-C cancels the run
    and the reply goes on to its end (the cancel's final chunk)."""
    reply = conversation.send(message)
    renderer = ConversationRenderer(console, raw=raw)
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
                from rich.text import Text

                console.print(Text("● cancelling the turn…", style="yellow"))
                with contextlib.suppress(Exception):
                    client.cancel(reply.run.run_id)
    renderer.close()
