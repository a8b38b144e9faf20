"""The run journal's files, its exit sentinel and every shell command that touches it.

Pure functions: paths from (directory, run id, process number), a fresh nonce, the
sentinel's exact bytes and its parser, and the argv of each journal operation. All
paths are built from the encoded run id and single-quoted anyway.

Each agent process of a run gets its own files, ``<dir>/<encoded>.<n>.ndjson`` (stdout
plus the sentinel), ``.err`` (the tail of stderr), ``.lock`` (held by the writer for
the agent's whole life: the liveness witness), ``.nonce`` and ``.env`` (read, then
deleted, by the writer before the agent starts; a disarm leaves ``.nonce`` empty),
``.prompt`` and ``.limit`` (written by the writer's disk watcher when it stopped the
agent, ``disk.py``), so nothing is ever appended behind an old sentinel. The directory
is on the sandbox's host, outside anything a jail shows its agent.
"""

from __future__ import annotations

import hmac
import re
import secrets
import shlex
from dataclasses import dataclass

from turnkeeper.errors import InvalidSentinelError, JournalError
from turnkeeper.sandbox.codec import journal_file_name
from turnkeeper.sandbox.command import ENV_FD

SENTINEL_PREFIX = b'{"__exit":'
_SENTINEL = re.compile(rb'\{"__exit":(-?(?:0|[1-9][0-9]{0,9})),"__nonce":"([0-9a-f]{64})"\}')
_NONCE = re.compile(r"[0-9a-f]{64}")

EXIT_PROBE_BYTES = 4096
STDERR_TAIL_BYTES = 4096
STDERR_KEEP_BYTES = 64 * 1024
"""The writer keeps only this much of an agent's stderr: a bounded file, whatever it prints."""
POLL_READ_BYTES = 4 * 1024 * 1024

LIVENESS_ALIVE = 1
LIVENESS_FREE = 0
LIVENESS_NOT_STARTED = 3
JOURNAL_EXISTS_EXIT = 17
JOURNAL_DISARMED_EXIT = 18
"""A prepare made the journal, then found its nonce file's path taken: a disarm ran in
between (``disarm_argv``), and no writer of that journal may ever start its agent."""
LAUNCH_FAILED_EXIT = 125
# A liveness probe holds the writer's lock for an instant; the writer waits that out
# rather than mistaking it for a second writer and never starting the agent.
WRITER_LOCK_WAIT = 10


@dataclass(frozen=True, slots=True)
class JournalPaths:
    """The files of one agent process of one run, on its sandbox's host."""

    directory: str
    run_id: str
    process: int = 1

    def __post_init__(self) -> None:
        if self.process < 1:
            raise JournalError("process number must be >= 1", run_id=self.run_id)
        if not self.directory.startswith("/"):
            raise JournalError("journal directory must be absolute", run_id=self.run_id)
        object.__setattr__(self, "directory", self.directory.rstrip("/") or "/")

    def _file(self, extension: str) -> str:
        return f"{self.directory}/{journal_file_name(self.run_id, self.process, extension)}"

    @property
    def journal(self) -> str:
        return self._file("ndjson")

    @property
    def stderr(self) -> str:
        return self._file("err")

    @property
    def lock(self) -> str:
        return self._file("lock")

    @property
    def nonce_file(self) -> str:
        return self._file("nonce")

    @property
    def prompt_file(self) -> str:
        return self._file("prompt")

    @property
    def env_file(self) -> str:
        return self._file("env")

    @property
    def limit_file(self) -> str:
        """The disk watcher's verdict, when it stopped the agent (``disk.py``)."""
        return self._file("limit")


def new_nonce() -> str:
    """64 random hex digits for one agent process: known to the writer and the fleet's
    store only, derived from nothing an agent could know."""
    return secrets.token_hex(32)


def check_nonce(nonce: str) -> str:
    if _NONCE.fullmatch(nonce) is None:
        raise JournalError("a sentinel nonce is 64 lowercase hex digits", reason="bad-nonce")
    return nonce


def exit_sentinel_line(code: int, nonce: str) -> bytes:
    """The exact bytes the writer appends when the agent exits, newline included."""
    return b'{"__exit":%d,"__nonce":"%s"}\n' % (code, check_nonce(nonce).encode())


def parse_sentinel(line: bytes, nonce: str) -> int | None:
    """The exit code if ``line`` (without newline) is this process's sentinel, else None.

    A line that carries the nonce but is not exactly the sentinel (a non-integer
    exit, extra keys, another key order) raises: only the writer knows the nonce.
    """
    if not line.startswith(SENTINEL_PREFIX) or nonce.encode() not in line:
        return None
    match = _SENTINEL.fullmatch(line)
    if match is None or not hmac.compare_digest(match.group(2), nonce.encode()):
        raise InvalidSentinelError("malformed exit sentinel", reason="invalid-sentinel")
    return int(match.group(1))


def final_exit(tail: bytes, nonce: str) -> int | None:
    """The exit code when the journal (whose last bytes are ``tail``) ends with this
    process's sentinel line, else None: a sentinel is only ever the final line."""
    if not tail.endswith(b"\n"):
        return None
    last = tail[:-1].rpartition(b"\n")[2]
    try:
        return parse_sentinel(last, nonce)
    except InvalidSentinelError:
        return None


def _q(path: str) -> str:
    return shlex.quote(path)


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def prepare_argv(paths: JournalPaths) -> list[str]:
    """Create the journal exclusively and store nonce, environment and prompt.

    Fed on stdin: the nonce and a newline, the environment file's length and a newline,
    that many bytes, then the prompt to the end. Exits ``JOURNAL_EXISTS_EXIT`` when this
    agent process's journal already exists, ``JOURNAL_DISARMED_EXIT`` when the journal
    was made here but its nonce file was disarmed before the nonce could be written.

    Every file is created under ``set -C``, so the nonce's write fails on the empty
    file a disarm leaves in its place (``disarm_argv``): a prepare stopped between the
    journal and the nonce, and disarmed meanwhile, writes no nonce when it goes on
    (docs/architecture.md, "Journals that never started").
    """
    return _sh(
        f"umask 077 && mkdir -p {_q(paths.directory)} || exit 2; "
        f"[ -e {_q(paths.journal)} ] && exit {JOURNAL_EXISTS_EXIT}; "
        f"set -C && : > {_q(paths.journal)} && : > {_q(paths.stderr)} "
        f"&& IFS= read -r nonce "
        f"&& {{ printf '%s' \"$nonce\" > {_q(paths.nonce_file)} "
        f"|| exit {JOURNAL_DISARMED_EXIT}; }} "
        f'&& IFS= read -r size && head -c "$size" > {_q(paths.env_file)} '
        f"&& cat > {_q(paths.prompt_file)}"
    )


def claim_argv(paths: JournalPaths) -> list[str]:
    """Create the journal, empty, exclusively, and nothing else: a prepare that comes
    later finds it and refuses (``JOURNAL_EXISTS_EXIT``), so no writer of that agent
    process ever starts. Exits ``JOURNAL_EXISTS_EXIT`` when the journal was there
    already (a prepare came first), 2 when it cannot be made."""
    j = _q(paths.journal)
    return _sh(
        f"umask 077 && mkdir -p {_q(paths.directory)} || exit 2; "
        f"(set -C && : > {j}) 2>/dev/null && exit 0; "
        f"[ -e {j} ] && exit {JOURNAL_EXISTS_EXIT}; exit 2"
    )


def writer_argv(
    paths: JournalPaths,
    launch: str,
    *,
    journal_max_bytes: int | None = None,
    after_exit: str = "",
) -> list[str]:
    """The detached writer: lock, agent through a pipe into the journal, sentinel.

    ``launch`` is the provider's shell code that runs the agent in its sandbox
    (:meth:`Sandbox.launch`). The agent never holds a descriptor of the journal: its
    stdout is a pipe that ``cat``, on this side, appends to the journal, so the agent
    can neither truncate nor rewrite it, nor write after the sentinel; its stderr goes
    through ``tail``, which keeps the last ``STDERR_KEEP_BYTES``. Its exit status comes
    back on descriptor 5 the moment it exits; ``after_exit`` then runs (a provider
    without a pid namespace ends what the agent left running there), the pipes drain,
    and the sentinel is appended on a line of its own. The lock is held throughout.
    """
    j, err = _q(paths.journal), _q(paths.stderr)
    cap = ""
    if journal_max_bytes is not None:  # 512-byte blocks; the writer's sentinel is exempt
        cap = f"ulimit -f {-(-journal_max_bytes // 512)} || exit {LAUNCH_FAILED_EXIT}; "
    closed = f"5>&- {ENV_FD}<&- 9>&-"  # what only the writer itself may hold
    agent = (
        f"{{ {{ {launch} 4>&- 5>&- 9>&-; echo $? >&5; {after_exit or ':'}; }} 2>&4 "
        f"| ( {cap}exec cat ) >>{j} 4>&- {closed}; }} 4>&1 "
        f"| exec tail -c {STDERR_KEEP_BYTES} >>{err} {closed}"
    )
    return _sh(
        f"exec 9>>{_q(paths.lock)} || exit 97; flock -w {WRITER_LOCK_WAIT} 9 || exit 98; "
        # An empty nonce file is a disarm's (``disarm_argv``): no nonce, no agent.
        f'nonce=$(cat {_q(paths.nonce_file)}) && [ -n "$nonce" ] '
        f"&& rm -f {_q(paths.nonce_file)} || exit 99; "
        f"exec {ENV_FD}<{_q(paths.env_file)} && rm -f {_q(paths.env_file)} || exit 96; "
        f"code=$( {{ {agent}; }} 5>&1 ); exec {ENV_FD}<&-; "
        f'if [ -s {j} ] && [ "$(tail -c 1 {j} | wc -l)" -eq 0 ]; then printf "\\n" >>{j}; fi; '
        f'printf \'{{"__exit":%d,"__nonce":"%s"}}\\n\' "${{code:-{LAUNCH_FAILED_EXIT}}}" '
        f'"$nonce" >>{j}'
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


def size_argv(paths: JournalPaths) -> list[str]:
    """The journal's size in bytes."""
    return _sh(f"stat -c %s -- {_q(paths.journal)}")


def tail_argv(path: str, max_bytes: int) -> list[str]:
    """The last ``max_bytes`` of a file (exit probe, stderr tail); empty when missing."""
    if max_bytes <= 0:
        raise JournalError("tail bound must be positive", reason="bad-bound")
    return _sh(f"tail -c {max_bytes} -- {_q(path)} 2>/dev/null; exit 0")


def remove_argv(paths: JournalPaths) -> list[str]:
    """Remove one agent process's files (its run settled; its sandbox lives on)."""
    files = (paths.journal, paths.stderr, paths.lock, paths.nonce_file, paths.prompt_file)
    rest = (paths.env_file, paths.limit_file)
    return _sh(f"rm -f -- {' '.join(_q(f) for f in (*files, *rest))}")


def disarm_argv(paths: JournalPaths) -> list[str]:
    """Remove the nonce file and put an empty file in its place, made exclusively; exit
    0 only when that create made it (a removal ``rm`` could not make, a nonce written
    in between, or anything but a regular file left at the path, exits 1).

    The empty file stays until the journal's files are removed: a prepare that made the
    journal and has not written the nonce yet cannot write it there (``set -C``), and a
    writer reads no nonce from it. Removing the file alone would let such a prepare,
    stopped and woken later, write its nonce after the disarm."""
    nonce = _q(paths.nonce_file)
    return _sh(
        f"rm -f -- {nonce} 2>/dev/null; (set -C && : > {nonce}) 2>/dev/null "
        f"&& [ -f {nonce} ] && [ ! -L {nonce} ]"
    )


def exists_argv(paths: JournalPaths) -> list[str]:
    return _sh(f"test -f {_q(paths.journal)}")


def liveness_argv(paths: JournalPaths) -> list[str]:
    """Exit 1 while the writer holds the lock, 0 once free, 3 before it ever ran."""
    lock = _q(paths.lock)
    return _sh(
        f"[ -e {lock} ] || exit {LIVENESS_NOT_STARTED}; "
        f"flock -n -E {LIVENESS_ALIVE} {lock} true 2>/dev/null"
    )


def list_argv(directory: str) -> list[str]:
    """Names in a journal directory (dot-files too); exit 3 when it does not exist."""
    d = _q(directory.rstrip("/") or "/")
    return _sh(f"[ -d {d} ] || exit 3; ls -1A -- {d} 2>/dev/null")


def _check_offset(from_byte: int) -> None:
    if isinstance(from_byte, bool) or not isinstance(from_byte, int) or from_byte < 0:
        raise JournalError(f"byte offset must be a non-negative integer, got {from_byte!r}")
