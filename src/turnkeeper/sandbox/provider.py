"""The sandbox provider protocol: what a driver, a reaper and a journal reader may ask of a sandbox.

A provider creates, resumes and destroys sandboxes by a JSON-serializable reference
(stored in Postgres), and a sandbox runs commands: ``exec`` (bounded, captured),
``spawn`` (streamed stdout, killable as a whole process group) and
``start_detached`` (fire and forget, outlives the caller). Every journal touch is a
command, so the same journal code serves a local directory, a bubblewrap jail, a host
reached over SSH and, later, a container (``docker exec``, ``docker exec -d``,
``docker rm -f``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol, runtime_checkable

from turnkeeper.errors import SandboxError

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
    """How a sandbox is built and what its agents get.

    ``env`` is the only part of any environment an agent sees beyond the minimal base
    (PATH, HOME, LANG, TERM): the worker's own environment never reaches it. Its
    values stay in the worker's memory: ``to_dict`` (what the run store keeps) has
    only their names, and the driver gives a resumed sandbox its env back from the
    run's sealed payload.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    network: bool = False
    cpu_seconds: int | None = None
    memory_bytes: int | None = None
    journal_max_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["env"] = dict.fromkeys(sorted(self.env), "")
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxSpec:
        env = data.get("env") or {}
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise SandboxError("sandbox spec env must map strings to strings", reason="bad-spec")
        return cls(
            env=dict(env),
            network=bool(data.get("network", False)),
            cpu_seconds=_optional_int(data.get("cpu_seconds")),
            memory_bytes=_optional_int(data.get("memory_bytes")),
            journal_max_bytes=_optional_int(data.get("journal_max_bytes")),
        )


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


def agent_environment(workspace: str, spec: SandboxSpec) -> dict[str, str]:
    """The whole environment of anything run in a sandbox: a minimal base plus the spec's."""
    env = {"PATH": BASE_PATH, "HOME": workspace, "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(spec.env)
    return env
