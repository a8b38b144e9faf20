"""What a jsonb column is given: a NUL refused where the caller chose it, and stored as ␀
where an agent wrote it."""

from __future__ import annotations

import pytest

from turnkeeper.errors import InvalidInputError
from turnkeeper.store.records import storable, to_json


@pytest.mark.parametrize(
    "value",
    ["\x00", "a\x00", "\\\x00", "\\\\\x00", {"k": ["x", "\x00"]}, {"\x00": 1}],
)
def test_a_nul_anywhere_is_refused(value: object) -> None:
    with pytest.raises(InvalidInputError) as refused:
        to_json(value, "payload")
    assert (refused.value.message, refused.value.reason) == (
        "payload contains a NUL character",
        "not-json",
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("\\u0000", '"\\\\u0000"'),  # a prompt about JSON escapes: six characters, no NUL
        ("\\\\u0000", '"\\\\\\\\u0000"'),
        ({"\\u0000": "\\\\\\u0000"}, '{"\\\\u0000":"\\\\\\\\\\\\u0000"}'),
        ("\u2400", '"\u2400"'),
    ],
)
def test_the_text_of_an_escape_is_no_nul(value: object, text: str) -> None:
    assert to_json(value, "payload") == text


def test_storable_shows_a_nul_and_replaces_a_lone_surrogate() -> None:
    error = {
        "message": "bad\x00news",
        "stderr": "a\ud800b\udfff",
        "limits": {"k\x00": [1, "\x00", None, True]},
        "exit_code": 3,
    }
    assert storable(error) == {
        "message": "bad␀news",
        "stderr": "a\ufffdb\ufffd",
        "limits": {"k␀": [1, "␀", None, True]},
        "exit_code": 3,
    }
    assert to_json(storable(error), "error") == (
        '{"message":"bad␀news","stderr":"a\ufffdb\ufffd",'
        '"limits":{"k␀":[1,"␀",null,true]},"exit_code":3}'
    )
