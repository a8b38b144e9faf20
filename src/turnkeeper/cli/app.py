"""The Typer application and its commands."""

from __future__ import annotations

import typer

from turnkeeper import checkup
from turnkeeper.cli import chat, demo, fleet, hosts, runs, web
from turnkeeper.cli.context import console, services, settings_from_env, with_dev_secret
from turnkeeper.cli.keys import keys_app
from turnkeeper.store import migration

app = typer.Typer(
    name="turnkeeper",
    help="Run AI-agent turns durably on a fleet of Celery workers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Database schema migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")

app.command()(runs.submit)
app.command()(chat.chat)
app.command()(runs.tail)
app.command()(runs.status)
app.command()(runs.cancel)
app.command(name="runs")(runs.runs)
app.command(context_settings=fleet.PASS_THROUGH)(fleet.worker)
app.command(context_settings=fleet.PASS_THROUGH)(fleet.beat)
app.command()(fleet.reconcile)
app.command()(fleet.reap)
app.command()(fleet.prune)
app.command()(hosts.hosts)
app.command()(web.web)
app.command()(demo.demo)


def _print_checks(results: list[checkup.CheckResult]) -> bool:
    for result in results:
        mark = "[green]ok  [/green]" if result.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {result.name:<9} {result.target}  {result.detail}", highlight=False)
    return all(result.ok for result in results)


@app.command()
def doctor() -> None:
    """Check the database (reachable, at the latest migration), Redis and the broker."""
    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        if not _print_checks(checkup.run_checks(resolved)):
            raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade(
    revision: str = typer.Argument("head", help="Target revision."),
) -> None:
    """Upgrade the schema to the latest revision (embedded server started if needed)."""
    settings = settings_from_env()
    with services(settings, start=True) as resolved:
        reached = migration.upgrade(resolved.require_database_url(), revision)
    console.print(f"database at revision {reached or 'none'}", highlight=False)


@db_app.command("current")
def db_current() -> None:
    """Print the schema revision of the database and the head revision of this code."""
    settings = settings_from_env()
    with services(settings, start=True) as resolved:
        current = migration.current_revision(resolved.require_database_url())
    head = migration.head_revision()
    state = "at head" if current == head else "behind: run `turnkeeper db upgrade`"
    console.print(f"current {current or 'none'}  head {head or 'none'}  ({state})", highlight=False)


@app.command()
def dev(
    workers: int = typer.Option(1, min=0, help="Worker processes to start (each -c 2)."),
) -> None:
    """The whole stack until Ctrl-C: servers (embedded unless URLs are set), worker, beat."""
    settings = with_dev_secret(settings_from_env(quiet=False))
    with services(settings, start=True) as resolved:
        migration.upgrade(resolved.require_database_url())
        console.print(f"database  {checkup.redact(resolved.require_database_url())}")
        console.print(f"redis     {checkup.redact(resolved.require_redis_url())}")
        console.print(f"broker    {checkup.redact(resolved.effective_broker_url)}")
        procs = fleet.start_fleet(resolved, workers=workers)
        console.print(f"turnkeeper dev is up ({workers} worker(s), beat); Ctrl-C stops it.")
        try:
            fleet.wait_for_signal()
        finally:
            fleet.stop_fleet(procs, resolved.data_dir)
    console.print("stopped.")
