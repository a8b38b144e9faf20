"""The ``local`` provider: a directory per sandbox, agents as host processes. No boundary.

Each sandbox is ``<root>/<id>/{workspace,journal}``. Journal helpers run with the base
environment only, the workspace as their directory; spawned commands lead their own
process group (so ``kill`` ends the whole tree) and detached ones lead their own
session (so a dying worker takes nothing with it). Detached process groups are
recorded in ``<root>/<id>/procs`` so ``destroy`` can end them.

What ``local`` does promise is cleanup and limits. With a cgroup (a root worker, or a
delegated hierarchy) the agent runs in a group of its own: limited, and ended whole
when its main process exits or the sandbox is destroyed, ``setsid`` daemons included.
Without one, memory and processes are capped by rlimits (``RLIMIT_DATA`` and the
per-user ``RLIMIT_NPROC``; CPU is not limited) and a daemon that left the agent's
process group survives ``destroy``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import psutil
import structlog

from turnkeeper.errors import SandboxError
from turnkeeper.sandbox.cgroup import Cgroup, CgroupTree, Limits
from turnkeeper.sandbox.command import AgentCommand, AgentLaunch, agent_script
from turnkeeper.sandbox.journal import LAUNCH_FAILED_EXIT, JournalPaths
from turnkeeper.sandbox.provider import (
    Capabilities,
    ExecResult,
    SandboxRef,
    SandboxSpec,
    base_environment,
)

log = structlog.get_logger(__name__)

PROCS_FILE = "procs"
STATE_FILE = "sandbox.json"
_KILL_ROUNDS = 200


@dataclass(frozen=True, slots=True)
class SandboxState:
    """What a sandbox's host keeps about it beside its directories (``sandbox.json``)."""

    uid: int | None = None
    cgroup: Cgroup | None = None

    def write(self, root: Path) -> None:
        data: dict[str, Any] = {"uid": self.uid}
        data["cgroup"] = self.cgroup.to_dict() if self.cgroup else None
        (root / STATE_FILE).write_text(json.dumps(data), encoding="utf-8")

    @classmethod
    def read(cls, root: Path) -> SandboxState:
        try:
            data = json.loads((root / STATE_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise SandboxError(f"unreadable sandbox state: {exc}", reason="bad-state") from exc
        uid = data.get("uid")
        cgroup = data.get("cgroup")
        return cls(
            uid=uid if isinstance(uid, int) else None,
            cgroup=Cgroup.from_dict(cgroup) if isinstance(cgroup, dict) else None,
        )


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
    """The host side of a sandbox: helpers and the writer run here as plain processes."""

    provider_capabilities = Capabilities(
        background_processes=True,
        killable_processes=True,
        durable_filesystem=True,
        network_isolation=False,
        resource_limits=True,
    )

    def __init__(self, ref: SandboxRef, state: SandboxState, rlimits: Limits | None = None) -> None:
        self._ref = ref
        self.state = state
        self.rlimits = rlimits
        self._env = base_environment(ref.workspace)

    @property
    def ref(self) -> SandboxRef:
        return self._ref

    @property
    def capabilities(self) -> Capabilities:
        return self.provider_capabilities

    @property
    def helper_cwd(self) -> str:
        return self._ref.workspace

    def launch(self, paths: JournalPaths, command: AgentCommand | str) -> AgentLaunch:
        script = agent_script(command, paths.prompt_file, self.agent_rlimits)
        code = f"exec /bin/sh -c {shlex.quote(script)} sh"
        if self.state.cgroup is None:
            return AgentLaunch(f"( {code} )")
        attach = self.state.cgroup.attach_script()
        kill = self.state.cgroup.kill_script()  # its members are the agent's alone
        return AgentLaunch(
            f"( {attach} || exit {LAUNCH_FAILED_EXIT}; {code} )",
            after_exit=kill,
            stop=kill,
            members=self.state.cgroup.members_file(),
        )

    @property
    def agent_rlimits(self) -> tuple[int, int] | None:
        """Memory bytes and processes as rlimits, when no cgroup limits the agent."""
        if self.state.cgroup is not None or self.rlimits is None:
            return None
        return self.rlimits.memory_bytes, self.rlimits.pids

    def limit_events(self) -> dict[str, int]:
        return {} if self.state.cgroup is None else self.state.cgroup.events()

    def exec(
        self, argv: Sequence[str], *, timeout: float | None = 60.0, stdin: bytes | None = None
    ) -> ExecResult:
        try:
            done = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                timeout=timeout,
                env=self._env,
                cwd=self.helper_cwd,
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
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=self._env,
                cwd=self.helper_cwd,
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
                [*launcher, *argv],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=self._env,
                cwd=self.helper_cwd,
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
    """Sandboxes as directories under ``root`` (``Settings.sandboxes_dir``).

    ``cgroups`` places each sandbox in a group limited to ``limits``; without a tree,
    ``limits`` become rlimits of the agent.
    """

    name = "local"
    sandbox_class: type[ProcessSandbox] = LocalSandbox

    def __init__(
        self, root: Path, *, limits: Limits | None = None, cgroups: CgroupTree | None = None
    ) -> None:
        self.root = root.resolve()
        self.limits = limits
        self.cgroups = cgroups if limits is not None else None

    def create(self, run_id: str, spec: SandboxSpec) -> SandboxRef:
        sandbox_id = uuid.uuid4().hex
        root = self.root / sandbox_id
        try:
            (root / "workspace").mkdir(parents=True, mode=0o700)
            (root / "journal").mkdir(mode=0o700)
            self._prepare(root, sandbox_id)
        except (OSError, SandboxError) as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise SandboxError(
                f"cannot create sandbox: {exc}", run_id=run_id, reason="create-failed"
            ) from exc
        log.info("sandbox.created", provider=self.name, sandbox=sandbox_id, run_id=run_id)
        return SandboxRef(provider=self.name, id=sandbox_id, root=str(root), spec=spec)

    def _prepare(self, root: Path, sandbox_id: str) -> None:
        """What a sandbox needs beyond its directories: here, its cgroup."""
        cgroup = None
        if self.cgroups is not None and self.limits is not None:
            cgroup = self.cgroups.create(self.root, sandbox_id, self.limits)
        SandboxState(cgroup=cgroup).write(root)

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
        return self.sandbox_class(ref, SandboxState.read(root), self.limits)

    def destroy(self, ref: SandboxRef) -> None:
        root = self._owned_root(ref)
        state = self._end_processes(root, ref.id)
        if state.cgroup is not None:
            state.cgroup.remove()
        self._release(root, state)
        try:
            shutil.rmtree(root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SandboxError(
                f"cannot remove sandbox: {exc}", reason="destroy-failed", sandbox=ref.id
            ) from exc
        log.info("sandbox.destroyed", provider=self.name, sandbox=ref.id)

    def stop(self, ref: SandboxRef) -> None:
        root = self._owned_root(ref)
        self._end_processes(root, ref.id)
        with contextlib.suppress(FileNotFoundError):
            (root / PROCS_FILE).unlink()
        log.info("sandbox.stopped", provider=self.name, sandbox=ref.id)

    def _end_processes(self, root: Path, sandbox_id: str) -> SandboxState:
        """Kill every process of the sandbox, and raise ``SandboxError`` (``kill-failed``)
        unless none is left; its state, as far as it can still be read.

        This works without the sandbox's directory too (removed by an operator while its
        agent ran on): removing a directory kills nothing, and a run that continues in a
        new sandbox must not start its agent beside the old one. The handles that
        survive the directory are the sandbox's cgroup, found by its name
        (``CgroupTree.group``), and the working directories of its writer and helpers,
        which are the sandbox's (deleted or not) for as long as they live."""
        state = _kill_recorded(root)
        if state.cgroup is None and self.cgroups is not None:
            state = replace(state, cgroup=self.cgroups.group(self.root, sandbox_id))
        for _ in range(_KILL_ROUNDS):
            working = _working_in(root)
            if not working:
                break
            for pid in working:
                _kill_group_or_process(pid)
            time.sleep(0.01)
        else:
            raise SandboxError(
                "processes working in the sandbox survived the kill",
                reason="kill-failed",
                sandbox=sandbox_id,
            )
        if state.cgroup is not None:
            state.cgroup.kill()
        return state

    def _release(self, root: Path, state: SandboxState) -> None:
        """Give back what the sandbox held beyond its directory (a uid, for bwrap)."""

    def sweep(self) -> int:
        """Remove the cgroups of this root's sandboxes whose directory is gone."""
        if self.cgroups is None:
            return 0
        removed = 0
        for sandbox_id, cgroup in self.cgroups.leftovers(self.root):
            if (self.root / sandbox_id).exists():
                continue
            try:
                cgroup.remove()
                removed += 1
            except SandboxError as exc:
                log.warning("sandbox.cgroup_sweep_failed", sandbox=sandbox_id, error=str(exc))
        return removed


def _working_in(root: Path) -> list[int]:
    """The processes whose working directory is ``root`` or below it, also once it was
    removed (psutil reads ``<path> (deleted)`` as the path)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if Path(proc.cwd()).is_relative_to(root):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue  # gone, a zombie (no cwd), or a kernel thread
    return found


def _kill_group_or_process(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a writer: its agent is in it), else
    the process alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def _kill_recorded(root: Path) -> SandboxState:
    """Kill the process groups the sandbox at ``root`` recorded; its state, as far as it
    can still be read (a sandbox half made has none)."""
    kill_recorded_groups(root)
    try:
        return SandboxState.read(root)
    except SandboxError:
        return SandboxState()
