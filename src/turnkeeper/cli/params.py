"""The arguments and options several commands take, checked as the HTTP API checks them.

A value the API would refuse with a 400 (an id over 255 characters or holding a
control character, a malformed key name, an unknown status, a count out of range) is
a usage error here: exit 2 and the usual usage message, said before anything
connects. The checks are the store's own (``turnkeeper.store.records``), imported when
a value is checked, so that ``--help`` loads none of the store.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import typer

RunStatusName = Literal["queued", "running", "completed", "failed", "aborted"]
"""``RunStatus``'s values, spelled out so that ``--help`` lists them without loading the
store (tests/cli/test_params.py holds them equal)."""

MAX_LIST_LIMIT = 1000
MAX_LIST_OFFSET = 10_000_000
MAX_COUNTED = 10_000
"""A list counts its matches up to this many, as ``GET /runs`` does."""


def checked_id(what: str) -> Callable[[str | None], str | None]:
    """A callback that checks an id option or argument (``what`` names it in the store's
    message) and turns the store's refusal into a usage error."""

    def check(value: str | None) -> str | None:
        if value is None:
            return None
        from turnkeeper.errors import InvalidInputError
        from turnkeeper.store.records import check_id

        try:
            return check_id(value, what)
        except InvalidInputError as exc:
            raise typer.BadParameter(exc.message) from None

    return check


def checked_key_name(value: str | None) -> str | None:
    if value is None:
        return None
    from turnkeeper.errors import InvalidInputError
    from turnkeeper.store.records import check_key_name

    try:
        return check_key_name(value)
    except InvalidInputError as exc:
        raise typer.BadParameter(exc.message) from None


def zoned_time(value: str | None) -> datetime | None:
    """A time bound as ``GET /runs`` takes it: ISO 8601 with its zone (``Z`` or an
    offset), since a naive one would be read in the database session's zone; None for
    none, or for one that is not such a time."""
    if value is None or len(value) > 40:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.utcoffset() is not None else None


def checked_time(value: str | None) -> str | None:
    if value is not None and zoned_time(value) is None:
        raise typer.BadParameter(f"not an ISO 8601 time with its zone: {value[:40]!r}")
    return value


def time_bound(option: str, help_text: str) -> Any:
    """A ``runs`` option bounding when runs were created or finished."""
    return typer.Option(option, metavar="TIME", help=help_text, callback=checked_time)


RunId = Annotated[
    str, typer.Argument(metavar="RUN_ID", help="The run's id.", callback=checked_id("run_id"))
]
Limit = Annotated[
    int,
    typer.Option("--limit", min=1, max=MAX_LIST_LIMIT, metavar="N", help="At most N of them."),
]
Offset = Annotated[
    int,
    typer.Option(
        "--offset",
        min=0,
        max=MAX_LIST_OFFSET,
        metavar="N",
        help="Skip the first N: the next page is the offset the last line names.",
    ),
]
KeyFilter = Annotated[
    str | None,
    typer.Option(
        "--key", metavar="NAME", help="Only those of this API key.", callback=checked_key_name
    ),
]
SearchFilter = Annotated[
    str | None,
    typer.Option(
        "--search",
        metavar="TEXT",
        help="Only those whose id holds TEXT, in any case.",
        callback=checked_id("search"),
    ),
]
Json = Annotated[bool, typer.Option("--json", help="One JSON document, as the HTTP API's.")]


def page_line(noun: str, *, shown: int, offset: int, limit: int, total: int, exact: bool) -> str:
    """What a list's last line says: which of how many it showed, and the offset of the
    next page when there is one."""
    of = f"{total}" if exact else f"more than {total}"
    if shown == 0:
        return f"no {noun}" if offset == 0 else f"no {noun} past offset {offset} (of {of})"
    line = f"{noun} {offset + 1}-{offset + shown} of {of}"
    if shown == limit and (offset + shown < total or not exact):
        line += f"; next page: --offset {offset + shown}"
    return line
