"""Run ids as file names: an injective, filename-safe encoding and a decoder that fails closed.

A run id is any caller-chosen string, so it may hold ``/``, ``..``, newlines or shell
metacharacters. Journal files are named by its encoding, whose alphabet is
``[A-Za-z0-9.-]`` plus ``_`` escapes: such a name can never leave its directory or
mean anything to a shell. The decoder finds a run's journals in a directory listing,
so it refuses anything it cannot decode exactly.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from turnkeeper.errors import RunIdEncodingError

MAX_ENCODED_LENGTH = 200
"""Longest encoded token; longer encodings are cut and suffixed with a hash."""

_HASH_DIGITS = 16
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_RESERVED = frozenset(
    ["CON", "PRN", "AUX", "NUL"]
    + [f"COM{i}" for i in range(1, 10)]
    + [f"LPT{i}" for i in range(1, 10)]
)
_TOKEN_ALPHABET = re.compile(r"[A-Za-z0-9._-]+")
_TRUNCATED_TAIL = re.compile(r"-[0-9a-f]{16}")
_ESCAPE = re.compile(r"_([0-9A-Fa-f]{2})")

JOURNAL_EXTENSIONS = ("ndjson", "err", "lock", "nonce", "prompt", "env", "limit")
"""Every file a journaled agent process owns: journal, stderr, liveness lock, nonce,
prompt, environment and the disk watcher's verdict."""


def _escape_all(data: bytes) -> str:
    return "".join(f"_{byte:02x}" for byte in data)


def encode_run_id(run_id: str) -> str:
    """The filename-safe token of a run id; injective up to a SHA-256 collision."""
    if not run_id:
        raise RunIdEncodingError("run id must not be empty", reason="empty-run-id")
    try:
        data = run_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RunIdEncodingError("run id is not valid Unicode", reason="malformed") from exc
    token = "".join(chr(b) if b in _SAFE else f"_{b:02x}" for b in data)
    if token.upper() in _RESERVED:
        # Letters and digits are never escaped otherwise, so this cannot collide.
        token = _escape_all(data)
    if len(token) > MAX_ENCODED_LENGTH:
        digest = hashlib.sha256(data).hexdigest()[:_HASH_DIGITS]
        token = f"{token[: MAX_ENCODED_LENGTH - _HASH_DIGITS - 1]}-{digest}"
    return token


def decode_run_id(token: str) -> str:
    """The run id a token encodes; raises RunIdEncodingError unless the decode is exact."""
    if not token or _TOKEN_ALPHABET.fullmatch(token) is None:
        raise RunIdEncodingError("not an encoded run id", reason="malformed", token=token)
    if len(token) > MAX_ENCODED_LENGTH or (
        len(token) == MAX_ENCODED_LENGTH and _TRUNCATED_TAIL.fullmatch(token[-17:])
    ):
        raise RunIdEncodingError("encoded run id was truncated", reason="truncated", token=token)
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "_":
            match = _ESCAPE.match(token, i)
            if match is None:
                raise RunIdEncodingError("bad escape", reason="malformed", token=token)
            out.append(int(match.group(1), 16))
            i += 3
        else:
            out.append(ord(token[i]))
            i += 1
    try:
        run_id = out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunIdEncodingError("invalid UTF-8", reason="malformed", token=token) from exc
    if encode_run_id(run_id).lower() != token.lower():
        # Only the canonical spelling (escape digits in either case) is accepted, so
        # two different names never decode to the same run id.
        raise RunIdEncodingError("non-canonical encoding", reason="malformed", token=token)
    return run_id


@dataclass(frozen=True, slots=True)
class JournalName:
    """What a file name in a journal directory says about itself."""

    kind: Literal["run", "truncated", "malformed"]
    name: str
    run_id: str | None = None
    process: int | None = None
    extension: str | None = None


def journal_file_name(run_id: str, process: int, extension: str) -> str:
    """``<encoded run id>.<process>.<extension>``: one set of files per agent process."""
    if process < 1:
        raise RunIdEncodingError("process number must be >= 1", reason="bad-process")
    if extension not in JOURNAL_EXTENSIONS:
        raise RunIdEncodingError("unknown journal extension", reason="bad-extension")
    return f"{encode_run_id(run_id)}.{process}.{extension}"


def parse_journal_name(name: str) -> JournalName:
    """Classify a directory entry; never raises. Only ``run`` results may be acted on."""
    stem, dot, extension = name.rpartition(".")
    token, dot2, number = stem.rpartition(".")
    if not dot or not dot2 or extension not in JOURNAL_EXTENSIONS:
        return JournalName("malformed", name)
    if not number.isascii() or not number.isdigit() or number.startswith("0"):
        return JournalName("malformed", name)
    try:
        run_id = decode_run_id(token)
    except RunIdEncodingError as exc:
        kind: Literal["truncated", "malformed"] = (
            "truncated" if exc.reason == "truncated" else "malformed"
        )
        return JournalName(kind, name, extension=extension, process=int(number))
    return JournalName("run", name, run_id, int(number), extension)
