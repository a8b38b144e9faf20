"""The sandbox provider protocol: what a driver, a reaper and a journal reader may ask of a sandbox.

A provider creates, resumes and destroys sandboxes by a JSON-serializable reference
(stored in Postgres), and a sandbox runs commands: ``exec`` (bounded, captured),
``spawn`` (streamed stdout, killable as a whole process group) and
``start_detached`` (fire and forget, outlives the caller). Those are the sandbox's
host side: journal helpers and the writer run there with the base environment only,
outside any jail. Only the agent itself is jailed, by the shell code ``launch`` gives
the writer. Every journal touch is a command, so the same journal code serves a local
directory, a bubblewrap jail and a host reached over SSH.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol, runtime_checkable

from turnkeeper.errors import SandboxError
from turnkeeper.sandbox.command import AgentCommand, AgentLaunch
from turnkeeper.sandbox.journal import JournalPaths

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a sandbox can do; readers pick their strategy from these, never from a name."""

    background_processes: bool
    killable_processes: bool
    durable_filesystem: bool
    network_isolation: bool
    resource_limits: bool


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """How a sandbox is built. What an agent gets (its environment, its prompt) is not
    here: it is given per agent process and never stored with the sandbox."""

    journal_max_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxSpec:
        return cls(journal_max_bytes=_optional_int(data.get("journal_max_bytes")))


def _optional_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SandboxError(f"expected a positive integer, got {value!r}", reason="bad-spec")
    return value


@dataclass(frozen=True, slots=True)
class SandboxRef:
    """Where a sandbox lives; JSON-serializable so the run store can keep it (jsonb)."""

    provider: str
    id: str
    root: str
    spec: SandboxSpec = field(default_factory=SandboxSpec)
    host: Mapping[str, str | int] | None = None

    @property
    def workspace(self) -> str:
        return f"{self.root}/workspace"

    @property
    def journal_dir(self) -> str:
        return f"{self.root}/journal"

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "id": self.id,
            "root": self.root,
            "spec": self.spec.to_dict(),
            "host": dict(self.host) if self.host is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxRef:
        try:
            provider, sandbox_id, root = data["provider"], data["id"], data["root"]
        except (KeyError, TypeError) as exc:
            raise SandboxError("not a sandbox reference", reason="bad-ref") from exc
        if not all(isinstance(v, str) and v for v in (provider, sandbox_id, root)):
            raise SandboxError("not a sandbox reference", reason="bad-ref")
        host = data.get("host")
        return cls(
            provider=provider,
            id=sandbox_id,
            root=root,
            spec=SandboxSpec.from_dict(data.get("spec") or {}),
            host=dict(host) if host is not None else None,
        )


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


@runtime_checkable
class SandboxProcess(Protocol):
    """A spawned command whose stdout the caller reads; ``kill`` ends its whole group."""

    @property
    def stdout(self) -> IO[bytes]: ...

    def kill(self) -> None: ...

    def poll(self) -> int | None: ...


@runtime_checkable
class Sandbox(Protocol):
    @property
    def ref(self) -> SandboxRef: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def exec(
        self, argv: Sequence[str], *, timeout: float | None = 60.0, stdin: bytes | None = None
    ) -> ExecResult:
        """Run to completion; stdout and stderr captured as bytes."""
        ...

    def spawn(self, argv: Sequence[str]) -> SandboxProcess:
        """Start with stdout piped to the caller; stderr discarded."""
        ...

    def start_detached(self, argv: Sequence[str]) -> None:
        """Start in its own session, unconnected to the caller, so it outlives the caller."""
        ...

    def launch(self, paths: JournalPaths, command: AgentCommand | str) -> AgentLaunch:
        """Shell code the journal writer runs as the agent: the agent in its sandbox, its
        environment read from ``ENV_FD``, its prompt from ``paths.prompt_file``."""
        ...

    def limit_events(self) -> dict[str, int]:
        """How often the sandbox hit a limit: ``oom_kill`` (memory), ``max`` (pids)."""
        ...


@runtime_checkable
class SandboxProvider(Protocol):
    @property
    def name(self) -> str: ...

    def create(self, run_id: str, spec: SandboxSpec) -> SandboxRef: ...

    def resume(self, ref: SandboxRef) -> Sandbox | None:
        """The sandbox behind ``ref``, or None when it is gone."""
        ...

    def destroy(self, ref: SandboxRef) -> None:
        """Kill its processes and remove it; idempotent."""
        ...

    def stop(self, ref: SandboxRef) -> None:
        """Kill its processes and keep its files (a session's workspace, whose run was
        cancelled); idempotent."""
        ...

    def sweep(self) -> int:
        """Remove what destroyed sandboxes left behind on this host (cgroups, uid claims)."""
        ...


def base_environment(home: str) -> dict[str, str]:
    """The whole environment of journal helpers, and the base of every agent's."""
    return {"PATH": BASE_PATH, "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb"}
