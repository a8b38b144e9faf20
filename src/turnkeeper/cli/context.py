"""What every command needs: settings from the environment, logging, and the services.

Each command imports what it runs on when it runs (the settings, the store, the
servers' lookup), so that ``turnkeeper --help`` and the commands a script calls in a
loop start fast (bench/cli_start.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from turnkeeper.config import Settings
    from turnkeeper.store.store import Store


class _LazyConsole:
    """A rich ``Console`` made on its first use: the commands a script calls in a loop
    print plain lines and need no rich (bench/cli_start.py)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


console = cast("Console", _LazyConsole(soft_wrap=True))
err_console = cast("Console", _LazyConsole(stderr=True, soft_wrap=True))


def settings_from_env(*, quiet: bool = True) -> Settings:
    """Read the settings. ``quiet`` commands log only warnings; long-running ones, LOG_LEVEL."""
    from turnkeeper.config import load_settings
    from turnkeeper.logconfig import configure_logging

    settings = load_settings()
    level = settings.log_level
    if quiet and level in {"DEBUG", "INFO"}:
        level = "WARNING"
    configure_logging(level, settings.log_format)
    if not gc.isenabled():  # ``main`` starts a command without it (see there): work begins
        gc.freeze()
        gc.enable()
    return settings


def with_dev_secret(settings: Settings) -> Settings:
    """``dev`` and ``demo``: the configured secret, else one generated into the data
    directory (0600) that every process they start shares."""
    from turnkeeper.secret import ensure_dev_secret

    if settings.secret is not None or settings.secret_file is not None:
        return settings
    return settings.model_copy(update={"secret_file": ensure_dev_secret(settings.data_dir)})


@contextmanager
def services(settings: Settings, *, start: bool, keep: bool = False) -> Iterator[Settings]:
    """Settings with both URLs set; embedded servers this started are stopped on exit."""
    if not settings.uses_embedded:  # both URLs given: no embedded server to look up
        yield settings
        return
    from turnkeeper.embedded import EmbeddedStack, resolve_services

    resolved, urls = resolve_services(settings, start=start)
    try:
        yield resolved
    finally:
        if urls is not None and urls.started and not keep:
            EmbeddedStack.from_settings(settings).stop(only=urls.started)


@contextmanager
def store_from_env() -> Iterator[Store]:
    """The store alone, on one connection: what a command that only reads or writes the
    database needs (no log, no broker, no Celery to load)."""
    from turnkeeper.store.store import Store

    settings = settings_from_env()
    with (
        services(settings, start=False) as resolved,
        Store(resolved.require_database_url(), pool_size=1) as store,
    ):
        yield store


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)
