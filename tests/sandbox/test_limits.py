"""What local, bwrap and ssh promise about resources: limits, an agent killed alone, cleanup.

Each sandbox runs in a cgroup of its own (this machine: v1 memory, pids and cpu); an
agent past its memory limit is OOM-killed alone, its writer still appends the sentinel,
and the sandbox counts the kill. When the agent's main process exits, nothing it started
survives (the jail's pid namespace, or the cgroup for local), and ``destroy`` ends every
process of the sandbox, ``setsid`` daemons included, and removes its cgroup and uid.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.sandbox.conftest import TEST_UIDS
from tests.unavailable import require_bwrap, skip_or_fail
from turnkeeper.errors import SandboxError
from turnkeeper.sandbox import JournalReader, Sandbox, SandboxRef, SandboxSpec, spawn_journaled
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.cgroup import CPU_PERIOD_US, CgroupTree, Limits
from turnkeeper.sandbox.local import LocalProvider, SandboxState
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool

MIB = 1024 * 1024
LIMITS = Limits(memory_bytes=96 * MIB, cpus=0.5, pids=48)


def _tree() -> CgroupTree:
    try:
        return CgroupTree.detect()
    except SandboxError as exc:
        skip_or_fail(f"no usable cgroup here: {exc.message}")


@pytest.fixture(params=["local", "bwrap"])
def limited(request: pytest.FixtureRequest, tmp_path: Path) -> LocalProvider:
    root = tmp_path / "sandboxes"
    if request.param == "local":
        return LocalProvider(root, limits=LIMITS, cgroups=_tree())
    require_bwrap()
    return BwrapProvider(root, limits=LIMITS, cgroups=_tree(), uids=UidPool(*TEST_UIDS))


@pytest.fixture
def box(limited: LocalProvider) -> Iterator[tuple[LocalProvider, SandboxRef, Sandbox]]:
    ref = limited.create("limits", SandboxSpec())
    sandbox = limited.resume(ref)
    assert sandbox is not None
    yield limited, ref, sandbox
    limited.destroy(ref)


def _run(sandbox: Sandbox, command: str) -> tuple[list[bytes], int | None]:
    handle = spawn_journaled(sandbox, "limits", command)
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
    return [line for line, _ in reader], reader.exit_code


def _group_pids(ref: SandboxRef) -> list[int]:
    cgroup = SandboxState.read(Path(ref.root)).cgroup
    assert cgroup is not None
    return cgroup.pids()


def test_the_cgroup_carries_the_limits(box: tuple[LocalProvider, SandboxRef, Sandbox]) -> None:
    _, ref, _ = box
    cgroup = SandboxState.read(Path(ref.root)).cgroup
    assert cgroup is not None
    values = {}
    for path in map(Path, cgroup.paths):
        for name in ("memory.limit_in_bytes", "memory.max", "pids.max", "cpu.cfs_quota_us"):
            if (path / name).exists():
                values[name] = (path / name).read_text().split()[0]
    memory = values.get("memory.limit_in_bytes") or values["memory.max"]
    assert (int(memory), values["pids.max"]) == (96 * MIB, "48")
    if cgroup.version == 1:
        assert values["cpu.cfs_quota_us"] == str(CPU_PERIOD_US // 2)


@pytest.mark.slow
def test_an_agent_past_its_memory_limit_is_killed_alone(
    box: tuple[LocalProvider, SandboxRef, Sandbox],
) -> None:
    """The allocating process dies; the agent's shell, its writer and this test do not."""
    _, _, sandbox = box
    hog = "python3 -c 'x = b\"m\" * (512 * 1024 * 1024); print(len(x))'"
    lines, code = _run(sandbox, f"echo before; {hog}; echo hog=$?; exit 4")
    assert (lines, code) == ([b"before", b"hog=137"], 4)
    assert sandbox.limit_events() == {"oom_kill": 1, "max": 0}


def test_a_fork_bomb_stops_at_the_pid_limit(
    box: tuple[LocalProvider, SandboxRef, Sandbox],
) -> None:
    _, ref, sandbox = box
    bomb = "i=0; while [ $i -lt 200 ]; do sleep 1000 & i=$((i + 1)); done 2>/dev/null; exit 6"
    lines, code = _run(sandbox, f"echo go; {bomb}")
    assert lines == [b"go"]
    assert code in (2, 6)  # dash either stops at the first failed fork or runs on
    assert sandbox.limit_events()["max"] > 0
    assert _group_pids(ref) == []  # nothing the agent started outlived it


@pytest.mark.slow
def test_nothing_the_agent_started_outlives_it(
    box: tuple[LocalProvider, SandboxRef, Sandbox],
) -> None:
    _, ref, sandbox = box
    marker = Path(ref.workspace) / "late"
    daemon = "setsid sh -c 'sleep 2; echo late > late' </dev/null >/dev/null 2>&1 &"
    lines, code = _run(sandbox, f"{daemon} echo started; exit 0")
    assert (lines, code) == ([b"started"], 0)
    # The writer kills the agent's groups at its exit: gone a moment after the sentinel.
    deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
    while _group_pids(ref):
        assert time.monotonic() < deadline, _group_pids(ref)
        time.sleep(0.02)
    time.sleep(3)  # past the daemon's write, had it survived
    assert not marker.exists()


def test_destroy_ends_every_process_of_the_sandbox(
    box: tuple[LocalProvider, SandboxRef, Sandbox],
) -> None:
    provider, ref, sandbox = box
    daemon = "setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &"
    handle = spawn_journaled(sandbox, "limits", f"{daemon} echo up; sleep 1000")
    while Path(handle.paths.journal).stat().st_size == 0:
        time.sleep(0.02)
    pids = _group_pids(ref)
    assert len(pids) >= 3  # the agent, its sleep and the daemon (and bwrap's own)
    cgroup = SandboxState.read(Path(ref.root)).cgroup
    assert cgroup is not None
    provider.destroy(ref)
    assert [pid for pid in pids if _alive(pid)] == []
    assert [path for path in cgroup.paths if Path(path).exists()] == []


def test_the_sweep_removes_what_a_lost_sandbox_left(limited: LocalProvider) -> None:
    ref = limited.create("limits", SandboxSpec())
    state = SandboxState.read(Path(ref.root))
    assert state.cgroup is not None
    shutil.rmtree(ref.root)  # gone without destroy: a crash, a wiped disk
    assert all(Path(p).exists() for p in state.cgroup.paths)
    assert limited.sweep() >= 1
    assert [p for p in state.cgroup.paths if Path(p).exists()] == []
    if state.uid is not None:
        assert not (UidPool(*TEST_UIDS).registry / str(state.uid)).exists()


def test_without_a_cgroup_the_limits_are_rlimits(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "sandboxes", limits=LIMITS, cgroups=None)
    ref = provider.create("limits", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    try:
        lines, code = _run(sandbox, "grep -E '^Max (data size|processes) ' /proc/self/limits")
        assert code == 0
        assert [line.split()[:5] for line in lines] == [
            [b"Max", b"data", b"size", str(96 * MIB).encode(), str(96 * MIB).encode()],
            [b"Max", b"processes", b"48", b"48", b"processes"],
        ]
        assert sandbox.limit_events() == {}
    finally:
        provider.destroy(ref)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_uids_are_one_per_sandbox_and_never_the_group(tmp_path: Path) -> None:
    pool = UidPool(5000, 5003, registry=tmp_path / "uids")
    owners = [tmp_path / f"s{i}" for i in range(3)]
    for owner in owners:
        owner.mkdir()
    uids = {owner: pool.claim(owner) for owner in owners}
    assert sorted(uids.values()) == [5001, 5002, 5003]  # 5000 is the jails' group
    assert pool.group == 5000
    with pytest.raises(SandboxError) as caught:
        pool.claim(tmp_path)
    assert caught.value.reason == "no-free-uid"
    pool.release(uids[owners[1]], tmp_path / "not-the-owner")  # only its owner frees it
    assert (pool.registry / str(uids[owners[1]])).exists()
    shutil.rmtree(owners[0])  # a sandbox gone without destroy
    other_root = tmp_path / "other-fleet"
    (other_root / "gone").mkdir(parents=True)
    pool.release(uids[owners[2]], owners[2])
    others = pool.claim(other_root / "gone")
    shutil.rmtree(other_root / "gone")  # another fleet's: its reaper frees it
    assert pool.release_stale(tmp_path) == 1
    assert sorted(int(p.name) for p in pool.registry.iterdir()) == sorted([uids[owners[1]], others])
    shutil.rmtree(other_root)  # a fleet removed for good: any reaper frees its claims
    assert pool.release_stale(tmp_path) == 0  # not counted as this root's
    pool.release(uids[owners[1]], owners[1])
    assert list(pool.registry.iterdir()) == []


def test_ssh_agents_run_under_the_limits_as_rlimits(ssh_target: SshTarget) -> None:
    provider = SshProvider(ssh_target, limits=LIMITS)
    ref = provider.create("limits", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    try:
        assert sandbox.capabilities.resource_limits
        lines, code = _run(sandbox, "grep -E '^Max (data size|processes) ' /proc/self/limits")
        assert code == 0
        assert [line.split()[:5] for line in lines] == [
            [b"Max", b"data", b"size", str(96 * MIB).encode(), str(96 * MIB).encode()],
            [b"Max", b"processes", b"48", b"48", b"processes"],
        ]
    finally:
        provider.destroy(ref)
        provider.close()
