"""The process limits a worker raises for itself before it takes turns.

A live turn holds a few descriptors for its whole life (the pipe of its journal's
``tail -F``, the stop pipe its reader waits on, its probes' pipes while they run), so
a worker process holding hundreds of turns (the threads pool) needs more than the
soft limit of open files most service managers start it with (1024). The hard limit
is the operator's bound; the soft one is only a default, raised here to it.
"""

from __future__ import annotations

import resource

import structlog

log = structlog.get_logger(__name__)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard in (resource.RLIM_INFINITY, soft):  # nothing to raise, or no number to raise to
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # a platform that refuses: keep the soft one
        log.warning("worker.open_files_limit_kept", soft=soft, hard=hard, error=str(exc))
        return soft
    return hard
