"""`turnkeeper keys create|list|revoke`: the API keys of the HTTP API.

A key is printed once, alone on `create`'s stdout, and stored only as a hash; lose
it and create another. Revoking takes effect on the next request of every web
process. Names are never reused, so nothing a revoked key owned ever
passes to a new key.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from turnkeeper.cli.context import console, err_console, store_from_env

if TYPE_CHECKING:
    from turnkeeper.store.records import ApiKey

keys_app = typer.Typer(
    help="API keys of the HTTP API.", no_args_is_help=True, rich_markup_mode=None
)


def scopes(key: ApiKey) -> str:
    names = [name for name, on in (("admin", key.admin), ("commands", key.allow_commands)) if on]
    return ",".join(names) or "runs"


@keys_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="A name for the key: letters, digits, _ . -")],
    allow_commands: Annotated[
        bool, typer.Option("--allow-commands", help="May submit inline agent commands.")
    ] = False,
    admin: Annotated[bool, typer.Option("--admin", help="Sees every run, and /metrics.")] = False,
    max_running: Annotated[
        int | None,
        typer.Option("--max-running", min=1, help="At most this many queued or running runs."),
    ] = None,
) -> None:
    """Create a key; it is printed once, alone on stdout (`KEY=$(turnkeeper keys create
    NAME)`), and stored only as a hash. What was made is said on stderr."""
    with store_from_env() as store:
        key = store.create_key(
            name, admin=admin, allow_commands=allow_commands, max_running=max_running
        )
    limit = f", at most {max_running} running" if max_running else ""
    err_console.print(
        f"created key {name!r} ({'admin' if admin else 'tenant'}"
        f"{', inline commands' if allow_commands else ''}{limit}); it is shown only now:",
        markup=False,
        highlight=False,
    )
    print(key)


@keys_app.command("list")
def list_keys() -> None:
    """Every key: name, scopes, running limit, when created, last used, revoked."""
    from rich.table import Table

    with store_from_env() as store:
        keys = store.list_keys()
    table = Table()
    for header in ("name", "scopes", "max running", "created", "last used", "revoked"):
        # Folded, never cut with an ellipsis: a name is what `keys revoke` takes.
        table.add_column(header, overflow="fold")
    for key in keys:
        table.add_row(
            key.name,
            scopes(key),
            str(key.max_running or "-"),
            _when(key.created_at),
            _when(key.last_used_at),
            _when(key.revoked_at),
        )
    console.print(table)


@keys_app.command("revoke")
def revoke(name: Annotated[str, typer.Argument(help="The key's name.")]) -> None:
    """Revoke a key for good: its next request is refused by every web process."""
    with store_from_env() as store:
        key = store.revoke_key(name)
    console.print(f"revoked {key.name} (at {_when(key.revoked_at)})", highlight=False)


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"
