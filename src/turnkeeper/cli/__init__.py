"""The `turnkeeper` command: operators' and scripts' entry to the fleet.

Exit codes: 0 success; 1 a failure (a bad setting, an unreachable server, a
failed check), reported as one line on stderr; 2 a usage error; 130 Ctrl-C.
"""

from __future__ import annotations

import sys

from turnkeeper.cli.app import app
from turnkeeper.errors import TurnkeeperError


def main() -> None:
    try:
        app()
    except TurnkeeperError as exc:
        details = ", ".join(f"{k}={v}" for k, v in exc.context().items() if k != "reason")
        print(f"error: {exc.message}" + (f" ({details})" if details else ""), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["app", "main"]
