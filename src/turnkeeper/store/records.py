"""The store's value types and the checks run on every argument before any SQL.

Rows come back as frozen dataclasses so nobody mutates what the database said;
statuses and phases are StrEnums so an unknown one is refused in Python.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Self, get_args, get_type_hints

from turnkeeper.errors import InvalidInputError

MAX_ID_LENGTH = 255
# C0 and C1 controls, the line and paragraph separators, and the bidi embeddings,
# overrides and isolates: ids are printed in logs, terminals and the dashboard, where
# these break a line or reorder the text around them.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""A NUL's escape in JSON text: a backslash that no other escapes, then ``u0000`` (the
six characters ``\\u0000`` of a string's text are an escaped backslash, no NUL)."""
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
NUL_SHOWN = "\u2400"
"""What a NUL becomes where it must be stored: ␀, the symbol for null."""
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        return self not in (RunStatus.QUEUED, RunStatus.RUNNING)


class TurnPhase(StrEnum):
    BEFORE_PROVIDER = "before_provider"
    PROVIDER_STARTED = "provider_started"
    TOOL_REQUEST_RECORDED = "tool_request_recorded"
    COMMITTED = "committed"


# Forward moves within a turn; `committed` is reached only through commit_turn_slot.
PHASE_PREDECESSORS: Mapping[TurnPhase, tuple[TurnPhase, ...]] = {
    TurnPhase.PROVIDER_STARTED: (TurnPhase.BEFORE_PROVIDER,),
    TurnPhase.TOOL_REQUEST_RECORDED: (TurnPhase.PROVIDER_STARTED,),
    TurnPhase.COMMITTED: (TurnPhase.PROVIDER_STARTED, TurnPhase.TOOL_REQUEST_RECORDED),
}


class Verdict(StrEnum):
    """The store's answer to an owner's write: made, or refused and why.

    A refusal is an answer, never an exception: losing a run is expected, and a
    write refused for its state is usually one a retry already made.
    """

    DONE = "done"
    NOT_OWNER = "not-owner"
    """Another attempt owns the run, or it is settled: the writer lost it."""
    WRONG_STATE = "wrong-state"
    """The writer still owns the run, but the row is not in the state this write
    needs (it was already made, or the turn moved on)."""


class Record:
    """A row of the store as a frozen dataclass: the row's columns are its fields (any
    other column is not read), and a field typed with one of the store's enums gets
    the enum member of the value the row holds (an unknown one is refused)."""

    __slots__ = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        names, enums = _shape(cls)
        values = {name: row[name] for name in names if name in row}
        for name, enum in enums:
            if values.get(name) is not None:
                values[name] = enum(values[name])
        return cls(**values)


_Shape = tuple[tuple[str, ...], tuple[tuple[str, type[StrEnum]], ...]]
_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type[Any]) -> _Shape:
    """A record's field names, and the fields typed with an enum (alone, or or-ed with
    None) with that enum; worked out once a class."""
    shape = _SHAPES.get(cls)
    if shape is None:
        enums = tuple(
            (name, kind)
            for name, hint in get_type_hints(cls).items()
            for kind in get_args(hint) or (hint,)
            if isinstance(kind, type) and issubclass(kind, StrEnum)
        )
        shape = _SHAPES[cls] = (tuple(f.name for f in fields(cls)), enums)
    return shape


@dataclass(frozen=True, slots=True)
class Claim(Record):
    """Proof of ownership: every owner write is guarded by ``attempt_id``."""

    run_id: str
    attempt_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Run(Record):
    run_id: str
    seq: int
    session_id: str
    status: RunStatus
    payload: Any
    attempt_id: str | None
    epoch: int
    owner: str | None
    lease_expires_at: datetime | None
    attempt_count: int
    max_attempts: int
    deadline: datetime | None
    cancel_requested_at: datetime | None
    sandbox_ref: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    error: Any
    dispatched_at: datetime | None
    pruned_at: datetime | None
    key_name: str | None = None
    """The API key the run belongs to; None for a trusted client's own runs."""
    handed_over_at: datetime | None = None
    """Set while the run awaits a worker's adoption of its new attempt (no lease runs)."""
    sandbox_host: str | None = None
    """The host that made the run's sandbox (``hosts.py``); None before it has one."""
    agent_session_id: str | None = None
    """The agent's own conversation id its output reported, recorded at the settle."""

    @property
    def awaiting_adoption(self) -> bool:
        return self.handed_over_at is not None

    @property
    def keeps_workspace(self) -> bool:
        """A run of a named session works in its session's workspace, which outlives it;
        a run submitted without one (its session id is its run id) has a sandbox of its
        own, destroyed once it settled (docs/architecture.md, "Session workspaces")."""
        return self.session_id != self.run_id


@dataclass(frozen=True, slots=True)
class AttemptRecord(Record):
    """One attempt of a run, as the ``attempts`` table keeps it."""

    attempt_id: str
    epoch: int
    owner: str
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    """None while the attempt is open; ``superseded`` for one handed over."""
    handover_cause: str | None
    """Why a superseded attempt was handed over: ``crash``, ``lease`` or ``forced``."""
    log_seq: int | None
    """Where a takeover's attempt began in the run log (the first seq it could append);
    None for a first claim and for a takeover that recorded none."""
    first_stored_at: datetime | None = None
    """When the attempt first stored journal bytes (None: it stored none)."""
    last_stored_at: datetime | None = None
    """When it last did."""


@dataclass(frozen=True, slots=True)
class ApiKey(Record):
    """An API key as the store knows it: its name and scopes, never the key itself."""

    name: str
    admin: bool
    allow_commands: bool
    max_running: int | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class Worker(Record):
    """A worker process as its heartbeats left it: its host, and any drain it was given."""

    worker_id: str
    host_id: str
    pid: int
    main_pid: int
    started_at: datetime
    last_seen: datetime
    draining_at: datetime | None
    hand_over_at: datetime | None
    alive: bool
    """Seen within ``host_dead_after`` (the database clock)."""


@dataclass(frozen=True, slots=True)
class WorkerOrders:
    """What a worker's heartbeat answers: stop taking runs, and hand over the rest now."""

    draining: bool
    hand_over_due: bool


@dataclass(frozen=True, slots=True)
class PlacedSandbox(Record):
    """A sandbox some run's placement still names, and the host that made it."""

    run_id: str
    status: RunStatus
    owner: str | None
    sandbox_host: str | None
    awaiting_adoption: bool
    provider: str | None
    sandbox_id: str | None


@dataclass(frozen=True, slots=True)
class TurnSlot(Record):
    """The one turn slot of a run: how far its current turn got."""

    run_id: str
    attempt_id: str
    turn_index: int
    turn_id: str
    phase: TurnPhase
    revision: int
    journal_key: str | None
    tool_request: Any
    checkpoint_leaf_id: str | None
    committed_leaf_id: str | None
    journal_consumed_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class BegunRun:
    """A fresh claim (``claim_and_begin``) and what its one statement did besides."""

    claim: Claim
    run: Run
    """The run as claimed: running under ``claim``."""
    slot: TurnSlot | None
    """Turn 0 begun, the run's input appended under the session's leaf; None: neither
    (a branch, whose input the driver appends once it checked the branch)."""
    input_parent: str | None
    """The entry the input was appended under (None: it opened the conversation)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> BegunRun:
        run = Run.from_row({f.name: row[f.name] for f in fields(Run)})
        slot = None
        if row.get("slot_run_id") is not None:
            slot = TurnSlot.from_row({f.name: row[f"slot_{f.name}"] for f in fields(TurnSlot)})
        return cls(Claim.from_row(row), run, slot, row["input_parent"] if slot else None)


@dataclass(frozen=True, slots=True)
class NewEntry:
    """A transcript entry to append; its id must be deterministic so a replay is a no-op."""

    entry_id: str
    kind: str
    body: Any


@dataclass(frozen=True, slots=True)
class TranscriptEntry(Record):
    session_id: str
    entry_id: str
    parent_id: str | None
    run_id: str
    attempt_id: str
    kind: str
    body: Any
    position: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SessionSummary(Record):
    """A session as a list shows it: its tenant, its leaf, its runs and the latest one."""

    session_id: str
    key_name: str | None
    leaf_id: str | None
    """The entry the session's next message follows (None: nothing committed yet)."""
    created_at: datetime
    updated_at: datetime
    run_count: int
    last_run_id: str | None
    last_status: RunStatus | None
    last_run_at: datetime | None
    """When the latest run was admitted."""


@dataclass(frozen=True, slots=True)
class FleetCounts(Record):
    """The store's side of the fleet's metrics, read in one statement."""

    runs_by_status: dict[str, int]
    attempts_by_outcome: dict[str, int]
    """``running`` for open attempts."""
    takeovers_by_cause: dict[str, int]
    expired_leases: int
    """Running runs whose lease expired (the database clock), awaiting a takeover."""
    max_epoch: int
    """The highest epoch of a queued or running run."""


@dataclass(frozen=True, slots=True)
class RunWindow:
    """When the runs a list shows were created or finished: each bound optional,
    ``since`` included, ``until`` not (a chart's minute links to exactly its runs)."""

    created_since: datetime | None = None
    created_until: datetime | None = None
    finished_since: datetime | None = None
    finished_until: datetime | None = None

    def params(self) -> dict[str, datetime | None]:
        """The bounds as the statements' parameters, each checked to carry its zone (a
        naive time would be read in the database session's zone)."""
        bounds = {field.name: getattr(self, field.name) for field in fields(self)}
        for name, value in bounds.items():
            if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
                raise InvalidInputError(
                    f"{name} must be a time with its zone, got {value!r}",
                    reason=f"invalid-{name.replace('_', '-')}",
                )
        return bounds


@dataclass(frozen=True, slots=True)
class OwnedRun:
    """A running run a worker process owns, on the database clock."""

    run_id: str
    epoch: int
    held_seconds: float | None
    """Since its current attempt started (claim or adoption)."""
    lease_seconds_left: float | None
    """Negative once expired."""


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """One worker process (a slot of its Celery worker) and the runs it owns."""

    worker_id: str
    host_id: str
    pid: int
    main_pid: int
    started_at: datetime
    last_seen: datetime
    draining: bool
    alive: bool
    """Its process lives, as far as the database tells: seen within ``host_dead_after``
    (the database clock), and either it has a session on the database or it has missed
    no beat. A killed process's sessions end with it, so it stops counting one beat
    and a half after its last one, not ``host_dead_after`` later."""
    silent_seconds: float
    """Since its last heartbeat."""
    runs: tuple[OwnedRun, ...]

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> WorkerSlot:
        fields = dict(row)
        fields["runs"] = tuple(OwnedRun(**run) for run in fields["runs"])
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class FleetMinute(Record):
    """One minute of the fleet's activity: runs started, settled and taken over."""

    minute: datetime
    started: int
    settled: dict[str, int]
    """By status: completed, failed, aborted."""
    takeovers: dict[str, int]
    """By cause: crash, lease, forced."""


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Takeover pauses in seconds counted per bucket: ``counts[i]`` below ``bounds[i]``
    (and at or past the bound before it); the last one past them all. A pause is what
    the run page says of the takeover: the gap in the run's stored output, from the
    predecessor's last bytes to the successor's first, or, when either stored none, the
    wait from the hand-over to the adoption."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    p50: float | None
    p95: float | None
    max: float | None


@dataclass(frozen=True, slots=True)
class Sweep(Record):
    """When one of beat's periodic sweeps last finished, on the database clock."""

    name: str
    finished_at: datetime
    seconds_ago: float


@dataclass(frozen=True, slots=True)
class Segment:
    journal_key: str
    byte_start: int
    byte_end: int
    body: bytes


# --- argument checks -------------------------------------------------------------------


def check_id(value: object, what: str) -> str:
    """Ids are non-empty strings of at most 255 characters without control characters."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"{what} must be a non-empty string of at most {MAX_ID_LENGTH} characters",
            reason=f"invalid-{what.replace('_', '-')}",
        )
    if _CONTROL_CHARACTER.search(value) is not None:
        raise InvalidInputError(
            f"{what} contains a control character", reason=f"invalid-{what.replace('_', '-')}"
        )
    return value


_KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_key_name(value: object) -> str:
    """Key names are short and plain: they appear in Redis keys, logs and tables."""
    if not isinstance(value, str) or _KEY_NAME.fullmatch(value) is None:
        raise InvalidInputError(
            "a key name is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter "
            f"or digit; got {str(value)[:70]!r}",
            reason="invalid-key-name",
        )
    return value


def check_optional_id(value: object, what: str) -> str | None:
    return None if value is None else check_id(value, what)


def check_seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{what} must be a number of seconds", reason=f"invalid-{what}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidInputError(f"{what} must be a positive number of seconds, got {value!r}")
    return seconds


def check_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"limit must be a positive integer, got {value!r}")
    return value


def check_claim(claim: object) -> Claim:
    if not isinstance(claim, Claim):
        raise InvalidInputError("expected a Claim from claim_run or a replacement")
    check_id(claim.run_id, "run_id")
    check_id(claim.attempt_id, "attempt_id")
    return claim


def to_json(value: Any, what: str) -> str:
    """Serialize for a jsonb column; refuse what JSON cannot hold, including NUL."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"{what} is not JSON-serializable: {exc}", reason="not-json"
        ) from exc
    if _JSON_NUL.search(text) is not None:
        raise InvalidInputError(f"{what} contains a NUL character", reason="not-json")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"{what} holds a lone UTF-16 surrogate", reason="not-json"
        ) from None
    return text


def storable(value: Any) -> Any:
    """``value`` with every string, keys included, one that jsonb and text columns can
    hold: a NUL becomes ␀ (``NUL_SHOWN``), a lone UTF-16 surrogate (no character: JSON
    can escape one, UTF-8 cannot encode it) U+FFFD.

    For what an agent wrote and a run must keep anyway (its error, its stderr): refusing
    it would let an agent replace its own failure with a storage error."""
    if isinstance(value, str):
        return _UNSTORABLE.sub(_shown, value)
    if isinstance(value, Mapping):
        return {storable(key): storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [storable(item) for item in value]
    return value


def _shown(match: re.Match[str]) -> str:
    return NUL_SHOWN if match.group() == "\x00" else "\ufffd"


def check_status(value: object) -> RunStatus:
    if not isinstance(value, str):
        raise InvalidInputError(f"unknown run status {value!r}", reason="invalid-status")
    try:
        return RunStatus(value)
    except ValueError:
        raise InvalidInputError(
            f"unknown run status {value[:40]!r}", reason="invalid-status"
        ) from None


def check_phase(value: object) -> TurnPhase:
    if not isinstance(value, str):
        raise InvalidInputError(f"unknown turn phase {value!r}", reason="invalid-phase")
    try:
        return TurnPhase(value)
    except ValueError:
        raise InvalidInputError(f"unknown turn phase {value!r}", reason="invalid-phase") from None
