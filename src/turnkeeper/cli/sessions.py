"""Sessions from the command line: ``turnkeeper sessions`` lists them, ``turnkeeper
transcript SESSION`` shows one's transcript tree with each entry's id, the id that
``submit --session SESSION --from-entry ENTRY_ID`` branches from.

``transcript --json`` is what ``GET /sessions/{session_id}`` answers; the list has no
HTTP route yet, so its JSON follows the runs list's shape.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnkeeper.cli.context import store_from_env
from turnkeeper.cli.params import (
    MAX_COUNTED,
    Json,
    KeyFilter,
    Limit,
    Offset,
    SearchFilter,
    checked_id,
    page_line,
)
from turnkeeper.cli.render import columns

if TYPE_CHECKING:
    from turnkeeper.store.records import SessionSummary
    from turnkeeper.store.store import Store

SessionId = Annotated[
    str,
    typer.Argument(metavar="SESSION", help="The session's id.", callback=checked_id("session_id")),
]
_SUMMARY = 60  # characters of an entry's text shown on its line


def sessions(
    key: KeyFilter = None,
    search: SearchFilter = None,
    limit: Limit = 50,
    offset: Offset = 0,
    as_json: Json = False,
) -> None:
    """The sessions, the one with the latest run first: each with its runs, its latest
    run and that run's status. The last line says which of how many it showed, and the
    --offset of the next page."""
    with store_from_env() as store:
        listed = store.list_sessions(key_name=key, search=search, limit=limit, offset=offset)
        total = store.count_sessions(key_name=key, search=search, most=MAX_COUNTED + 1)
    views = [session_view(summary) for summary in listed]
    if as_json:
        listing = {
            "sessions": views,
            "total": min(total, MAX_COUNTED),
            "total_exact": total <= MAX_COUNTED,
            "offset": offset,
            "limit": limit,
        }
        print(json.dumps(listing))
        return
    if views:
        headers = ("session", "runs", "last run", "status", "last run at", "key")
        rows = [
            [
                view["session_id"],
                str(view["run_count"]),
                view["last_run_id"] or "-",
                view["last_status"] or "-",
                _when(view["last_run_at"]),
                view["key_name"] or "-",
            ]
            for view in views
        ]
        print(columns(headers, rows))
    exact = total <= MAX_COUNTED
    shown_total = min(total, MAX_COUNTED)
    print(
        page_line(
            "sessions", shown=len(views), offset=offset, limit=limit, total=shown_total, exact=exact
        )
    )


def session_view(summary: SessionSummary) -> dict[str, Any]:
    return {
        "session_id": summary.session_id,
        "key_name": summary.key_name,
        "run_count": summary.run_count,
        "last_run_id": summary.last_run_id,
        "last_status": summary.last_status.value if summary.last_status else None,
        "last_run_at": _iso(summary.last_run_at),
        "leaf_id": summary.leaf_id,
        "created_at": _iso(summary.created_at),
        "updated_at": _iso(summary.updated_at),
    }


def transcript(session_id: SessionId, as_json: Json = False) -> None:
    """A session's transcript as a tree, oldest entry first, each with its id (what
    submit --from-entry takes), its kind and the start of its text; * marks the active
    path, root to leaf, which the next message follows. Entries off it are branches left
    behind."""
    with store_from_env() as store:
        tree = session_tree(store, session_id)
    if as_json:
        print(json.dumps(tree))
        return
    entries: list[dict[str, Any]] = tree["entries"]
    runs = len(tree["runs"])
    head = f"session {session_id}: {len(entries)} entries of {runs} run(s)"
    if not entries:
        print(f"{head}; nothing committed yet")
        return
    print(f"{head}; * marks the path the next message follows")
    print(columns(("", "entry", "kind", "text"), tree_rows(entries)))


def session_tree(store: Store, session_id: str) -> dict[str, Any]:
    """What ``GET /sessions/{session_id}`` answers an admin key (web/routes.py), from the
    same store reads: every entry with whether it is on the active path, the path, the
    leaf, and the session's runs oldest first."""
    from turnkeeper.errors import SessionNotFoundError
    from turnkeeper.store.records import RunStatus
    from turnkeeper.web.views import entry_view, run_view

    exists, _ = store.session_tenant(session_id)
    if not exists:
        raise SessionNotFoundError(f"no session has the id {session_id!r}", session_id=session_id)
    active = [entry.entry_id for entry in store.active_path(session_id)]
    on_path = set(active)
    entries = [
        {**entry_view(entry), "active": entry.entry_id in on_path}
        for entry in store.session_entries(session_id)
    ]
    runs = store.list_runs(session_id=session_id, limit=1000)
    now = store.database_now()
    views = []
    for run in reversed(runs):
        behind = store.waiting_behind(run.run_id) if run.status is RunStatus.QUEUED else None
        views.append(run_view(run, store.get_turn_slot(run.run_id), now, behind, owners=True))
    return {
        "session_id": session_id,
        "leaf_id": active[-1] if active else None,
        "active_path": active,
        "entries": entries,
        "runs": views,
    }


def tree_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    """The entries as rows of a tree: a chain of entries stays in its column; where
    entries branch (a retry, an edited message), each branch is drawn under the entry it
    follows, oldest first. Walked with a stack: a long session is deep."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    ids = {entry["entry_id"] for entry in entries}
    for entry in sorted(entries, key=lambda e: e["position"]):
        parent = entry["parent_id"] if entry["parent_id"] in ids else None
        children.setdefault(parent, []).append(entry)
    rows: list[list[str]] = []
    # (entry, the prefix of its own line, the prefix its followers continue with)
    pending = [(root, "", "") for root in reversed(children.get(None, []))]
    while pending:
        entry, prefix, lead = pending.pop()
        mark = "*" if entry["active"] else ""
        rows.append([mark, prefix + entry["entry_id"], entry["kind"], _summary(entry)])
        below = children.get(entry["entry_id"], [])
        if len(below) == 1:
            pending.append((below[0], lead, lead))
            continue
        for index in reversed(range(len(below))):
            last = index == len(below) - 1
            branch = lead + ("└ " if last else "├ ")
            pending.append((below[index], branch, lead + ("  " if last else "│ ")))
    return rows


def _summary(entry: dict[str, Any]) -> str:
    """The start of what an entry says, on one line."""
    body = entry["body"] if isinstance(entry["body"], dict) else {}
    parts = [str(body.get("prompt", ""))] if entry["kind"] == "user" else []
    parts += [str(message.get("text", "")) for message in body.get("messages") or []]
    parts += [f"⏺ {call.get('name', 'tool')}" for call in body.get("toolCalls") or []]
    parts += [f"⎿ {result.get('content', '')}" for result in body.get("results") or []]
    # Agent output may hold escape sequences: none reaches the terminal from here.
    shown = "".join(ch if ch.isprintable() else " " for ch in " ".join(parts))
    text = " ".join(shown.split())
    return text if len(text) <= _SUMMARY else text[: _SUMMARY - 1] + "…"


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def _when(value: str | None) -> str:
    if value is None:
        return "-"
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%SZ")
