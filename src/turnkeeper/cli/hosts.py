"""``turnkeeper hosts``: the fleet's hosts, their worker processes and their sandboxes."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from turnkeeper.cli.context import console, services, settings_from_env


def hosts(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
) -> None:
    """List hosts (alive or dead on the database clock), their workers and their sandboxes."""
    from turnkeeper.hosts import fleet_view
    from turnkeeper.store.store import Store

    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        store = Store(resolved.require_database_url(), pool_size=1)
        try:
            view = fleet_view(store, resolved)
        finally:
            store.close()
    if as_json:
        print(json.dumps(view))
        return
    for host in view:
        state = "alive" if host["alive"] else "dead"
        console.print(
            f"host {host['host_id'] or '(none recorded)'}  {state}  last seen "
            f"{host['last_seen'] or '-'}  {len(host['workers'])} worker(s)  "
            f"{len(host['sandboxes'])} sandbox(es)",
            highlight=False,
        )
        for worker in host["workers"]:
            flags = ("alive" if worker["alive"] else "gone") + (
                ", draining" if worker["draining"] else ""
            )
            console.print(
                f"  worker  {worker['worker_id']}  {flags}  last seen {worker['last_seen']}",
                highlight=False,
            )
        for sandbox in host["sandboxes"]:
            waiting = ", awaiting adoption" if sandbox["awaiting_adoption"] else ""
            console.print(
                f"  sandbox {sandbox['provider']}:{sandbox['sandbox_id']}  run "
                f"{sandbox['run_id']}  {sandbox['status']}{waiting}  owner "
                f"{sandbox['owner'] or '-'}",
                highlight=False,
            )
