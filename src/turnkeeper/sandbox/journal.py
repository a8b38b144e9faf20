"""The run journal's files, its exit sentinel and every shell command that touches it.

Pure functions: paths from (directory, run id, process number), the sentinel nonce,
the sentinel's exact bytes and its parser, and the argv of each journal operation.
All paths are built from the encoded run id and single-quoted anyway.

Each agent process of a run gets its own files, ``<dir>/<encoded>.<n>.ndjson`` (stdout
plus the sentinel), ``.err`` (stderr), ``.lock`` (held by the writer for the agent's
whole life: the liveness witness), ``.nonce`` (read then deleted by the writer before
the agent starts) and ``.stdin`` (the agent's input), so nothing is ever appended
behind an old sentinel.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from turnkeeper.errors import InvalidSentinelError, JournalError
from turnkeeper.sandbox.codec import encode_run_id

SENTINEL_PREFIX = b'{"__exit":'
_SENTINEL = re.compile(rb'\{"__exit":(-?(?:0|[1-9][0-9]{0,9})),"__nonce":"([0-9a-f]{64})"\}')
_DOMAIN = "turnkeeper/journal-exit-sentinel/v1"

EXIT_PROBE_BYTES = 4096
STDERR_TAIL_BYTES = 4096
POLL_READ_BYTES = 4 * 1024 * 1024

LIVENESS_ALIVE = 1
LIVENESS_FREE = 0
LIVENESS_NOT_STARTED = 3
JOURNAL_EXISTS_EXIT = 17
# A liveness probe holds the writer's lock for an instant; the writer waits that out
# rather than mistaking it for a second writer and never starting the agent.
WRITER_LOCK_WAIT = 10


@dataclass(frozen=True, slots=True)
class JournalPaths:
    """The files of one agent process of one run, inside its sandbox."""

    directory: str
    run_id: str
    process: int = 1

    def __post_init__(self) -> None:
        if self.process < 1:
            raise JournalError("process number must be >= 1", run_id=self.run_id)
        if not self.directory.startswith("/"):
            raise JournalError("journal directory must be absolute", run_id=self.run_id)
        object.__setattr__(self, "directory", self.directory.rstrip("/") or "/")

    @property
    def base(self) -> str:
        return f"{self.directory}/{encode_run_id(self.run_id)}.{self.process}"

    @property
    def journal(self) -> str:
        return f"{self.base}.ndjson"

    @property
    def stderr(self) -> str:
        return f"{self.base}.err"

    @property
    def lock(self) -> str:
        return f"{self.base}.lock"

    @property
    def nonce_file(self) -> str:
        return f"{self.base}.nonce"

    @property
    def stdin_file(self) -> str:
        return f"{self.base}.stdin"

    @property
    def all_files(self) -> tuple[str, ...]:
        return (self.journal, self.stderr, self.lock, self.nonce_file, self.stdin_file)


def sentinel_nonce(run_id: str, *, secret: str | None = None, sandbox_id: str = "") -> str:
    """64 hex digits only the writer and the fleet know.

    With a server secret: HMAC-SHA256(secret, run_id); any worker or reaper can
    recompute it and the agent, which never sees the secret, cannot. Without one: a
    hash derived from the sandbox id and run id (forgeable by a determined agent).
    """
    if secret:
        return hmac.new(secret.encode(), run_id.encode(), hashlib.sha256).hexdigest()
    return hashlib.sha256(f"{_DOMAIN}:{sandbox_id}:{run_id}".encode()).hexdigest()


def exit_sentinel_line(
    run_id: str, code: int, *, secret: str | None = None, sandbox_id: str = ""
) -> bytes:
    """The exact bytes the writer appends when the agent exits, newline included."""
    nonce = sentinel_nonce(run_id, secret=secret, sandbox_id=sandbox_id)
    return b'{"__exit":%d,"__nonce":"%s"}\n' % (code, nonce.encode())


def parse_sentinel(line: bytes, nonce: str) -> int | None:
    """The exit code if ``line`` (without newline) is this run's sentinel, else None.

    A line that carries the nonce but is not exactly the sentinel (a non-integer
    exit, extra keys, another key order) raises: only the writer knows the nonce.
    """
    if not line.startswith(SENTINEL_PREFIX) or nonce.encode() not in line:
        return None
    match = _SENTINEL.fullmatch(line)
    if match is None or not hmac.compare_digest(match.group(2), nonce.encode()):
        raise InvalidSentinelError("malformed exit sentinel", reason="invalid-sentinel")
    return int(match.group(1))


def find_exit(tail: bytes, nonce: str) -> int | None:
    """The exit code of the last sentinel in a journal's tail window, else None.

    The first line of the window may be partial; it can only be a sentinel if it
    is complete, and a partial one never matches the exact form.
    """
    for line in reversed(tail.split(b"\n")):
        if not line.startswith(SENTINEL_PREFIX):
            continue
        try:
            code = parse_sentinel(line, nonce)
        except InvalidSentinelError:
            continue
        if code is not None:
            return code
    return None


def _q(path: str) -> str:
    return shlex.quote(path)


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def prepare_argv(paths: JournalPaths) -> list[str]:
    """Create the journal exclusively and store the nonce and input (fed on stdin).

    Exits ``JOURNAL_EXISTS_EXIT`` when this agent process's journal already exists.
    """
    return _sh(
        f"umask 077 && mkdir -p {_q(paths.directory)} || exit 2; "
        f"[ -e {_q(paths.journal)} ] && exit {JOURNAL_EXISTS_EXIT}; "
        f"set -C && : > {_q(paths.journal)} && : > {_q(paths.stderr)} "
        f"&& IFS= read -r nonce && printf '%s' \"$nonce\" > {_q(paths.nonce_file)} "
        f"&& cat > {_q(paths.stdin_file)}"
    )


@dataclass(frozen=True, slots=True)
class AgentLimits:
    """Resource limits applied to the agent's subshell only, never to the writer."""

    journal_max_bytes: int | None = None
    cpu_seconds: int | None = None
    memory_bytes: int | None = None

    def ulimit_script(self) -> str:
        parts = []
        if self.journal_max_bytes is not None:
            parts.append(f"ulimit -f {-(-self.journal_max_bytes // 512)}")  # 512-byte blocks
        if self.cpu_seconds is not None:
            parts.append(f"ulimit -t {self.cpu_seconds}")
        if self.memory_bytes is not None:
            parts.append(f"ulimit -v {max(1, self.memory_bytes // 1024)}")
        return "".join(f"{p} || exit 126; " for p in parts)


def writer_argv(
    paths: JournalPaths, command: str | Sequence[str], limits: AgentLimits | None = None
) -> list[str]:
    """The detached writer: lock, agent in a subshell appending to the journal, sentinel.

    ``command`` is shell code (trusted configuration, interpolated raw) or an argv
    (quoted). Stdout and stderr are appended, never truncated, and never piped: a
    dead reader can therefore never SIGPIPE the agent. The subshell means an ``exit``
    in the command cannot skip the sentinel; a newline is added first when the agent
    left a partial last line, so the sentinel always starts its own line.
    """
    agent = command if isinstance(command, str) else "exec " + shlex.join(command)
    ulimits = (limits or AgentLimits()).ulimit_script()
    j = _q(paths.journal)
    return _sh(
        f"exec 9>>{_q(paths.lock)} || exit 97; flock -w {WRITER_LOCK_WAIT} 9 || exit 98; "
        f"nonce=$(cat {_q(paths.nonce_file)}) && rm -f {_q(paths.nonce_file)} || exit 99; "
        f"{{ ( unset nonce; {ulimits}\n{agent}\n) < {_q(paths.stdin_file)}; code=$?; "
        f'if [ -s {j} ] && [ "$(tail -c 1 {j} | wc -l)" -eq 0 ]; then printf "\\n"; fi; '
        f'printf \'{{"__exit":%d,"__nonce":"%s"}}\\n\' "$code" "$nonce"; '
        f"}} >>{j} 2>>{_q(paths.stderr)}"
    )


def follow_argv(paths: JournalPaths, from_byte: int) -> list[str]:
    """A killable ``tail -F`` from a 0-based byte offset; never creates the journal."""
    _check_offset(from_byte)
    return _sh(f"exec tail -c +{from_byte + 1} -F -s 0.2 -- {_q(paths.journal)} 2>/dev/null")


def read_argv(paths: JournalPaths, from_byte: int, max_bytes: int = POLL_READ_BYTES) -> list[str]:
    """A bounded read from a 0-based byte offset; empty output for a missing journal."""
    _check_offset(from_byte)
    if max_bytes <= 0:
        raise JournalError("read bound must be positive", reason="bad-bound")
    return _sh(f"tail -c +{from_byte + 1} -- {_q(paths.journal)} 2>/dev/null | head -c {max_bytes}")


def tail_argv(path: str, max_bytes: int) -> list[str]:
    """The last ``max_bytes`` of a file (exit probe, stderr tail); empty when missing."""
    if max_bytes <= 0:
        raise JournalError("tail bound must be positive", reason="bad-bound")
    return _sh(f"tail -c {max_bytes} -- {_q(path)} 2>/dev/null; exit 0")


def exists_argv(paths: JournalPaths) -> list[str]:
    return _sh(f"test -f {_q(paths.journal)}")


def liveness_argv(paths: JournalPaths) -> list[str]:
    """Exit 1 while the writer holds the lock, 0 once free, 3 before it ever ran."""
    lock = _q(paths.lock)
    return _sh(
        f"[ -e {lock} ] || exit {LIVENESS_NOT_STARTED}; "
        f"flock -n -E {LIVENESS_ALIVE} {lock} true 2>/dev/null"
    )


def cleanup_argv(paths: JournalPaths) -> list[str]:
    return _sh("rm -f -- " + " ".join(_q(p) for p in paths.all_files))


def list_argv(directory: str) -> list[str]:
    """Names in a journal directory (dot-files too); exit 3 when it does not exist."""
    d = _q(directory.rstrip("/") or "/")
    return _sh(f"[ -d {d} ] || exit 3; ls -1A -- {d} 2>/dev/null")


def mtime_argv(directory: str) -> list[str]:
    """The sandbox clock, then ``<mtime> <path>`` for the directory itself (witness) and
    each entry. No witness line means the listing is unusable, never "empty"."""
    d = _q(directory.rstrip("/") or "/")
    return _sh(f"date +%s; stat -c '%Y %n' -- {d} {d}/* {d}/.[!.]* {d}/..?* 2>/dev/null; exit 0")


def _check_offset(from_byte: int) -> None:
    if isinstance(from_byte, bool) or not isinstance(from_byte, int) or from_byte < 0:
        raise JournalError(f"byte offset must be a non-negative integer, got {from_byte!r}")
