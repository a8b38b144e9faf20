"""Commands that drive and follow runs: submit, tail, cancel (``status`` and the runs
list are in ``cli/status.py``)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnkeeper.cli.context import console, services, settings_from_env
from turnkeeper.cli.params import RunId, checked_id, checked_key_name

if TYPE_CHECKING:
    from turnkeeper.client import Client
    from turnkeeper.config import Settings


RAW_HELP = (
    "Show what the agent wrote as it is, escape sequences included (by default its "
    "control characters never reach the terminal)."
)


@contextmanager
def client_from_env() -> Iterator[Client]:
    from turnkeeper.client import Client

    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        client = Client.from_settings(resolved)
        try:
            yield client
        finally:
            client.close()


def catalog_agent(
    settings: Settings, name: str, env: dict[str, str], provider: str | None = None
) -> tuple[str | dict[str, Any], dict[str, Any]]:
    """``--agent NAME`` as the web app resolves it: with ``TURNKEEPER_AGENTS_FILE`` set, an
    agent of that catalog (its spec, fixed env, worker variables and files, provider and
    limits, which the command's options may only tighten); without it, a preset. Returns
    the agent and the ``submit`` options."""
    from turnkeeper.agents.catalog import Catalog

    if settings.agents_file is None:
        return name, {"env": env, "provider": provider}
    admitted = Catalog.load(settings).admit(name, allow_commands=True, env=env, provider=provider)
    return admitted.agent, {
        "env": admitted.env,
        "provider": admitted.provider,
        "timeout": admitted.timeout,
        "max_attempts": admitted.max_attempts,
    }


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expects KEY=VALUE, got {pair!r}", param_hint="'--env'")
        env[key] = value
    return env


def split_command(command: str) -> list[str]:
    """``--command`` split as a shell would; an unclosed quote is a usage error."""
    try:
        return shlex.split(command)
    except ValueError as exc:
        raise typer.BadParameter(f"cannot split it: {exc}", param_hint="'--command'") from None


def submit(
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            metavar="AGENT",
            help="Preset (scripted, claude-code, codex) or an agent of TURNKEEPER_AGENTS_FILE.",
        ),
    ] = None,
    command: Annotated[
        str | None,
        typer.Option("--command", metavar="CMD", help="Agent command, split as a shell would."),
    ] = None,
    output_format: Annotated[
        str, typer.Option("--format", metavar="FORMAT", help="Output format of --command.")
    ] = "text",
    prompt: Annotated[
        str, typer.Option("--prompt", metavar="TEXT", help="The input of the turn.")
    ] = "",
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            metavar="SESSION",
            help="The session the run belongs to (default: one of its own).",
            callback=checked_id("session_id"),
        ),
    ] = None,
    from_entry: Annotated[
        str | None,
        typer.Option(
            "--from-entry",
            metavar="ENTRY_ID",
            help="Branch: the earlier transcript entry to follow (turnkeeper transcript "
            "SESSION shows their ids).",
            callback=checked_id("parent_entry_id"),
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id",
            metavar="RUN_ID",
            help="Idempotency key.",
            callback=checked_id("run_id"),
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", metavar="KEY=VALUE", help="A variable for the agent (repeatable)."),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option("--provider", metavar="PROVIDER", help="Sandbox: local, bwrap, ssh."),
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Stream the run until it ends.")] = False,
    raw: Annotated[bool, typer.Option("--raw", help=RAW_HELP)] = False,
    on_behalf_of: Annotated[
        str | None,
        typer.Option(
            "--as",
            metavar="KEY_NAME",
            help="Submit on behalf of this API key (the run is its tenant's).",
            callback=checked_key_name,
        ),
    ] = None,
) -> None:
    """Submit a run; prints its run id (or, with --follow, its conversation)."""
    from turnkeeper.agents.spec import require_prompt
    from turnkeeper.errors import PromptError

    if (agent is None) == (command is None):
        raise typer.BadParameter("give exactly one of them", param_hint="'--agent' / '--command'")
    try:
        require_prompt(prompt)
    except PromptError as exc:
        raise typer.BadParameter(exc.message, param_hint="'--prompt'") from exc
    agent_env = parse_env(env or [])
    spec: str | dict[str, Any]
    if command is not None:
        spec = {"command": split_command(command), "format": output_format}
    with client_from_env() as client:
        if command is not None:
            options: dict[str, Any] = {"env": agent_env, "provider": provider}
        else:
            spec, options = catalog_agent(client.settings, str(agent), agent_env, provider)
        try:
            run = client.submit(
                spec,
                prompt,
                session_id=session,
                run_id=run_id,
                key_name=on_behalf_of,
                from_entry=from_entry,
                **options,
            )
        except PromptError as exc:  # one the agent can never be given: a usage error
            raise typer.BadParameter(exc.message, param_hint="'--prompt'") from exc
        if not follow:
            print(run.run_id)
            return
        # The run's id comes with its first chunk (RUN_STARTED), however long it queues.
        _follow(client, run.run_id, after=0, as_json=False, follow=True, raw=raw)


def tail(
    run_id: RunId,
    from_seq: Annotated[
        int, typer.Option("--from", min=0, metavar="SEQ", help="Show chunks after this seq.")
    ] = 0,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="One JSON line per chunk (every control character escaped)."),
    ] = False,
    no_follow: Annotated[
        bool, typer.Option("--no-follow", help="Print what is stored and exit.")
    ] = False,
    raw: Annotated[bool, typer.Option("--raw", help=RAW_HELP)] = False,
) -> None:
    """Print a run's chunks; exits when its log is closed (1 if the run failed)."""
    with client_from_env() as client:
        _follow(client, run_id, after=from_seq, as_json=as_json, follow=not no_follow, raw=raw)


def _follow(
    client: Client, run_id: str, *, after: int, as_json: bool, follow: bool, raw: bool
) -> None:
    import orjson

    from turnkeeper.cli.render import ConversationRenderer, json_line

    renderer = None if as_json else ConversationRenderer(console, raw=raw)
    for seq, chunk in client.events(run_id, after, follow=follow):
        if renderer is None:
            sys.stdout.buffer.write(json_line(orjson.dumps({"seq": seq, "chunk": chunk})) + b"\n")
            sys.stdout.flush()
        else:
            renderer.render(chunk)
    if renderer is not None:
        renderer.close()
    run = client.get(run_id)
    if run is not None and run.status.value == "failed":
        raise typer.Exit(1)


def cancel(run_id: RunId) -> None:
    """Cancel a run: one nobody drives is settled at once, a running one is stopped by
    its owner as soon as it hears of it (usually well under a second)."""
    with client_from_env() as client:
        run = client.cancel(run_id)
    print(f"{run.run_id} {run.status.value}")
