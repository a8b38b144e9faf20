"""The prune sweep of a journal directory: delete what is certainly dead, keep the rest.

Fail closed at every step: an unlistable directory deletes nothing; an undecodable or
truncated name is kept; a store that cannot answer keeps the run; a non-terminal run
is kept; a run the store does not know (an orphan) is deleted only when its newest
file is older than the orphan TTL by the sandbox's own clock, and only if that clock
and every mtime could be read. At most ``max_deletes`` runs are deleted per sweep.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

import structlog

from turnkeeper.errors import SandboxError
from turnkeeper.sandbox.codec import parse_journal_name
from turnkeeper.sandbox.journal import list_argv, mtime_argv
from turnkeeper.sandbox.preflight import TERMINAL_STATUSES, RunStatusLookup, lookup_status
from turnkeeper.sandbox.provider import Sandbox

log = structlog.get_logger(__name__)

DEFAULT_ORPHAN_TTL = 3600.0
DEFAULT_MAX_DELETES = 200
_MTIME_LINE = re.compile(r"(\d+) (.+)")


@dataclass(frozen=True, slots=True)
class Kept:
    names: tuple[str, ...]
    reason: str
    run_id: str | None = None


@dataclass
class PruneResult:
    listed: bool = False
    age_gate: Literal["listed", "unavailable"] = "unavailable"
    deleted: list[str] = field(default_factory=list)
    deleted_runs: list[str] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    failures: list[tuple[str, str | None, str]] = field(default_factory=list)


def parse_mtime_listing(output: bytes, directory: str) -> tuple[int | None, dict[str, int] | None]:
    """(sandbox clock, {name: mtime}) from ``mtime_argv`` output; mtimes None without witness."""
    lines = output.decode("utf-8", errors="replace").split("\n")
    now = int(lines[0]) if lines and lines[0].isdigit() else None
    prefix = directory.rstrip("/") + "/"
    witness = False
    mtimes: dict[str, int] = {}
    for line in lines[1:]:
        match = _MTIME_LINE.fullmatch(line)
        if match is None:
            continue
        path = match.group(2)
        if path == directory.rstrip("/"):
            witness = True
        elif path.startswith(prefix) and "/" not in path[len(prefix) :]:
            mtimes[path[len(prefix) :]] = int(match.group(1))
    return now, (mtimes if witness else None)


def prune_journals(
    sandbox: Sandbox,
    lookup: RunStatusLookup,
    *,
    directory: str | None = None,
    orphan_ttl: float = DEFAULT_ORPHAN_TTL,
    max_deletes: int = DEFAULT_MAX_DELETES,
) -> PruneResult:
    """Never raises; what it could not do is in ``failures`` and ``kept``."""
    directory = (directory or sandbox.ref.journal_dir).rstrip("/") or "/"
    result = PruneResult()
    try:
        listing = sandbox.exec(list_argv(directory), timeout=60)
    except SandboxError as exc:
        result.failures.append(("list", None, str(exc)))
        return result
    if listing.exit_code == 3:
        result.listed = True
        return result
    if listing.exit_code != 0:
        result.failures.append(("list", None, f"ls exited {listing.exit_code}"))
        return result
    result.listed = True
    names = [n for n in listing.stdout.decode("utf-8", errors="replace").split("\n") if n]

    now: int | None = None
    mtimes: dict[str, int] | None = None
    try:
        stat = sandbox.exec(mtime_argv(directory), timeout=60)
        now, mtimes = parse_mtime_listing(stat.stdout, directory)
    except SandboxError as exc:
        result.failures.append(("mtime-list", None, str(exc)))
    if mtimes is not None and now is not None:
        result.age_gate = "listed"

    by_run: dict[str, list[str]] = defaultdict(list)
    for raw in names:
        parsed = parse_journal_name(raw)
        if parsed.kind != "run" or parsed.run_id is None:
            result.kept.append(Kept((raw,), parsed.kind))
            continue
        by_run[parsed.run_id].append(raw)

    deletions = 0
    for run_id, files in by_run.items():
        kept_reason = _keep_reason(
            run_id,
            files=files,
            lookup=lookup,
            now=now,
            mtimes=mtimes,
            orphan_ttl=orphan_ttl,
            result=result,
        )
        if kept_reason is None and deletions >= max_deletes:
            kept_reason = "max-deletes"
        if kept_reason is not None:
            result.kept.append(Kept(tuple(files), kept_reason, run_id))
            continue
        deletions += 1
        script = "rm -f -- " + " ".join(shlex.quote(f"{directory}/{f}") for f in files)
        try:
            removed = sandbox.exec(["/bin/sh", "-c", script], timeout=60)
        except SandboxError as exc:
            result.failures.append(("delete", run_id, str(exc)))
            result.kept.append(Kept(tuple(files), "delete-failed", run_id))
            continue
        if removed.exit_code != 0:
            result.failures.append(("delete", run_id, f"rm exited {removed.exit_code}"))
            result.kept.append(Kept(tuple(files), "delete-failed", run_id))
            continue
        result.deleted.extend(files)
        result.deleted_runs.append(run_id)
    log.info(
        "journal.pruned",
        directory=directory,
        deleted=len(result.deleted_runs),
        kept=len(result.kept),
        failures=len(result.failures),
    )
    return result


def _keep_reason(
    run_id: str,
    *,
    files: list[str],
    lookup: RunStatusLookup,
    now: int | None,
    mtimes: dict[str, int] | None,
    orphan_ttl: float,
    result: PruneResult,
) -> str | None:
    status = lookup_status(lookup, run_id)
    if isinstance(status, Exception):
        result.failures.append(("store", run_id, str(status)))
        return "store-error"
    if status is not None:
        return None if status in TERMINAL_STATUSES else "non-terminal"
    if mtimes is None or now is None:
        return "age-gate-unavailable"
    if any(f not in mtimes for f in files):
        return "age-gate-missing-entry"
    if max(mtimes[f] for f in files) > now - orphan_ttl:
        return "orphan-too-recent"
    return None
