"""Structured logging: JSON lines in production, readable lines in a terminal.

Every log line is one event with a name (``run.claimed``, ``lease.lost``) and
bound fields (``run_id``, ``attempt_id``, ``epoch``). Logs go to stderr, so that
stdout stays for what a command promises to print (a run id, JSON chunks).

Importing structlog costs a command a script calls in a loop (``turnkeeper status``)
about 35 ms, most of it rich's tracebacks and pygments, which ``structlog.dev`` loads
whenever rich is installed (bench/cli_start.py), and such a command logs nothing. So
the modules of its path log through ``get_logger``, which imports structlog on the
first event, and ``configure_logging`` run before structlog is loaded configures it
the moment anything loads it: no event is ever emitted by an unconfigured structlog.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from collections.abc import Sequence

LogFormat = Literal["auto", "json", "console"]

_STDLIB_FORMAT = "%(levelname)s %(name)s %(message)s"

# The configuration to apply once structlog loads, set while it is not loaded yet.
_pending: tuple[int, LogFormat] | None = None


def configure_logging(level: str = "INFO", fmt: LogFormat = "auto") -> None:
    numeric = logging.getLevelNamesMapping()[level]
    _configure_structlog_once_loaded(numeric, fmt)
    logging.basicConfig(level=numeric, stream=sys.stderr, format=_STDLIB_FORMAT)
    # Alembic narrates every migration step at INFO; its warnings still show.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, numeric))


def configure_library_logging(fmt: LogFormat = "auto") -> None:
    """For an application that uses the trusted client and never configured structlog:
    warnings and errors on stderr, nothing on its stdout (structlog's own default
    prints every event there). An application's own configuration is left alone: one
    made before this (structlog is then loaded and configured, or ``configure_logging``
    ran) is kept, one made after replaces this one."""
    if "structlog" in sys.modules:
        import structlog  # noqa: PLC0415 - loaded already

        if not structlog.is_configured():
            _configure_structlog(logging.WARNING, fmt)
    elif _pending is None:
        _configure_structlog_once_loaded(logging.WARNING, fmt)


def get_logger(name: str) -> Any:
    """structlog's logger for ``name`` (a module's), imported on its first event rather
    than with the module: see the module's docstring."""
    return _LazyLogger(name)


# The level of each event method, for dropping one below the pending level unloaded.
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


class _LazyLogger:
    """Loads structlog on its first event, unless that event is below the level that
    structlog will be configured with: it is dropped then, as structlog's filtering
    logger would drop it (a ``turnkeeper cancel`` logs ``run.cancel_requested`` at
    info, and shows warnings only)."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            level = _LEVELS.get(method)
            if _pending is not None and level is not None and level < _pending[0]:
                return _dropped
            import structlog  # noqa: PLC0415 - on the first event: see the module

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, method)


def _dropped(*_args: Any, **_fields: Any) -> None:
    return None


def _configure_structlog_once_loaded(numeric: int, fmt: LogFormat) -> None:
    global _pending  # noqa: PLW0603 - one configuration per process, as structlog's own
    if "structlog" in sys.modules:
        _configure_structlog(numeric, fmt)
        return
    if _pending is None:
        sys.meta_path.insert(0, _ConfigureOnLoad())
    _pending = (numeric, fmt)


class _ConfigureOnLoad(importlib.abc.MetaPathFinder):
    """Finds structlog as the finders after it would, with a loader that applies the
    pending configuration as soon as structlog's module ran, before the import returns
    to anyone. It stays in place until then (a mere ``find_spec`` loads nothing)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "structlog":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenConfigure(spec.loader)
                return cast("ModuleSpec", spec)
        return None


class _ThenConfigure(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # structlog as it would have been loaded
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _ConfigureOnLoad)]
        global _pending  # noqa: PLW0603
        if _pending is not None:
            numeric, fmt = _pending
            _pending = None
            _configure_structlog(numeric, fmt)


def _configure_structlog(numeric: int, fmt: LogFormat) -> None:
    import structlog  # noqa: PLC0415 - see the module's docstring

    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
