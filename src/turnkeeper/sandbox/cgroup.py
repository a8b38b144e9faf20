"""A cgroup per sandbox: memory, pid and CPU limits, what was hit, and killing every process.

Both hierarchies are supported. On cgroup v2 sandboxes live under ``turnkeeper`` at the
top of the hierarchy this process sees (v2 allows no processes in a group that hands
controllers down, so they cannot nest under a worker's own group); on v1 (and the
hybrid layout, whose v2 mount holds no controllers) under ``turnkeeper`` inside this
process's own group of each controller. A group's name carries a tag of the sandboxes
root, so one fleet's reaper only ever sweeps its own leftovers.

Only the agent's processes join the group: the journal writer stays outside, so an
agent past its memory limit is killed alone and its writer still appends the sentinel.
The shell code that joins a group is built here (``attach_script``) because the writer,
a shell on the sandbox's host, is the one that starts the agent.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from turnkeeper.errors import SandboxError

log = structlog.get_logger(__name__)

PARENT = "turnkeeper"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
_MOUNTINFO = Path("/proc/self/mountinfo")
_OWN_GROUPS = Path("/proc/self/cgroup")
_KILL_ROUNDS = 200


@dataclass(frozen=True, slots=True)
class Limits:
    """What one sandbox may use: bytes of memory, CPUs (a fraction is fine), tasks."""

    memory_bytes: int
    cpus: float
    pids: int


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One sandbox's group: a directory per controller on v1, a single one on v2."""

    version: int
    paths: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "paths": list(self.paths)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Cgroup:
        paths = data.get("paths")
        version = data.get("version")
        if version not in (1, 2) or not isinstance(paths, list) or not paths:
            raise SandboxError("not a cgroup record", reason="bad-cgroup")
        return cls(int(str(version)), tuple(str(p) for p in paths))

    def attach_script(self) -> str:
        """Shell code that moves the shell running it into this group (then it execs)."""
        return " && ".join(f"echo 0 > {shlex.quote(p + '/cgroup.procs')}" for p in self.paths)

    def members_file(self) -> str:
        """The file that lists the pid of each process in the group, one per line."""
        return self.paths[0] + "/cgroup.procs"

    def kill_script(self) -> str:
        """Shell code that kills whatever is left in the group, until it is empty."""
        procs = shlex.quote(self.members_file())
        return (
            f"for _ in 1 2 3 4 5 6 7 8 9 10; do pids=$(cat {procs} 2>/dev/null); "
            '[ -n "$pids" ] || break; kill -KILL $pids 2>/dev/null; sleep 0.05; done'
        )

    def pids(self) -> list[int]:
        try:
            text = Path(self.members_file()).read_text(encoding="ascii")
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def events(self) -> dict[str, int]:
        """How often each limit was hit: ``oom_kill`` (memory) and ``max`` (pids)."""
        counts = {"oom_kill": 0, "max": 0}
        memory_file = "memory.events" if self.version == 2 else "memory.oom_control"
        for path in self.paths:
            for name in (memory_file, "pids.events"):
                counts.update(_counters(Path(path, name), set(counts)))
        return counts

    def kill(self) -> None:
        """SIGKILL every process in the group, including ones that left their session."""
        kill_file = Path(self.paths[0], "cgroup.kill")
        if self.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1", encoding="ascii")
        for _ in range(_KILL_ROUNDS):  # forks racing the kill are caught by the next round
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        raise SandboxError("processes of the sandbox survived the kill", reason="kill-failed")

    def remove(self) -> None:
        """Kill what is left and remove the group; idempotent."""
        self.kill()
        for path in self.paths:
            for _ in range(_KILL_ROUNDS):  # a killed task leaves the group a moment later
                try:
                    Path(path).rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise SandboxError(
                            f"cannot remove cgroup {path}: {exc}", reason="cgroup-failed"
                        ) from exc
                    time.sleep(0.01)


def _counters(path: Path, wanted: set[str]) -> dict[str, int]:
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        key, _, value = line.partition(" ")
        if key in wanted and value.strip().isdigit():
            found[key] = int(value)
    return found


@dataclass(frozen=True, slots=True)
class CgroupTree:
    """Where this host's sandbox groups are created, and how to limit them."""

    version: int
    parents: tuple[Path, ...]
    """The ``turnkeeper`` parent group: one per controller on v1, one on v2."""

    @classmethod
    def detect(cls) -> CgroupTree:
        """This host's tree; raises SandboxError (reason ``cgroup-unusable``) saying why not."""
        v2, v1 = _mounts()
        if v2 is not None and set(CONTROLLERS) <= _controllers(v2):
            parent = v2 / PARENT
            tree = cls(2, (parent,))
            tree._prepare_v2(v2)
            tree._probe()
            return tree
        missing = [c for c in CONTROLLERS if c not in v1]
        if missing:
            raise SandboxError(
                f"no usable cgroup hierarchy (v1 lacks {', '.join(missing)}; "
                "v2 lacks memory, pids or cpu)",
                reason="cgroup-unusable",
            )
        own = _own_v1_groups()
        parents = tuple(v1[c] / own.get(c, "/").lstrip("/") / PARENT for c in CONTROLLERS)
        tree = cls(1, parents)
        for parent in parents:
            _mkdir(parent)
        tree._probe()
        return tree

    def _probe(self) -> None:
        """Make and remove a group: parents that exist prove nothing for another user."""
        name = f"probe-{os.getpid()}-{secrets.token_hex(4)}"
        for parent in self.parents:
            try:
                (parent / name).mkdir()
                (parent / name).rmdir()
            except OSError as exc:
                raise SandboxError(
                    f"cannot create groups under {parent}: {exc.strerror}",
                    reason="cgroup-unusable",
                ) from exc

    def _prepare_v2(self, mount: Path) -> None:
        wanted = " ".join(f"+{c}" for c in CONTROLLERS)
        try:
            (mount / "cgroup.subtree_control").write_text(wanted, encoding="ascii")
            _mkdir(self.parents[0])
            (self.parents[0] / "cgroup.subtree_control").write_text(wanted, encoding="ascii")
        except OSError as exc:
            raise SandboxError(
                f"cannot delegate memory, pids and cpu to {self.parents[0]}: {exc}",
                reason="cgroup-unusable",
            ) from exc

    @staticmethod
    def tag(root: Path) -> str:
        """Names the sandboxes root a group belongs to (groups are named ``<tag>-<id>``)."""
        return hashlib.sha256(str(root).encode()).hexdigest()[:8]

    def group(self, root: Path, sandbox_id: str) -> Cgroup:
        """The group of ``root``'s sandbox ``sandbox_id``, by its name alone: found again
        when the sandbox's directory, and the state that records it, is gone."""
        name = f"{self.tag(root)}-{sandbox_id}"
        return Cgroup(self.version, tuple(str(p / name) for p in self.parents))

    def create(self, root: Path, sandbox_id: str, limits: Limits) -> Cgroup:
        group = self.group(root, sandbox_id)
        try:
            for path in group.paths:
                Path(path).mkdir(mode=0o755, exist_ok=True)
            self._limit(group, limits)
        except OSError as exc:
            with contextlib.suppress(SandboxError):
                group.remove()
            raise SandboxError(
                f"cannot create the sandbox's cgroup: {exc}",
                reason="cgroup-failed",
                sandbox=sandbox_id,
            ) from exc
        return group

    def _limit(self, group: Cgroup, limits: Limits) -> None:
        quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
        if self.version == 2:
            (path,) = (Path(p) for p in group.paths)
            _write(path / "memory.max", limits.memory_bytes)
            _write_optional(path / "memory.swap.max", 0)
            _write_optional(path / "memory.oom.group", 1)  # an OOM ends the whole agent
            _write(path / "pids.max", limits.pids)
            (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}", encoding="ascii")
            return
        memory, pids, cpu = (Path(p) for p in group.paths)
        _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
        _write_optional(memory / "memory.memsw.limit_in_bytes", limits.memory_bytes)
        _write(pids / "pids.max", limits.pids)
        _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
        _write(cpu / "cpu.cfs_quota_us", quota)

    def leftovers(self, root: Path) -> list[tuple[str, Cgroup]]:
        """Groups of ``root``'s sandboxes, by sandbox id (the caller decides which are dead)."""
        prefix = f"{self.tag(root)}-"
        found = []
        try:
            names = sorted(e.name for e in self.parents[0].iterdir() if e.is_dir())
        except OSError:
            return []
        for name in names:
            if name.startswith(prefix):
                paths = tuple(str(p / name) for p in self.parents)
                found.append((name[len(prefix) :], Cgroup(self.version, paths)))
        return found


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise SandboxError(f"cannot create cgroup {path}: {exc}", reason="cgroup-unusable") from exc


def _write(path: Path, value: int) -> None:
    path.write_text(str(value), encoding="ascii")


def _write_optional(path: Path, value: int) -> None:
    """Files a kernel may not have (no swap accounting, an older kernel)."""
    if path.exists():
        with contextlib.suppress(OSError):
            _write(path, value)


def _mounts() -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount (if any) and each v1 controller's mount, from mountinfo."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    try:
        lines = _MOUNTINFO.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, {}
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_point, fs_type, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fs_type == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fs_type == "cgroup":
            for controller in CONTROLLERS:
                if controller in options:
                    v1.setdefault(controller, mount_point)
    return v2, v1


def _controllers(mount: Path) -> set[str]:
    try:
        return set((mount / "cgroup.controllers").read_text(encoding="ascii").split())
    except OSError:
        return set()


def _own_v1_groups() -> dict[str, str]:
    """This process's group in each v1 controller (``4:memory:/some/path``)."""
    groups: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in _OWN_GROUPS.read_text(encoding="utf-8").splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                groups[controller] = path
    return groups
