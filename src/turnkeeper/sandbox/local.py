"""The ``local`` provider: a directory per sandbox, agents in their own session.

Each sandbox is ``<root>/<id>/{workspace,journal}``. Every command runs with the
sandbox's minimal environment and the workspace as its directory; spawned commands
lead their own process group (so ``kill`` ends the whole tree) and detached ones lead
their own session (so a dying worker takes nothing with it). Detached process groups
are recorded in ``<root>/<id>/procs`` so ``destroy`` can end them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import psutil
import structlog

from turnkeeper.errors import SandboxError
from turnkeeper.sandbox.provider import (
    Capabilities,
    ExecResult,
    SandboxRef,
    SandboxSpec,
    agent_environment,
)

log = structlog.get_logger(__name__)

PROCS_FILE = "procs"


class LocalProcess:
    """A spawned process leading its own group; ``kill`` signals the group, then reaps."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def stdout(self) -> IO[bytes]:
        if self._popen.stdout is None:
            raise SandboxError("spawned process has no stdout", reason="spawn-failed")
        return self._popen.stdout

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)
        if self._popen.stdout is not None:
            self._popen.stdout.close()


class ProcessSandbox:
    """Commands run as host processes, optionally wrapped (bubblewrap wraps them)."""

    provider_capabilities = Capabilities(
        background_processes=True,
        killable_processes=True,
        durable_filesystem=True,
        network_isolation=False,
        resource_limits=True,
    )

    def __init__(self, ref: SandboxRef) -> None:
        self._ref = ref
        self._env = agent_environment(ref.workspace, ref.spec)

    @property
    def ref(self) -> SandboxRef:
        return self._ref

    @property
    def capabilities(self) -> Capabilities:
        return self.provider_capabilities

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The host argv that runs ``argv`` inside the sandbox."""
        return list(argv)

    def exec(
        self, argv: Sequence[str], *, timeout: float | None = 60.0, stdin: bytes | None = None
    ) -> ExecResult:
        try:
            done = subprocess.run(
                self.wrap(argv),
                input=stdin,
                capture_output=True,
                timeout=timeout,
                env=self._env,
                cwd=self._ref.workspace,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                start_new_session=True,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(
                f"exec failed in sandbox: {exc}", reason="exec-failed", sandbox=self._ref.id
            ) from exc
        return ExecResult(done.returncode, done.stdout, done.stderr)

    def spawn(self, argv: Sequence[str]) -> LocalProcess:
        try:
            popen = subprocess.Popen(
                self.wrap(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=self._env,
                cwd=self._ref.workspace,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(
                f"spawn failed in sandbox: {exc}", reason="spawn-failed", sandbox=self._ref.id
            ) from exc
        return LocalProcess(popen)

    def start_detached(self, argv: Sequence[str]) -> None:
        # A launcher shell starts the command in a new session and exits at once, so
        # the command is nobody's child here: no zombie, nothing tied to this process.
        launcher = ["/bin/sh", "-c", 'setsid "$@" </dev/null >/dev/null 2>&1 & echo $!', "sh"]
        try:
            done = subprocess.run(
                [*launcher, *self.wrap(argv)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=self._env,
                cwd=self._ref.workspace,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(
                f"start failed in sandbox: {exc}", reason="spawn-failed", sandbox=self._ref.id
            ) from exc
        pid = done.stdout.strip()
        if done.returncode != 0 or not pid.isdigit():
            raise SandboxError(
                "start failed in sandbox", reason="spawn-failed", sandbox=self._ref.id
            )
        with Path(self._ref.root, PROCS_FILE).open("a", encoding="ascii") as procs:
            procs.write(f"{int(pid)}\n")


class LocalSandbox(ProcessSandbox):
    pass


def kill_recorded_groups(root: Path) -> None:
    """End the detached process groups a sandbox recorded, if they still belong to it."""
    try:
        lines = (root / PROCS_FILE).read_text(encoding="ascii").split()
    except FileNotFoundError:
        return
    for line in lines:
        if not line.isdigit():
            continue
        pid = int(line)
        try:
            proc = psutil.Process(pid)
            owned = Path(proc.cwd()).is_relative_to(root) and os.getpgid(pid) == pid
        except (psutil.Error, OSError):
            continue
        if owned:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


class LocalProvider:
    """Sandboxes as directories under ``root`` (``Settings.sandboxes_dir``)."""

    name = "local"
    sandbox_class: type[ProcessSandbox] = LocalSandbox

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def create(self, run_id: str, spec: SandboxSpec) -> SandboxRef:
        sandbox_id = uuid.uuid4().hex
        root = self.root / sandbox_id
        try:
            (root / "workspace").mkdir(parents=True, mode=0o700)
            (root / "journal").mkdir(mode=0o700)
        except OSError as exc:
            raise SandboxError(
                f"cannot create sandbox: {exc}", run_id=run_id, reason="create-failed"
            ) from exc
        log.info("sandbox.created", provider=self.name, sandbox=sandbox_id, run_id=run_id)
        return SandboxRef(provider=self.name, id=sandbox_id, root=str(root), spec=spec)

    def _owned_root(self, ref: SandboxRef) -> Path:
        root = Path(ref.root)
        if ref.provider != self.name or root.parent != self.root or root.name != ref.id:
            raise SandboxError(
                "sandbox reference does not belong to this provider",
                reason="provider-mismatch",
                sandbox=ref.id,
            )
        return root

    def resume(self, ref: SandboxRef) -> ProcessSandbox | None:
        root = self._owned_root(ref)
        if not (root / "workspace").is_dir() or not (root / "journal").is_dir():
            return None
        return self.sandbox_class(ref)

    def destroy(self, ref: SandboxRef) -> None:
        root = self._owned_root(ref)
        kill_recorded_groups(root)
        try:
            shutil.rmtree(root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SandboxError(
                f"cannot remove sandbox: {exc}", reason="destroy-failed", sandbox=ref.id
            ) from exc
        log.info("sandbox.destroyed", provider=self.name, sandbox=ref.id)
