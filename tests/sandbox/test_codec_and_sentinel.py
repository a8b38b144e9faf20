"""Pure parts: run-id codec, journal names, sentinel bytes and parsing, line splitting."""

from __future__ import annotations

import json
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.errors import InvalidSentinelError, JournalError, RunIdEncodingError
from turnkeeper.sandbox.codec import (
    MAX_ENCODED_LENGTH,
    decode_run_id,
    encode_run_id,
    journal_file_name,
    parse_journal_name,
)
from turnkeeper.sandbox.journal import (
    JournalPaths,
    exit_sentinel_line,
    final_exit,
    new_nonce,
    parse_sentinel,
    read_argv,
)
from turnkeeper.sandbox.lines import LineSplitter
from turnkeeper.sandbox.provider import SandboxRef, SandboxSpec

run_ids = st.text(
    st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=300
)  # any Unicode string without lone surrogates


@given(run_ids)
def test_encode_decode_round_trips_and_stays_in_its_directory(run_id: str) -> None:
    token = encode_run_id(run_id)
    assert len(token) <= MAX_ENCODED_LENGTH
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in token)
    name = journal_file_name(run_id, 1, "ndjson")
    joined = posixpath.normpath(posixpath.join("/j", name))
    assert posixpath.dirname(joined) == "/j"
    assert name not in {".", ".."}
    parsed = parse_journal_name(name)
    if len(encode_run_id(run_id)) < MAX_ENCODED_LENGTH:
        assert decode_run_id(token) == run_id
        assert (parsed.kind, parsed.run_id, parsed.process) == ("run", run_id, 1)


@given(run_ids, run_ids)
def test_encoding_is_injective(a: str, b: str) -> None:
    if a != b:
        assert encode_run_id(a) != encode_run_id(b)


@pytest.mark.parametrize(
    "run_id",
    ["@", "_40", "a_b", "a b", "../x", "..", ".", "x/../../etc", "a\nb", "$(touch x);`y`", "CON",
     "con", "Lpt9", "CONSOLE", "é", "💥", "x" * 10_000, "-", "a.ndjson"],
)  # fmt: skip
def test_adversarial_run_ids(run_id: str) -> None:
    token = encode_run_id(run_id)
    assert "/" not in token
    assert journal_file_name(run_id, 1, "err") not in {".", ".."}
    assert token.upper() not in {"CON", "LPT9"}
    if len(token) < MAX_ENCODED_LENGTH:
        assert decode_run_id(token) == run_id


def test_known_encodings() -> None:
    assert encode_run_id("@") == "_40"
    assert encode_run_id("_40") == "_5f40"
    assert encode_run_id("CON") == "_43_4f_4e"
    assert encode_run_id("CONSOLE") == "CONSOLE"
    assert encode_run_id("a/b c") == "a_2fb_20c"
    long = encode_run_id("x" * 10_000)
    assert len(long) == MAX_ENCODED_LENGTH
    assert long.startswith("x" * 183 + "-")
    assert encode_run_id("x" * 10_000 + "y") != long


def test_empty_run_id_is_refused() -> None:
    with pytest.raises(RunIdEncodingError):
        encode_run_id("")


@pytest.mark.parametrize(
    ("token", "reason"),
    [("", "malformed"), ("_", "malformed"), ("_4", "malformed"), ("_zz", "malformed"),
     ("a b", "malformed"), ("_ff", "malformed"), ("_41", "malformed"), ("x" * 201, "truncated"),
     ("x" * 183 + "-0123456789abcdef", "truncated")],
)  # fmt: skip
def test_decoder_fails_closed(token: str, reason: str) -> None:
    with pytest.raises(RunIdEncodingError) as caught:
        decode_run_id(token)
    assert caught.value.reason == reason


def test_decoder_accepts_upper_case_hex() -> None:
    assert decode_run_id("a_2Fb") == "a/b"
    assert decode_run_id("_43_4F_4E") == "CON"


@pytest.mark.parametrize(
    ("name", "kind"),
    [("abc.1.ndjson", "run"), ("abc.12.err", "run"), ("abc.ndjson", "malformed"),
     ("abc.1.txt", "malformed"), ("abc.01.ndjson", "malformed"), ("abc.0x.lock", "malformed"),
     ("a_zz.1.ndjson", "malformed"), ("x" * 201 + ".1.ndjson", "truncated"), ("ls: x", "malformed"),
     (".hidden.1.ndjson", "run"), ("...1.ndjson", "run")],
)  # fmt: skip
def test_parse_journal_name(name: str, kind: str) -> None:
    assert parse_journal_name(name).kind == kind


def test_paths_and_sentinel_bytes() -> None:
    paths = JournalPaths("/j/", "run 1", 2)
    assert paths.journal == "/j/run_201.2.ndjson"
    assert paths.stderr == "/j/run_201.2.err"
    assert (paths.prompt_file, paths.env_file) == ("/j/run_201.2.prompt", "/j/run_201.2.env")
    nonce = new_nonce()
    assert exit_sentinel_line(7, nonce) == b'{"__exit":7,"__nonce":"' + nonce.encode() + b'"}\n'
    assert json.loads(exit_sentinel_line(-1, nonce)) == {"__exit": -1, "__nonce": nonce}
    with pytest.raises(JournalError):
        read_argv(paths, -1)


def test_nonces_are_random_and_well_formed() -> None:
    nonces = {new_nonce() for _ in range(100)}
    assert len(nonces) == 100
    assert all(len(n) == 64 and set(n) <= set("0123456789abcdef") for n in nonces)
    for bad in ("", "A" * 64, "0" * 63, "g" * 64):
        with pytest.raises(JournalError):
            exit_sentinel_line(0, bad)


def test_parse_sentinel_refuses_forgeries() -> None:
    nonce, other = new_nonce(), new_nonce()
    line = exit_sentinel_line(3, nonce).rstrip(b"\n")
    assert parse_sentinel(line, nonce) == 3
    assert parse_sentinel(b'{"__exit":0}', nonce) is None
    assert parse_sentinel(exit_sentinel_line(0, other).rstrip(), nonce) is None
    assert parse_sentinel(b'{"__exit":0,"__nonce":"' + b"0" * 64 + b'"}', nonce) is None
    assert parse_sentinel(b'{"text":"{\\"__exit\\":0}"}', nonce) is None
    for bad in (
        b'{"__exit":"0","__nonce":"%s"}',
        b'{"__exit":1.5,"__nonce":"%s"}',
        b'{"__exit":0,"__nonce":"%s","x":1}',
        b'{"__exit":01,"__nonce":"%s"}',
    ):
        with pytest.raises(InvalidSentinelError):
            parse_sentinel(bad % nonce.encode(), nonce)


def test_final_exit_accepts_only_the_last_line() -> None:
    nonce = new_nonce()
    sentinel = exit_sentinel_line(4, nonce)
    assert final_exit(b'ial line\n{"__exit":0}\n' + sentinel, nonce) == 4
    assert final_exit(sentinel, nonce) == 4
    assert final_exit(sentinel + b"after\n", nonce) is None
    assert final_exit(sentinel + b"x", nonce) is None
    assert final_exit(sentinel.rstrip(b"\n"), nonce) is None  # no newline yet
    assert final_exit(b'x\n{"__exit":0}\n', nonce) is None
    assert final_exit(sentinel[10:], nonce) is None  # cut sentinel
    assert final_exit(b"", nonce) is None


def test_line_splitter_is_byte_exact() -> None:
    splitter = LineSplitter(start=10)
    out: list[tuple[bytes, int]] = []
    for chunk in (b"ab", b"c\n\n\xe2\x82", b"\xac\n", b"\xff\xfe", b"tail"):
        out.extend(splitter.feed(chunk))
    assert out == [(b"abc", 14), (b"", 15), (b"\xe2\x82\xac", 19)]
    assert splitter.position == 19
    assert splitter.fed_until == 25
    assert list(splitter.feed(b"\n")) == [(b"\xff\xfetail", 26)]


def test_sandbox_ref_json_round_trip() -> None:
    ref = SandboxRef(
        "ssh", "abc", "/srv/abc", SandboxSpec(journal_max_bytes=5),
        {"host": "h", "port": 22, "user": "u"},
    )  # fmt: skip
    data = json.loads(json.dumps(ref.to_dict()))
    assert SandboxRef.from_dict(data) == ref  # no env: an agent's is never kept with its sandbox
    assert data["spec"] == {"journal_max_bytes": 5}
    assert ref.journal_dir == "/srv/abc/journal"
