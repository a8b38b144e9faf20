"""Structured logging: JSON lines in production, readable lines in a terminal.

Every log line is one event with a name (``run.claimed``, ``lease.lost``) and
bound fields (``run_id``, ``attempt_id``, ``epoch``). Logs go to stderr, so that
stdout stays for what a command promises to print (a run id, JSON chunks).
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]

_STDLIB_FORMAT = "%(levelname)s %(name)s %(message)s"


def configure_logging(level: str = "INFO", fmt: LogFormat = "auto") -> None:
    numeric = logging.getLevelNamesMapping()[level]
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
    logging.basicConfig(level=numeric, stream=sys.stderr, format=_STDLIB_FORMAT)
    # Alembic narrates every migration step at INFO; its warnings still show.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, numeric))
