"""One root for every error turnkeeper raises, a group per part.

Callers catch a group (``StoreError``, ``LogError``...) or the root; no caller
ever needs to catch a psycopg, redis or subprocess type, because each part wraps
its driver's exceptions with ``raise ... from exc``.

Errors carry structured fields (``run_id``, ``attempt_id``, ``epoch``,
``reason``) so that logs and operators see who was affected without parsing
the message. A class's docstring is its default message.
"""

from __future__ import annotations

from typing import Any


class TurnkeeperError(Exception):
    """turnkeeper failed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        run_id: str | None = None,
        attempt_id: str | None = None,
        epoch: int | None = None,
        reason: str | None = None,
        **fields: Any,
    ) -> None:
        self.message = message or (type(self).__doc__ or "").strip().splitlines()[0]
        self.run_id = run_id
        self.attempt_id = attempt_id
        self.epoch = epoch
        self.reason = reason
        self.fields = fields
        super().__init__(self.message)

    def context(self) -> dict[str, Any]:
        """The structured fields that are set, for logs and JSON error bodies."""
        known = {
            "run_id": self.run_id,
            "attempt_id": self.attempt_id,
            "epoch": self.epoch,
            "reason": self.reason,
        }
        return {k: v for k, v in {**known, **self.fields}.items() if v is not None}

    def __str__(self) -> str:
        ctx = self.context()
        if not ctx:
            return self.message
        details = ", ".join(f"{k}={v!r}" for k, v in ctx.items())
        return f"{self.message} ({details})"


# --- configuration and the embedded stack --------------------------------------


class ConfigError(TurnkeeperError):
    """A setting is missing or invalid."""


class ServiceError(TurnkeeperError):
    """A service turnkeeper depends on (Postgres, Redis, the broker) is unusable."""


class EmbeddedStackError(ServiceError):
    """The embedded Postgres or Redis server could not be started or stopped."""


class BrokerUnavailableError(ServiceError):
    """The Celery broker could not be reached: a message was not sent."""


# --- store ---------------------------------------------------------------------


class StoreError(TurnkeeperError):
    """The run store failed."""


class StoreUnavailableError(StoreError, ServiceError):
    """The database could not be reached; the operation may be retried."""


class RunConflictError(StoreError):
    """A run with this run_id already exists with a different payload."""


class SessionDeletedError(StoreError):
    """The run's session was deleted; the run will not run again."""


class SessionBusyError(StoreError):
    """The session has a queued or running run and cannot be deleted."""


class InvalidInputError(StoreError):
    """An argument is invalid (unknown phase or status, a payload that is not JSON)."""


class SegmentConflictError(StoreError):
    """A different body was offered for a segment that is already stored."""


class TranscriptConflictError(StoreError):
    """The session's transcript leaf moved: another writer appended first."""


# --- sandbox and journal -------------------------------------------------------


class SandboxError(TurnkeeperError):
    """A sandbox operation failed."""


class SandboxGoneError(SandboxError):
    """The sandbox no longer exists."""


class SandboxUnreachableError(SandboxError, ServiceError):
    """The sandbox's host could not be reached; the sandbox itself may be fine.

    A transport failure (an ssh connection dropped or refused, a command that never
    answered), never an answer from the sandbox: retried, and never a reason to fail
    a run.
    """


class EgressProxyError(SandboxError):
    """The egress proxy for sandboxed agents could not be started."""


class EgressRefusedError(SandboxError):
    """The egress proxy refused a request (its ``status`` says how)."""

    def __init__(self, status: int, reason: str, message: str, **fields: Any) -> None:
        super().__init__(message, reason=reason, **fields)
        self.status = status


class JournalError(TurnkeeperError):
    """Reading or writing a run journal failed."""


class JournalStalledError(JournalError):
    """No first byte arrived in the journal within the stall deadline."""


class AgentVanishedError(JournalError):
    """The agent process is gone and its journal has no exit sentinel."""


class InvalidSentinelError(JournalError):
    """A line claims to be the exit sentinel but is not a valid one."""


class JournalTooLargeError(JournalError):
    """The journal grew past its size limit."""


class RunIdEncodingError(JournalError):
    """A journal file name does not decode to a run id."""


class JournalExistsError(JournalError):
    """This agent process's journal already exists; a journal is never appended to twice."""


# --- agents --------------------------------------------------------------------


class AgentError(TurnkeeperError):
    """An agent spec or its output could not be used."""


class UnknownAgentError(AgentError):
    """No agent preset or output format has this name."""


class PromptError(AgentError):
    """The agent cannot be given this prompt."""


class EmptyPromptError(PromptError):
    """The prompt is empty: a run needs input."""


class PromptTooLongError(PromptError):
    """The prompt is longer than the agent can be given."""


# --- run log -------------------------------------------------------------------


class LogError(TurnkeeperError):
    """The run log refused or failed an operation."""


class LogUnavailableError(LogError, ServiceError):
    """Redis could not be reached; the operation may be retried."""


class LogFencedError(LogError):
    """The log's epoch is higher than the writer's: another attempt owns the run."""


class LogClosedError(LogError):
    """The log is closed; nothing more can be appended."""


class SequenceConflictError(LogError):
    """The append does not start at the log's next sequence number."""


class LogGoneError(LogError):
    """The requested offset was removed by retention."""


class LogNotFencedError(LogError):
    """The writer's epoch is above the log's: fence the log before writing to it."""


class LogOffsetError(LogError):
    """The requested offset is past the end of the log."""


class AlignmentError(LogError):
    """A replayed journal does not line up with the stored log."""


class JournalReplayDivergedError(AlignmentError):
    """A replayed chunk differs from the chunk stored at the same position."""


class JournalReplayShortError(AlignmentError):
    """The replayed journal ends before the stored log does."""


# --- driver, workers, reconciler ----------------------------------------------


class DriverError(TurnkeeperError):
    """A turn could not be driven."""


class OwnershipLostError(DriverError):
    """The lease was lost: another attempt owns the run now."""


class RecoveryError(DriverError):
    """A taken-over run could not be recovered."""


# --- web and client ------------------------------------------------------------


class ClientError(TurnkeeperError):
    """A request from the client failed."""


class RunNotFoundError(ClientError):
    """No run has this run_id."""


class SessionNotFoundError(ClientError):
    """No session has this session_id."""


class AuthenticationError(ClientError):
    """No valid API key or stream token came with the request."""


class AuthorizationHeaderError(AuthenticationError):
    """The ``Authorization`` header is not ``Bearer KEY``."""


class UnsupportedMediaTypeError(ClientError):
    """The request body must be JSON, sent with ``Content-Type: application/json``."""


class NotPermittedError(ClientError):
    """The API key may not do this (a scope or the agent catalog forbids it)."""


class MethodNotAllowedError(ClientError):
    """The resource does not take this method (a run's Durable Stream is read-only)."""


class QuotaExceededError(ClientError):
    """The API key is over one of its quotas; retry after ``retry_after`` seconds."""


class ApiKeyError(StoreError):
    """An API key cannot be created, found or used under this name."""
