"""The `turnkeeper` command: operators' and scripts' entry to the fleet.

Exit codes: 0 success; 1 a failure (a bad setting, an unreachable server, a failed
check, no such run, a run id taken), reported as one line on stderr; 2 a usage error
(an unknown command or option, a value out of range, an id or agent the HTTP API would
refuse with 400), reported with the command's usage or as one line; 130 Ctrl-C.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

from turnkeeper.cli.app import app
from turnkeeper.errors import AgentError, InvalidInputError, LogOffsetError, TurnkeeperError

FAILURE = 1
USAGE = 2
QUICK_EXIT = frozenset({"status", "tail", "cancel", "submit", "runs", "sessions", "transcript"})
"""The commands a script calls in a loop: once one has done its work, the process ends
without tearing the interpreter down (``exit_now``)."""


def main() -> None:
    """The process's entry point; also where its garbage collection is set.

    Starting a command creates some 50,000 objects (modules, pydantic's and Typer's
    schemas) that live as long as the process, and the cyclic collector would scan them
    over and over as they pile up, then once more at exit, all for nothing: about 50 ms
    of a ``turnkeeper status`` (bench/cli_start.py). So it is off while the command
    starts; ``settings_from_env`` freezes what was made by then (never scanned again)
    and turns it back on before the command does its work, so a long-running command
    collects as any process does; and at exit, what is left is frozen too."""
    gc.disable()
    try:
        app(prog_name="turnkeeper")
    except TurnkeeperError as exc:
        details = ", ".join(f"{k}={v}" for k, v in exc.context().items() if k != "reason")
        print(f"error: {exc.message}" + (f" ({details})" if details else ""), file=sys.stderr)
        _exit(USAGE if is_usage_error(exc) else FAILURE)
    except KeyboardInterrupt:
        _exit(130)
    except SystemExit as done:
        _exit(done.code)
    finally:
        gc.freeze()
    _exit(0)


def _exit(code: int | str | None) -> None:
    """``sys.exit(code)``; for a ``QUICK_EXIT`` command, ``exit_now(code)``."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if command in QUICK_EXIT:
        exit_now(code)
    sys.exit(code)


def exit_now(code: int | str | None) -> None:
    """End the process at once, as ``sys.exit(code)`` would end it, without the
    interpreter's teardown: unloading some 1,500 modules (psycopg's, pydantic's, redis',
    Celery's) one by one costs a short command about 80 ms, a quarter of its life
    (bench/cli_start.py). Only for a command that has done its work: its output and logs
    are flushed here; what it opened (a connection, a pool) it closed itself, and the
    kernel closes whatever a library left open. ``atexit`` handlers do not run."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = FAILURE
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``) or a closed stream
            code = code or FAILURE
    os._exit(code or 0)


def is_usage_error(exc: TurnkeeperError) -> bool:
    """A command line the command cannot run as given, found by the code behind it: what
    the HTTP API answers with 400 (an argument the store refuses, an unknown agent or
    output format, an offset past a log's end), or options that do not go together."""
    return isinstance(exc, InvalidInputError | AgentError | LogOffsetError) or (
        exc.reason == "usage"
    )


__all__ = ["app", "exit_now", "main"]
