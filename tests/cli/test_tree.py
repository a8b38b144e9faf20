"""A transcript's tree, drawn from its entries alone (no store): chains stay in their
column, each branch hangs under the entry it follows, oldest first, however deep."""

from __future__ import annotations

from typing import Any

from turnkeeper.cli.sessions import tree_rows


def entry(entry_id: str, parent: str | None, position: int, *, active: bool = False) -> Any:
    return {
        "entry_id": entry_id,
        "parent_id": parent,
        "kind": "user",
        "body": {"prompt": f"say {entry_id}\x1b[2J\nnow"},
        "position": position,
        "active": active,
    }


def test_branches_of_branches_and_a_long_chain() -> None:
    # a - b - c          (c's branch d, then e under d; f a second branch of c)
    #      \- g - h      (the active path: a, b, g, h)
    entries = [
        entry("a", None, 1, active=True),
        entry("b", "a", 2, active=True),
        entry("c", "b", 3),
        entry("d", "c", 4),
        entry("e", "d", 5),
        entry("f", "c", 6),
        entry("g", "b", 7, active=True),
        entry("h", "g", 8, active=True),
    ]
    rows = [(mark, name) for mark, name, _, _ in tree_rows(entries)]
    assert rows == [
        ("*", "a"),
        ("*", "b"),
        ("", "├ c"),
        ("", "│ ├ d"),
        ("", "│ │ e"),
        ("", "│ └ f"),
        ("*", "└ g"),
        ("*", "  h"),
    ]
    # An escape sequence in an agent's text never reaches the terminal.
    assert {text for _, _, _, text in tree_rows(entries)} == {
        f"say {name} [2J now" for name in "abcdefgh"
    }


def test_a_session_of_thousands_of_entries_is_one_chain() -> None:
    entries = [entry(f"e{n}", f"e{n - 1}" if n else None, n) for n in range(5000)]
    rows = tree_rows(entries)
    assert [name for _, name, _, _ in rows] == [f"e{n}" for n in range(5000)]
