"""What every command needs: settings from the environment, logging, and the services."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from turnkeeper.config import Settings, load_settings
from turnkeeper.embedded import EmbeddedStack, resolve_services
from turnkeeper.logconfig import configure_logging
from turnkeeper.secret import ensure_dev_secret

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def settings_from_env(*, quiet: bool = True) -> Settings:
    """Read the settings. ``quiet`` commands log only warnings; long-running ones, LOG_LEVEL."""
    settings = load_settings()
    level = settings.log_level
    if quiet and level in {"DEBUG", "INFO"}:
        level = "WARNING"
    configure_logging(level, settings.log_format)
    return settings


def with_dev_secret(settings: Settings) -> Settings:
    """``dev`` and ``demo``: the configured secret, else one generated into the data
    directory (0600) that every process they start shares."""
    if settings.secret is not None or settings.secret_file is not None:
        return settings
    return settings.model_copy(update={"secret_file": ensure_dev_secret(settings.data_dir)})


@contextmanager
def services(settings: Settings, *, start: bool, keep: bool = False) -> Iterator[Settings]:
    """Settings with both URLs set; embedded servers this started are stopped on exit."""
    resolved, urls = resolve_services(settings, start=start)
    try:
        yield resolved
    finally:
        if urls is not None and urls.started and not keep:
            EmbeddedStack.from_settings(settings).stop(only=urls.started)


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)
