"""The ``ssh`` provider: sandboxes as directories on another host, reached with ``ssh``.

Journal and agent processes live on the remote host, so they survive the worker and
its connection. Commands go through the system ``ssh`` client (batch mode, one
multiplexed master connection per provider). Killing a spawned command must end the
remote process group, not just the local client: sshd starts every session command as
a session and group leader, the command prints that id first, and ``kill`` signals
the group remotely.

When the remote host has bubblewrap, each agent runs there in the jail the ``bwrap``
provider builds (``jail.jail_argv``, the same argv), as the remote user in a user
namespace; the writer stays outside it. The jail's only way out is an egress proxy
on the remote host for the worker's ``TURNKEEPER_SANDBOX_EGRESS``, started there on
first use by the target's ``python`` (``TURNKEEPER_SSH_PYTHON``), or else by the
worker's own interpreter path (the remote host then has turnkeeper installed where the
worker has it, as the ``scripted`` preset needs anyway); its files live in ``egress/``
beside the sandbox root. A remote host without bwrap runs agents
as plain processes. Either way, with ``limits``, an agent's memory and processes are
capped by rlimits (``RLIMIT_DATA``, ``RLIMIT_NPROC``, set by ``prlimit`` in the agent's
own shell), as ``local`` does without a cgroup; ``RLIMIT_NPROC`` counts every process
of the remote user, so it bounds a fork bomb rather than one sandbox.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

import structlog

from turnkeeper.errors import SandboxError, SandboxUnreachableError
from turnkeeper.sandbox.cgroup import Limits
from turnkeeper.sandbox.command import AgentCommand, AgentLaunch, agent_script
from turnkeeper.sandbox.egress import jail_bind_args, proxy_environment, with_forwarder
from turnkeeper.sandbox.jail import (
    GROUP_FILE,
    PASSWD_FILE,
    Egress,
    identity_files,
    jailed_launch,
)
from turnkeeper.sandbox.journal import JournalPaths
from turnkeeper.sandbox.provider import (
    Capabilities,
    ExecResult,
    SandboxRef,
    SandboxSpec,
    base_environment,
)

log = structlog.get_logger(__name__)

SSH_CONNECTION_FAILED = 255
"""ssh's own exit status when the connection failed; a remote 255 is made 254 (``_remote``)."""
REMOTE_255_AS = 254
# Run remotely by the worker's interpreter path: the socket of the remote host's egress
# proxy for an allowlist, started there if it is not running (egress.ensure_proxy).
_ENSURE_PROXY = """
import sys
from turnkeeper.config import load_settings
from turnkeeper.sandbox.egress import ensure_proxy
print(ensure_proxy(load_settings(data_dir=sys.argv[1], sandbox_egress=sys.argv[2])))
"""
_REMOTE_PATH = "/usr/local/bin:/usr/bin:/bin"
KILL_FAILED_EXIT = 3
"""The kill script's status when processes working in the sandbox survived it."""
_KILL_ROUNDS = 100


@dataclass(frozen=True, slots=True)
class RemoteJail:
    """The remote host's bubblewrap jail: who agents run as there, and what the worker's
    settings add to it (extra read-only binds, the egress allowlist)."""

    uid: int
    gid: int
    ro_binds: tuple[str, ...] = ()
    egress: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SshTarget:
    """The remote host and how to reach it; ``root`` holds the sandboxes there."""

    host: str
    root: str
    port: int = 22
    user: str = "turnkeeper"
    identity_file: Path | None = None
    known_hosts_file: Path | None = None
    strict_host_key_checking: bool = True
    control_dir: Path | None = None
    """Where the multiplexing socket lives; a fresh temporary directory by default."""
    python: str | None = None
    """The remote host's Python with turnkeeper (its egress proxy); the worker's path if None."""

    def as_host(self) -> dict[str, str | int]:
        return {"host": self.host, "port": self.port, "user": self.user}


class SshConnection:
    """The ``ssh`` argv for a target, with a lazily started multiplexing master."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self._control_dir = str(target.control_dir or tempfile.mkdtemp(prefix="tk-ssh-"))
        self._control_path = f"{self._control_dir}/m"
        self._master_started = False

    def options(self) -> list[str]:
        t = self.target
        opts = [
            "-p", str(t.port),
            "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=20",
            "-o", "ServerAliveInterval=15",
            "-o", f"ControlPath={self._control_path}",
            "-o", f"StrictHostKeyChecking={'yes' if t.strict_host_key_checking else 'no'}",
        ]  # fmt: skip
        if t.identity_file is not None:
            opts += ["-i", str(t.identity_file), "-o", "IdentitiesOnly=yes"]
        if t.known_hosts_file is not None:
            opts += ["-o", f"UserKnownHostsFile={t.known_hosts_file}"]
        return opts

    def destination(self) -> str:
        return f"{self.target.user}@{self.target.host}"

    def argv(self, remote_command: str) -> list[str]:
        self._ensure_master()
        return [
            "ssh", *self.options(), "-o", "ControlMaster=no", "-T",
            self.destination(), remote_command,
        ]  # fmt: skip

    def _ensure_master(self) -> None:
        """Start the shared connection once; without it every command connects anew."""
        if self._master_started:
            return
        self._master_started = True
        argv = [
            "ssh", *self.options(), "-o", "ControlMaster=yes", "-o", "ControlPersist=300",
            "-f", "-N", self.destination(),
        ]  # fmt: skip
        # stdio to /dev/null: a backgrounded master must not hold a caller's pipes open.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
                check=False,
            )

    def close(self) -> None:
        if self._master_started or self.target.control_dir is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    ["ssh", *self.options(), "-O", "exit", self.destination()],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
        with contextlib.suppress(OSError):
            Path(self._control_dir).rmdir()

    def run(
        self, remote_command: str, *, timeout: float | None, stdin: bytes | None = None
    ) -> ExecResult:
        try:
            done = subprocess.run(
                self.argv(remote_command),
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            # A dropped link leaves ssh waiting on a dead connection: no answer is a
            # transport failure, not the command's answer.
            self._master_started = False
            raise SandboxUnreachableError(
                f"ssh got no answer in {timeout}s", reason="ssh-unreachable", host=self.target.host
            ) from exc
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"ssh failed: {exc}", reason="ssh-failed") from exc
        if done.returncode == SSH_CONNECTION_FAILED:
            self._master_started = False  # start a new master once the host answers again
            raise SandboxUnreachableError(
                "ssh connection failed: " + done.stderr.decode(errors="replace")[-500:],
                reason="ssh-unreachable",
                host=self.target.host,
            )
        return ExecResult(done.returncode, done.stdout, done.stderr)


def _env_command(env: Mapping[str, str], argv: Sequence[str]) -> str:
    """Shell code that runs argv with exactly ``env`` and nothing of sshd's environment."""
    return shlex.join(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv])


def _remote(workspace: str, env: Mapping[str, str], argv: Sequence[str]) -> str:
    """Shell code that runs argv in the workspace with exactly ``env``.

    Exit status 255 is ssh's own for a failed connection, so a command that exits 255
    itself is reported as 254: every 255 the caller sees is a transport failure, and
    every other status is the command's real answer.
    """
    return (
        f"cd {shlex.quote(workspace)} && {{ {_env_command(env, argv)}; }}; "
        f"s=$?; [ $s -eq {SSH_CONNECTION_FAILED} ] && s={REMOTE_255_AS}; exit $s"
    )


def _check_killed(result: ExecResult, ref: SandboxRef) -> None:
    if result.exit_code == KILL_FAILED_EXIT:
        raise SandboxError(
            "processes working in the remote sandbox survived the kill",
            reason="kill-failed",
            sandbox=ref.id,
        )


class SshProcess:
    """A remote command streamed back; ``kill`` ends its remote process group."""

    def __init__(self, popen: subprocess.Popen[bytes], connection: SshConnection) -> None:
        self._popen = popen
        self._connection = connection
        self._group: int | None = None
        if popen.stdout is None:
            raise SandboxError("spawned ssh has no stdout", reason="spawn-failed")
        fd = popen.stdout.fileno()
        first = bytearray()
        while not first.endswith(b"\n"):  # the remote group id, one short line
            byte = os.read(fd, 1)
            if not byte:
                break
            first += byte
        if first.strip().isdigit():
            self._group = int(first.strip())

    @property
    def stdout(self) -> IO[bytes]:
        if self._popen.stdout is None:
            raise SandboxError("spawned ssh has no stdout", reason="spawn-failed")
        return self._popen.stdout

    def poll(self) -> int | None:
        return self._popen.poll()

    def kill(self) -> None:
        if self._group is not None:
            with contextlib.suppress(SandboxError):
                self._connection.run(f"kill -s KILL -- -{self._group} 2>/dev/null", timeout=30)
            self._group = None
        self._popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)
        if self._popen.stdout is not None:
            self._popen.stdout.close()


class SshSandbox:
    def __init__(
        self,
        ref: SandboxRef,
        connection: SshConnection,
        jail: RemoteJail | None = None,
        limits: Limits | None = None,
    ) -> None:
        self._ref = ref
        self._connection = connection
        self._env = base_environment(ref.workspace)
        self._jail = jail
        self._limits = limits

    @property
    def ref(self) -> SandboxRef:
        return self._ref

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            background_processes=True,
            killable_processes=True,
            durable_filesystem=True,
            network_isolation=self._jail is not None,
            resource_limits=self._limits is not None,
        )

    def launch(self, paths: JournalPaths, command: AgentCommand | str) -> AgentLaunch:
        """The agent in the remote host's jail, or as a plain process where it has no
        bwrap; under rlimits when the provider has limits."""
        limits = self._limits
        rlimits = None if limits is None else (limits.memory_bytes, limits.pids)
        if self._jail is None:
            script = agent_script(command, paths.prompt_file, rlimits)
            return AgentLaunch(f"( exec /bin/sh -c {shlex.quote(script)} sh )")
        return jailed_launch(
            self._ref.root,
            self._ref.workspace,
            paths,
            command,
            ro_binds=self._jail.ro_binds,
            rlimits=rlimits,
            egress=self._prepare_jail(self._jail),
            tmp_bytes=None if limits is None else limits.memory_bytes,
        )

    def _prepare_jail(self, jail: RemoteJail) -> Egress | None:
        """Writes the jail's passwd and group into the sandbox and, for a non-empty
        allowlist, makes sure the remote proxy runs; its binding for the jail."""
        passwd, group = identity_files(jail.uid, jail.gid)
        root = self._ref.root
        script = " && ".join(
            f"printf %s {shlex.quote(text)} > {shlex.quote(f'{root}/{name}')}"
            for name, text in ((PASSWD_FILE, passwd), (GROUP_FILE, group))
        )
        if jail.egress:
            data_dir = str(PurePosixPath(self._connection.target.root).parent)
            python = self._connection.target.python or sys.executable
            ensure = [python, "-P", "-c", _ENSURE_PROXY, data_dir, ",".join(jail.egress)]
            script += " && " + _env_command({"PATH": _REMOTE_PATH, "LC_ALL": "C.UTF-8"}, ensure)
        done = self._connection.run(f"umask 022 && {script}", timeout=120)
        if done.exit_code != 0:
            raise SandboxError(
                "cannot prepare the remote jail: " + done.stderr.decode(errors="replace")[-500:],
                reason="spawn-failed",
                sandbox=self._ref.id,
            )
        if not jail.egress:
            return None
        socket = Path(done.stdout.decode().strip().splitlines()[-1])
        return Egress(
            bind=tuple(jail_bind_args(socket)),
            launcher=tuple(with_forwarder([])),
            environment=proxy_environment(),
        )

    def limit_events(self) -> dict[str, int]:
        return {}

    def exec(
        self, argv: Sequence[str], *, timeout: float | None = 60.0, stdin: bytes | None = None
    ) -> ExecResult:
        return self._connection.run(
            _remote(self._ref.workspace, self._env, argv), timeout=timeout, stdin=stdin
        )

    def spawn(self, argv: Sequence[str]) -> SshProcess:
        remote = "echo $$; " + _remote(self._ref.workspace, self._env, argv)
        try:
            popen = subprocess.Popen(
                self._connection.argv(remote),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(f"ssh spawn failed: {exc}", reason="spawn-failed") from exc
        return SshProcess(popen, self._connection)

    def start_detached(self, argv: Sequence[str]) -> None:
        procs = shlex.quote(f"{self._ref.root}/procs")
        inner = "setsid " + _env_command(self._env, argv)
        script = (
            f"cd {shlex.quote(self._ref.workspace)} || exit 1; "
            f"{inner} </dev/null >/dev/null 2>&1 & echo $! >> {procs}"
        )
        result = self._connection.run(shlex.join(["/bin/sh", "-c", script]), timeout=60)
        if result.exit_code != 0:
            raise SandboxError(
                "cannot start the detached process", reason="spawn-failed", sandbox=self._ref.id
            )


class SshProvider:
    """``ro_binds`` and ``egress`` (the allowlist) apply to the remote host's jail."""

    name = "ssh"

    def __init__(
        self,
        target: SshTarget,
        *,
        ro_binds: Sequence[str] = (),
        egress: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> None:
        if not target.root.startswith("/"):
            raise SandboxError("ssh sandbox root must be absolute", reason="bad-config")
        self.target = target
        self.limits = limits
        self.connection = SshConnection(target)
        self.ro_binds = tuple(ro_binds)
        self.egress = tuple(egress)
        self._jail: RemoteJail | None = None
        self._probed = False

    def remote_jail(self) -> RemoteJail | None:
        """The remote host's jail, or None where it has no bwrap; asked once per provider."""
        if not self._probed:
            done = self.connection.run("id -u && id -g && command -v bwrap", timeout=60)
            words = done.stdout.decode(errors="replace").split()
            if done.exit_code == 0 and len(words) == 3 and words[0].isdigit():
                self._jail = RemoteJail(int(words[0]), int(words[1]), self.ro_binds, self.egress)
            elif not (len(words) == 2 and words[0].isdigit()):
                raise SandboxError(
                    "cannot ask the ssh host for its user and bwrap: "
                    + done.stderr.decode(errors="replace")[-300:],
                    reason="ssh-failed",
                    host=self.target.host,
                )
            self._probed = True
            log.info("sandbox.ssh_jail", host=self.target.host, jailed=self._jail is not None)
        return self._jail

    def close(self) -> None:
        self.connection.close()

    def create(self, run_id: str, spec: SandboxSpec) -> SandboxRef:
        sandbox_id = uuid.uuid4().hex
        root = f"{self.target.root.rstrip('/')}/{sandbox_id}"
        quoted = shlex.quote(root)
        result = self.connection.run(
            f"umask 077 && mkdir -p {quoted}/workspace {quoted}/journal", timeout=60
        )
        if result.exit_code != 0:
            raise SandboxError(
                "cannot create the remote sandbox", run_id=run_id, reason="create-failed"
            )
        log.info("sandbox.created", provider=self.name, sandbox=sandbox_id, run_id=run_id)
        return SandboxRef(self.name, sandbox_id, root, spec, self.target.as_host())

    def _check(self, ref: SandboxRef) -> str:
        expected = f"{self.target.root.rstrip('/')}/{ref.id}"
        if (
            ref.provider != self.name
            or ref.root != expected
            or dict(ref.host or {}) != self.target.as_host()
            or not ref.id.isalnum()
        ):
            raise SandboxError(
                "sandbox reference does not belong to this provider",
                reason="provider-mismatch",
                sandbox=ref.id,
            )
        return shlex.quote(ref.root)

    def resume(self, ref: SandboxRef) -> SshSandbox | None:
        root = self._check(ref)
        result = self.connection.run(
            f"test -d {root}/workspace && test -d {root}/journal", timeout=60
        )
        if result.exit_code != 0:
            return None
        return SshSandbox(ref, self.connection, self.remote_jail(), self.limits)

    def sweep(self) -> int:
        return 0

    def destroy(self, ref: SandboxRef) -> None:
        root = self._check(ref)
        # A directory its agent made unreadable or unwritable stops rm as that same user:
        # its owner opens it again (the agent is dead by then), or the disk stays full.
        remove = (
            f"rm -rf -- {root} 2>/dev/null || {{ chmod -R u+rwx -- {root}; rm -rf -- {root}; }}"
        )
        result = self.connection.run(f"{self._kill_script(ref)}; {remove}", timeout=60)
        _check_killed(result, ref)
        if result.exit_code != 0:
            raise SandboxError(
                "cannot remove the remote sandbox", reason="destroy-failed", sandbox=ref.id
            )
        log.info("sandbox.destroyed", provider=self.name, sandbox=ref.id)

    def stop(self, ref: SandboxRef) -> None:
        root = self._check(ref)
        result = self.connection.run(f"{self._kill_script(ref)}; rm -f -- {root}/procs", timeout=60)
        _check_killed(result, ref)
        if result.exit_code != 0:
            raise SandboxError(
                "cannot stop the remote sandbox", reason="stop-failed", sandbox=ref.id
            )
        log.info("sandbox.stopped", provider=self.name, sandbox=ref.id)

    def _kill_script(self, ref: SandboxRef) -> str:
        """Shell code that kills the writers' groups (the jail's pid namespace dies with
        its bwrap), then every process still working in the workspace: sshd does not end
        a session's command when its client goes away, so a dead worker leaves its
        ``tail -F`` behind. A workspace removed under its processes (an operator's
        ``rm -rf``) takes the ``procs`` file with it and kills nothing: its processes are
        then found by the working directory the kernel names ``<path> (deleted)``. It
        kills until none is left, and exits ``KILL_FAILED_EXIT`` when some survive."""
        root = self._check(ref)
        workspace = shlex.quote(ref.workspace)
        in_workspace = re.sub(r"([*?\[\\])", r"\\\1", ref.workspace)
        working = (
            f"find /proc -mindepth 2 -maxdepth 2 -name cwd "
            f"\\( -lname {shlex.quote(in_workspace)} "
            f"-o -lname {shlex.quote(in_workspace + ' (deleted)')} \\) 2>/dev/null"
        )
        return (
            f"if [ -f {root}/procs ]; then for pid in $(cat {root}/procs); do "
            f'[ "$(readlink /proc/$pid/cwd)" = {workspace} ] && kill -s KILL -- -$pid; '
            f"done; fi 2>/dev/null; "
            f"round=0; while :; do left=; for cwd in $({working}); do "
            f"pid=${{cwd#/proc/}}; kill -s KILL ${{pid%/cwd}} 2>/dev/null && left=1; done; "
            f'[ -z "$left" ] && break; round=$((round + 1)); '
            f"[ $round -lt {_KILL_ROUNDS} ] || exit {KILL_FAILED_EXIT}; sleep 0.05; done"
        )
