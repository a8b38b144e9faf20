"""The env values a worker gives an agent from its own side, read as it builds the sandbox.

``env_from`` names variables of the worker's environment, ``env_files`` maps names to
files on the worker's host (``/etc/turnkeeper/anthropic.key``). Either way the value
exists only in the worker's memory and the agent's env: never in the run's payload,
in Postgres, in Redis or in a log line, which name the variable (and the file) only.
Only the operator's catalog may set them (``turnkeeper.agents.catalog``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.errors import AgentError

MAX_FILE_BYTES = 64 * 1024
"""A key file is a line: anything longer is a wrong path (a log, a device), refused."""


def read_env_file(name: str, path: str) -> str:
    """The value of ``name`` from the file ``path``: its text without the trailing newline.

    AgentError (reason ``env-file``) names the variable and the file when it cannot be
    read, is no regular file, is empty, too long or not UTF-8; the message never holds
    any of the file's content.
    """

    def refused(problem: str) -> AgentError:
        return AgentError(
            f"cannot read {path}, the file env_files names for {name}: {problem}",
            reason="env-file",
        )

    try:
        with Path(path).open("rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise refused("not a regular file")
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise refused(exc.strerror or type(exc).__name__) from exc
    if len(data) > MAX_FILE_BYTES:
        raise refused(f"longer than {MAX_FILE_BYTES // 1024} KiB")
    try:
        value = data.decode().rstrip("\r\n")
    except UnicodeDecodeError:
        raise refused("not UTF-8 text") from None
    if not value:
        raise refused("it is empty")
    if "\x00" in value:
        raise refused("it holds a NUL byte")
    return value


def worker_values(
    spec: AgentSpec, environ: Mapping[str, str] = os.environ, *, run_id: str | None = None
) -> dict[str, str]:
    """The values ``spec.env_from`` and ``spec.env_files`` name, read now: AgentError
    (``missing-env``, ``env-file``) when one of them is not there."""
    missing = [name for name in spec.env_from if name not in environ]
    if missing:
        raise AgentError(
            f"the worker's environment has no {', '.join(missing)}, which the agent's "
            "env_from names; set it on every worker",
            run_id=run_id,
            reason="missing-env",
        )
    values = {name: environ[name] for name in spec.env_from}
    for name, path in spec.env_files.items():
        try:
            values[name] = read_env_file(name, path)
        except AgentError as exc:
            raise AgentError(exc.message, run_id=run_id, reason=exc.reason) from exc
    return values
