"""What the ``turnkeeper`` command prints, spelled out for exact assertions."""

from __future__ import annotations


def usage_error(command: str, error: str) -> str:
    """A usage error's stderr (exit 2): the command's usage, where to find help, and the
    error, as the CLI library prints them."""
    return (
        f"Usage: turnkeeper {command} [OPTIONS]{_ARGUMENTS.get(command, '')}\n"
        f"Try 'turnkeeper {command} --help' for help.\n\n"
        f"Error: {error}\n"
    )


_ARGUMENTS = {
    "status": " {RUN_ID}",
    "tail": " {RUN_ID}",
    "cancel": " {RUN_ID}",
    "transcript": " {SESSION}",
    "chat": " [SESSION]",
}
