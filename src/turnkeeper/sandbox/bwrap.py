"""The ``bwrap`` provider: the local layout, the agent alone in a bubblewrap jail.

Journal helpers and the writer run on the host, outside the jail, with the base
environment only; the journal directory is never bound into the jail. The writer
starts the jail (``jail.jail_argv``) as its child, so ``--die-with-parent`` ties the
jail to the writer (which outlives the worker), and the jail's pid namespace ends
every process the agent started the moment its main process exits, before the
sentinel is written. A root worker gives every sandbox a uid of its own from
``TURNKEEPER_SANDBOX_UIDS`` and its workspace to that uid.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from turnkeeper.errors import SandboxError
from turnkeeper.sandbox.cgroup import CgroupTree, Limits
from turnkeeper.sandbox.command import AgentCommand, AgentLaunch
from turnkeeper.sandbox.jail import (
    GROUP_FILE,
    PASSWD_FILE,
    SECCOMP_FILE,
    Egress,
    identity_files,
    jailed_launch,
)
from turnkeeper.sandbox.journal import LAUNCH_FAILED_EXIT, JournalPaths
from turnkeeper.sandbox.local import LocalProvider, ProcessSandbox, SandboxState
from turnkeeper.sandbox.provider import Capabilities, SandboxRef
from turnkeeper.sandbox.seccomp import jail_filter
from turnkeeper.sandbox.uids import UidPool

BWRAP = "bwrap"


def bwrap_binary() -> str | None:
    """The bubblewrap executable on PATH, or None (Debian package ``bubblewrap``)."""
    return shutil.which(BWRAP)


class BwrapSandbox(ProcessSandbox):
    provider_capabilities = Capabilities(
        background_processes=True,
        killable_processes=True,
        durable_filesystem=True,
        network_isolation=True,
        resource_limits=True,
    )

    def __init__(
        self,
        ref: SandboxRef,
        state: SandboxState,
        rlimits: Limits | None = None,
        *,
        ro_binds: Sequence[str] = (),
        egress: Callable[[], Egress] | None = None,
        jail_gid: int | None = None,
    ) -> None:
        super().__init__(ref, state, rlimits)
        self.ro_binds = tuple(ro_binds)
        self.egress = egress
        self.jail_gid = jail_gid

    @property
    def helper_cwd(self) -> str:
        return self.ref.root  # the workspace belongs to the agent's uid

    def launch(self, paths: JournalPaths, command: AgentCommand | str) -> AgentLaunch:
        attach = members = ""
        if self.state.cgroup is not None:
            attach = f"{self.state.cgroup.attach_script()} || exit {LAUNCH_FAILED_EXIT}; "
            members = self.state.cgroup.members_file()
        seccomp = self.state.uid is not None  # a root worker's jail: no user namespace
        if seccomp:
            write_filter(Path(self.ref.root))
        return jailed_launch(
            self.ref.root,
            self.ref.workspace,
            paths,
            command,
            ro_binds=self.ro_binds,
            rlimits=self.agent_rlimits,
            egress=self.egress() if self.egress is not None else None,
            uid=self.state.uid,
            gid=self.jail_gid,
            tmp_bytes=None if self.rlimits is None else self.rlimits.memory_bytes,
            seccomp=seccomp,
            prelude=attach,
            members=members,
        )


def write_filter(root: Path) -> None:
    """The sandbox's seccomp filter (``seccomp.py``), where the writer opens it for bwrap."""
    path = root / SECCOMP_FILE
    program = jail_filter()
    # A sandbox made by an older worker has none yet, or one that refuses less.
    if not path.exists() or path.read_bytes() != program:
        staged = path.with_name(f"{SECCOMP_FILE}.new")
        staged.write_bytes(program)
        staged.replace(path)


class BwrapProvider(LocalProvider):
    """``ro_binds`` are the operator's extra read-only paths; ``uids`` the range a root
    worker hands out; ``egress`` gives the proxy binding for each new agent process."""

    name = "bwrap"
    sandbox_class = BwrapSandbox

    def __init__(
        self,
        root: Path,
        *,
        limits: Limits | None = None,
        cgroups: CgroupTree | None = None,
        ro_binds: Sequence[str] = (),
        uids: UidPool | None = None,
        egress: Callable[[], Egress] | None = None,
    ) -> None:
        if bwrap_binary() is None:
            raise SandboxError("bubblewrap (bwrap) is not installed", reason="bwrap-missing")
        super().__init__(root, limits=limits, cgroups=cgroups)
        self.ro_binds = tuple(ro_binds)
        self.uids = uids if os.geteuid() == 0 else None
        if os.geteuid() == 0 and self.uids is None:
            raise SandboxError(
                "a root worker needs a uid range for its agents", reason="no-uid-range"
            )
        if self.uids is not None:
            jail_filter()  # refuse here, once, on a machine it has no filter for
        self.egress = egress

    def _prepare(self, root: Path, sandbox_id: str) -> None:
        uid = os.getuid() if self.uids is None else self.uids.claim(root)
        try:
            self._prepare_for(root, sandbox_id, uid)
        except (OSError, SandboxError):
            if self.uids is not None:
                self.uids.release(uid, root)
            raise

    @property
    def jail_gid(self) -> int | None:
        return None if self.uids is None else self.uids.group

    def _prepare_for(self, root: Path, sandbox_id: str, uid: int) -> None:
        gid = os.getgid() if self.uids is None else self.uids.group
        passwd, group = identity_files(uid, gid)
        for name, text in ((PASSWD_FILE, passwd), (GROUP_FILE, group)):
            path = root / name
            path.write_text(text, encoding="utf-8")
            path.chmod(0o644)
        if self.uids is not None:
            os.chown(root / "workspace", uid, self.uids.group)
        cgroup = None
        if self.cgroups is not None and self.limits is not None:
            cgroup = self.cgroups.create(self.root, sandbox_id, self.limits)
        SandboxState(uid=uid if self.uids is not None else None, cgroup=cgroup).write(root)

    def resume(self, ref: SandboxRef) -> BwrapSandbox | None:
        root = self._owned_root(ref)
        if not (root / "workspace").is_dir() or not (root / "journal").is_dir():
            return None
        return BwrapSandbox(
            ref,
            SandboxState.read(root),
            self.limits,
            ro_binds=self.ro_binds,
            egress=self.egress,
            jail_gid=self.jail_gid,
        )

    def _release(self, root: Path, state: SandboxState) -> None:
        if self.uids is not None and state.uid is not None:
            self.uids.release(state.uid, root)

    def sweep(self) -> int:
        swept = super().sweep()
        if self.uids is not None:
            swept += self.uids.release_stale(self.root)
        return swept
