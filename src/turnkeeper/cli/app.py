"""The Typer application and its commands.

Importing this module loads only Typer and the commands' signatures: each command
imports what it runs on (the store, the log, Celery, the web app) when it runs, so
``--help`` and the commands a script calls in a loop start fast (bench/cli_start.py;
tests/cli/test_startup.py holds the line). Help is plain text: no markup to leak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from turnkeeper.cli import chat, demo, fleet, hosts, runs, sessions, stack, status, web
from turnkeeper.cli.context import console, services, settings_from_env
from turnkeeper.cli.keys import keys_app

if TYPE_CHECKING:
    from turnkeeper.checkup import CheckResult

app = typer.Typer(
    name="turnkeeper",
    help="Run AI-agent turns durably on a fleet of Celery workers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
db_app = typer.Typer(
    help="Database schema migrations.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")

app.command()(runs.submit)
app.command()(chat.chat)
app.command()(runs.tail)
app.command()(status.status)
app.command()(runs.cancel)
app.command(name="runs")(status.runs)
app.command()(sessions.sessions)
app.command()(sessions.transcript)
app.command(context_settings=fleet.PASS_THROUGH)(fleet.worker)
app.command(context_settings=fleet.PASS_THROUGH)(fleet.beat)
app.command()(fleet.reconcile)
app.command()(fleet.reap)
app.command()(fleet.prune)
app.command()(hosts.hosts)
app.command()(web.web)
app.command()(demo.demo)
app.command()(stack.dev)


def _print_checks(results: list[CheckResult]) -> bool:
    from rich.markup import escape

    for result in results:
        mark = "[green]ok  [/green]" if result.ok else "[red]FAIL[/red]"
        if result.informational:
            mark = "[dim]--  [/dim]"
        line = f"{result.name:<9} {result.target}  {result.detail}"
        console.print(f"{mark} {escape(line)}", highlight=False)
    return all(result.ok for result in results)


@app.command()
def doctor(
    services_only: bool = typer.Option(
        False,
        "--services",
        help="Check only the database, Redis and the broker: what a process needs to "
        "start (the container images wait for this).",
    ),
) -> None:
    """Check the database (reachable, at the latest migration), Redis, the broker, and
    each agent of the catalog: its CLI, its model host and its key (docs/agents.md)."""
    from turnkeeper import checkup

    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        checks = checkup.run_checks(resolved)
        if not services_only:
            checks += checkup.check_agents(resolved)
        if not _print_checks(checks):
            raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade(
    revision: str = typer.Argument("head", metavar="REVISION", help="Target revision."),
) -> None:
    """Upgrade the schema to the latest revision (embedded server started if needed)."""
    from turnkeeper.store import migration

    settings = settings_from_env()
    with services(settings, start=True) as resolved:
        reached = migration.upgrade(resolved.require_database_url(), revision)
    console.print(f"database at revision {reached or 'none'}", highlight=False)


@db_app.command("current")
def db_current() -> None:
    """Print the schema revision of the database and the head revision of this code."""
    from turnkeeper.store import migration

    settings = settings_from_env()
    with services(settings, start=True) as resolved:
        current = migration.current_revision(resolved.require_database_url())
    head = migration.head_revision()
    state = "at head" if current == head else "behind: run `turnkeeper db upgrade`"
    console.print(f"current {current or 'none'}  head {head or 'none'}  ({state})", highlight=False)
