"""The disk limit of a sandbox's workspace, on every provider (sandbox/disk.py).

The journal writer runs a watcher beside the agent: past the limit (bytes, or one file
per 16 KiB of it) it writes its verdict beside the journal and kills the agent's tree,
and the writer still drains the agent's output and appends the sentinel. Each agent
here prints a line, then fills its workspace in a way that passes the limit only once
its trick is in place (a file deleted but held open, a directory made unreadable, a
mapping of a deleted file), then sleeps under a name of its own, which must be gone.
``ssh`` logs in as the unprivileged account of conftest, jailed by bwrap in a user
namespace: its watcher is not root.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shlex
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.sandbox.conftest import TEST_UIDS, release_remote
from tests.unavailable import require_bwrap, skip_or_fail
from turnkeeper.errors import SandboxError
from turnkeeper.sandbox import JournalReader, Sandbox, SandboxSpec, spawn_journaled
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.cgroup import CgroupTree, Limits
from turnkeeper.sandbox.disk import DiskVerdict, file_limit, parse_verdict, watched_launch
from turnkeeper.sandbox.jail import SECCOMP_FILE, STOP_JAIL
from turnkeeper.sandbox.journal import JournalPaths
from turnkeeper.sandbox.local import LocalProvider, ProcessSandbox
from turnkeeper.sandbox.provider import SandboxProvider
from turnkeeper.sandbox.runner import disk_verdict
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool

MIB = 1024 * 1024
LIMIT = 16 * MIB
FILES = file_limit(LIMIT)  # 1024
CGROUP_LIMITS = Limits(memory_bytes=256 * MIB, cpus=1, pids=64)
SLACK = 64 * 1024
"""Blocks beyond the files' own a workspace may hold: its directories, an extent block."""


@pytest.fixture(params=["local", "local-cgroup", "bwrap", "ssh"])
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxProvider]:
    if request.param == "local":
        yield LocalProvider(tmp_path / "sandboxes")
        return
    if request.param == "local-cgroup":  # the watcher kills the cgroup's members
        try:
            cgroups = CgroupTree.detect()
        except SandboxError as exc:
            skip_or_fail(f"no usable cgroup here: {exc.message}")
        yield LocalProvider(tmp_path / "sandboxes", limits=CGROUP_LIMITS, cgroups=cgroups)
        return
    if request.param == "bwrap":
        require_bwrap()
        yield BwrapProvider(tmp_path / "sandboxes", uids=UidPool(*TEST_UIDS))
        return
    target: SshTarget = request.getfixturevalue("ssh_agent_target")
    provider = SshProvider(target)
    try:
        yield provider
    finally:
        provider.close()
        release_remote(target)


@pytest.fixture
def sandbox(provider: SandboxProvider) -> Iterator[Sandbox]:
    ref = provider.create("disk", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    yield sandbox
    provider.destroy(ref)


def _run(sandbox: Sandbox, command: str) -> tuple[list[bytes], int | None, DiskVerdict | None]:
    handle = spawn_journaled(sandbox, "disk", command, disk_max_bytes=LIMIT)
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
    lines = [line for line, _ in reader]
    return lines, reader.exit_code, disk_verdict(sandbox, handle.paths)


def _sleeper() -> tuple[str, list[str]]:
    """Shell code that sleeps (long enough to fail a test the watcher left alone), and
    the command line that names that sleep alone on this host."""
    seconds = f"30.{secrets.randbelow(10**9):09d}"
    return f"exec sleep {seconds}", ["sleep", seconds]


def _wait_gone(cmdline: list[str]) -> None:
    """Until no process runs ``cmdline`` (a hang guard: the jail's teardown is the
    kernel's, a moment after the sentinel)."""
    deadline = time.monotonic() + 30
    while any(p.info["cmdline"] == cmdline for p in psutil.process_iter(["cmdline"])):
        assert time.monotonic() < deadline, f"{cmdline} outlived the disk limit"
        time.sleep(0.05)


def test_a_file_past_the_limit_stops_the_agent_and_keeps_its_output(sandbox: Sandbox) -> None:
    """One file may not pass the limit (RLIMIT_FSIZE: ``head`` dies of SIGXFSZ at it),
    and the workspace then does, by its directory's block: stopped, 137."""
    sleep, name = _sleeper()
    lines, code, verdict = _run(
        sandbox, f"echo start; head -c {4 * LIMIT} /dev/zero > big; {sleep}"
    )
    assert (lines, code) == ([b"start"], 137)
    assert verdict is not None
    assert (verdict.limit_bytes, verdict.files, verdict.file_limit) == (LIMIT, 2, FILES)
    assert LIMIT < verdict.used_bytes <= LIMIT + SLACK, verdict
    assert verdict.message == "the agent filled its workspace past its disk limit and was stopped"
    size = sandbox.exec(["stat", "-c", "%s", f"{sandbox.ref.workspace}/big"])
    assert size.stdout == b"%d\n" % LIMIT  # the host got no byte past it
    _wait_gone(name)


def test_the_jails_stop_kills_its_bwraps_child_too() -> None:
    """bwrap's child ties itself to bwrap's life only once it has set the jail up: a
    bwrap killed before then alone would leave the jail running, orphaned, holding the
    journal's pipe (``jail.STOP_JAIL``). Here ``$agent`` is a shell whose child outlives
    it as that child would; the stop kills both, and a process of no one's stays."""
    seconds = f"30.{secrets.randbelow(10**9):09d}"
    agent = subprocess.Popen(["sh", "-c", f"sleep {seconds} & wait"])
    bystander = subprocess.Popen(["sleep", seconds])
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(agent.pid).children():
            assert time.monotonic() < deadline, "the agent never started its child"
            time.sleep(0.01)
        (child,) = psutil.Process(agent.pid).children()
        subprocess.run(["sh", "-c", f"agent={agent.pid}; {STOP_JAIL}"], check=True)
        assert agent.wait(timeout=30) == -signal.SIGKILL
        gone, alive = psutil.wait_procs([child], timeout=30)
        assert (gone, alive) == ([child], [])
        assert bystander.poll() is None
    finally:
        for process in (agent, bystander):
            process.kill()
            process.wait()


def test_too_many_files_stop_the_agent(sandbox: Sandbox) -> None:
    sleep, name = _sleeper()
    make = f'i=0; while [ $i -lt {4 * FILES} ]; do : > "f$i"; i=$((i + 1)); done'
    lines, code, verdict = _run(sandbox, f"echo start; {make}; {sleep}")
    assert (lines, code) == ([b"start"], 137)
    assert verdict is not None
    assert verdict.too_many_files, verdict
    assert FILES < verdict.files <= 4 * FILES + 1, verdict
    assert verdict.message == (
        "the agent made more files in its workspace than its disk limit allows"
    )
    _wait_gone(name)


HIDES = {
    # 10 MiB no name reaches, held on descriptor 3 while 10 MiB more are written.
    "deleted-open": (
        "exec 3>held; rm held; head -c {size} /dev/zero >&3; echo hidden; "
        "head -c {size} /dev/zero > visible; {sleep}"
    ),
    # The same, held by a process that left the agent's process tree (its parent gone):
    # the watcher still finds it among the agent's cgroup, or in the jail's namespace.
    "deleted-open-orphan": (
        "( sh -c 'exec 3>held; rm held; head -c {size} /dev/zero >&3; : > ready; {sleep}' & ); "
        "until [ -e ready ]; do sleep 0.05; done; echo hidden; "
        "head -c {size} /dev/zero > visible; {sleep}"
    ),
    # 10 MiB below a directory its owner cannot read; root's watcher reads it anyway,
    # and a watcher of the same uid reads it from a user namespace that maps it to root.
    "unreadable-dir": (
        "mkdir d; head -c {size} /dev/zero > d/f; chmod 0 d; echo hidden; "
        "head -c {size} /dev/zero > visible; {sleep}"
    ),
    # 10 MiB of a deleted file that only a mapping holds, no descriptor, while its
    # child writes 10 MiB more: only root may follow /proc/<pid>/map_files.
    "mapped": """python3 -c '
import mmap, os, subprocess, sys
fd = os.open("held", os.O_RDWR | os.O_CREAT)
os.ftruncate(fd, {size})
view = mmap.mmap(fd, {size})
os.close(fd)
os.unlink("held")
view[:] = b"x" * {size}
print("hidden", flush=True)
subprocess.call(["sh", "-c", "head -c {size} /dev/zero > visible; {sleep}"])
'""",
}


def _outliving_processes_are_found(sandbox: Sandbox) -> bool:
    """Whether the agent's processes are its cgroup's or its jail's, not only its tree."""
    if sandbox.ref.provider == "bwrap":
        return True  # the jail's pid namespace, whose first process is in the tree
    return isinstance(sandbox, ProcessSandbox) and sandbox.state.cgroup is not None


@pytest.mark.slow
@pytest.mark.parametrize("hide", sorted(HIDES))
def test_what_the_agent_hides_still_counts(sandbox: Sandbox, hide: str) -> None:
    """The limit is passed only by the visible file written after the hidden one: a
    watcher that missed the hidden 10 MiB would let the agent sleep on."""
    if hide == "mapped" and sandbox.ref.provider == "ssh":
        pytest.skip("map_files is root's: the ssh account's watcher cannot follow a mapping")
    if hide == "deleted-open-orphan" and not _outliving_processes_are_found(sandbox):
        pytest.skip("without a cgroup or a jail, a process that left the tree is not found")
    size = 10 * MIB
    sleep, name = _sleeper()
    lines, code, verdict = _run(sandbox, HIDES[hide].format(size=size, sleep=sleep))
    assert (lines, code) == ([b"hidden"], 137)
    assert verdict is not None
    assert LIMIT < verdict.used_bytes <= 2 * size + SLACK, verdict
    _wait_gone(name)


def test_hard_links_count_once(sandbox: Sandbox) -> None:
    """8 MiB linked twice and 4 MiB more are 12 MiB on disk (20 counted per name): the
    limit is passed by the 6 MiB after them, at 18 MiB, never before at 20."""
    sleep, name = _sleeper()
    command = (
        f"head -c {8 * MIB} /dev/zero > a; ln a b; head -c {4 * MIB} /dev/zero > c; "
        f"echo linked; head -c {6 * MIB} /dev/zero > d; {sleep}"
    )
    lines, code, verdict = _run(sandbox, command)
    assert (lines, code) == ([b"linked"], 137)
    assert verdict is not None
    assert LIMIT < verdict.used_bytes <= 18 * MIB + SLACK, verdict
    _wait_gone(name)


def test_an_agent_within_its_limit_is_left_alone(sandbox: Sandbox) -> None:
    lines, code, verdict = _run(sandbox, f"head -c {8 * MIB} /dev/zero > a; echo done; exit 3")
    assert (lines, code, verdict) == ([b"done"], 3, None)
    size = sandbox.exec(["stat", "-c", "%s", f"{sandbox.ref.workspace}/a"])
    assert size.stdout == b"%d\n" % (8 * MIB)


ALLOCATE = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
libc.syscall.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long]
KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE = 0x01, 0x02, 0x10

def answer(result):
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]

fd = os.open("held", os.O_RDWR | os.O_CREAT)
os.write(fd, b"x" * 8192)
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
print(json.dumps({
    "keep-size": answer(libc.fallocate(fd, KEEP_SIZE, 0, %(size)d)),
    "zero-range": answer(libc.fallocate(fd, ZERO_RANGE | KEEP_SIZE, 0, %(size)d)),
    "punch-hole": answer(libc.fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 0, 4096)),
    "grow": answer(libc.fallocate(fd, 0, 8192, 4096)),
    "blocks": os.fstat(fd).st_blocks * 512,
    "io_uring_setup": answer(libc.syscall(425, 8, ctypes.addressof(params), 0)),
    "io_uring_enter": answer(libc.syscall(426, -1, 0, 0)),
    "io_uring_register": answer(libc.syscall(427, -1, 0, 0)),
}))
"""


@pytest.mark.parametrize("made_by", ["this worker", "an older worker"])
def test_a_jailed_agent_can_allocate_no_blocks_past_the_end_of_a_file(
    tmp_path: Path, made_by: str
) -> None:
    """``RLIMIT_FSIZE`` checks a file's size, and ``fallocate`` with
    ``FALLOC_FL_KEEP_SIZE`` allocates without changing it (sixteen limits in one call,
    before the watcher looks): the jail's seccomp filter refuses it, and io_uring, whose
    registered files no ``/proc`` entry names. Punching a hole and growing a file as
    far as ``RLIMIT_FSIZE`` allows still work. A sandbox an older worker made holds
    its older filter, which the next launch replaces."""
    require_bwrap()
    provider = BwrapProvider(tmp_path / "sandboxes", uids=UidPool(*TEST_UIDS))
    ref = provider.create("disk", SandboxSpec())
    try:
        sandbox = provider.resume(ref)
        assert sandbox is not None
        if made_by == "an older worker":  # a filter that allows every call
            allow_all = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)
            (Path(ref.root) / SECCOMP_FILE).write_bytes(allow_all)
        probe = ALLOCATE % {"size": 16 * LIMIT}
        handle = spawn_journaled(sandbox, "disk", f"python3 -I -c {shlex.quote(probe)}")
        reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
        lines = [line for line, _ in reader]
        assert reader.exit_code == 0, lines
        assert disk_verdict(sandbox, handle.paths) is None
    finally:
        provider.destroy(ref)
    unsupported = errno.errorcode[errno.EOPNOTSUPP]  # ENOTSUP, its alias on Linux
    assert [json.loads(line) for line in lines] == [
        {
            "keep-size": unsupported,
            "zero-range": unsupported,
            "punch-hole": "ok",
            "grow": "ok",
            "blocks": 8192,  # 12 KiB, one page of them punched out
            "io_uring_setup": "ENOSYS",
            "io_uring_enter": "ENOSYS",
            "io_uring_register": "ENOSYS",
        }
    ]


# A `find` ahead of the real one on the watcher's PATH: its walk of the workspace (the
# call with -xdev), once armed and seen once, waits for the test, between the round's
# reading of the agent's tree and its verdict.
FIND_SHIM = """#!/bin/sh
if [ "$2" = -xdev ] && [ -e {dir}/armed ]; then
  if [ -e {dir}/seen ]; then
    : > {dir}/blocked
    while [ ! -e {dir}/release ]; do sleep 0.01; done
  else
    : > {dir}/seen
  fi
fi
exec /usr/bin/find "$@"
"""
# The agent: a child whose pid it writes down and reaps (then says so), then it sleeps.
PID_TAKER = "sleep 1000 & echo $! > {dir}/child; wait; : > {dir}/reaped; exec sleep 1001"


def _fork_with_pid(pid: int) -> psutil.Popen:
    """A host process (no agent's) with ``pid``, freed a moment ago (root's
    ``ns_last_pid``; another host process may take it first, then we ask again)."""
    deadline = time.monotonic() + 30
    while True:
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        process = psutil.Popen(["sleep", "1002"])
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
        assert time.monotonic() < deadline, f"pid {pid} was never free"


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.01)


def test_the_watcher_kills_no_process_that_took_a_pid_of_the_agents_tree(
    tmp_path: Path,
) -> None:
    """A round reads the agent's tree, then measures, which may take seconds. The child
    the tree named exits meanwhile and a host process takes its pid: the kill that ends
    the round must not reach it (a launch that names no stop of its own: the tree is
    read again right before the kill)."""
    if os.geteuid() != 0:
        skip_or_fail("taking a given pid needs root (ns_last_pid)")
    shims, workspace, journals = (tmp_path / name for name in ("bin", "ws", "journals"))
    for directory in (shims, workspace, journals):
        directory.mkdir()
    shim = shims / "find"
    shim.write_text(FIND_SHIM.format(dir=tmp_path))
    shim.chmod(0o755)
    paths = JournalPaths(str(journals), "disk")
    launch = f"( exec sh -c {shlex.quote(PID_TAKER.format(dir=tmp_path))} )"
    code = watched_launch(launch, str(workspace), paths, LIMIT)
    environment = {"PATH": f"{shims}:/usr/bin:/bin"}
    with subprocess.Popen(["sh", "-c", code], env=environment) as watched:
        _wait_for(tmp_path / "child")
        child = int((tmp_path / "child").read_text())
        (tmp_path / "armed").touch()
        _wait_for(tmp_path / "blocked")
        (workspace / "big").write_bytes(b"x" * (LIMIT + MIB))
        os.kill(child, signal.SIGKILL)
        _wait_for(tmp_path / "reaped")
        host = _fork_with_pid(child)
        try:
            (tmp_path / "release").touch()
            assert watched.wait(timeout=60) == 137
            verdict = parse_verdict(Path(paths.limit_file).read_bytes())
            assert verdict is not None
            assert (verdict.limit_bytes, verdict.files) == (LIMIT, 2)  # big, and its directory
            assert host.poll() is None  # not -9: the watcher left it alone
        finally:
            host.kill()
            host.wait()


# A `find` ahead of the real one that writes down each call's arguments, one line a
# call, once the test has armed it.
FIND_LOGGER = """#!/bin/sh
[ -e {dir}/armed ] && printf '%s\\n' "$*" >> {dir}/calls
exec /usr/bin/find "$@"
"""
# The agent: 2000 mappings of one deleted page, in three processes (fork copies them).
MAPPINGS = """python3 -c '
import ctypes, os, time
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
fd = os.open("page", os.O_RDWR | os.O_CREAT)
os.ftruncate(fd, 4096)
for _ in range(2000):
    assert libc.mmap(None, 4096, 1, 1, fd, 0) not in (None, ctypes.c_void_p(-1).value)
os.close(fd)
os.unlink("page")
for _ in range(2):
    if os.fork() == 0:
        break
open("{dir}/ready", "w").close()
time.sleep(1000)
'"""


def test_a_round_follows_one_mapping_per_deleted_file_however_many_there_are(
    tmp_path: Path,
) -> None:
    """The watcher reads each process's ``maps`` (one read, every mapping's device,
    inode and ``(deleted)``) and follows one ``map_files`` entry per deleted file, not
    every entry of every process: 6000 mappings of one page cost one ``stat``, where
    following them all made an agent's round (and the pause after it) as long as it
    liked."""
    shims, workspace, journals = (tmp_path / name for name in ("bin", "ws", "journals"))
    for directory in (shims, workspace, journals):
        directory.mkdir()
    shim = shims / "find"
    shim.write_text(FIND_LOGGER.format(dir=tmp_path))
    shim.chmod(0o755)
    paths = JournalPaths(str(journals), "disk")
    launch = f"( cd {shlex.quote(str(workspace))} && exec {MAPPINGS.format(dir=tmp_path)} )"
    code = watched_launch(launch, str(workspace), paths, LIMIT)
    environment = {"PATH": f"{shims}:/usr/bin:/bin"}
    calls = tmp_path / "calls"
    with subprocess.Popen(["sh", "-c", code], env=environment, start_new_session=True) as watched:
        try:
            _wait_for(tmp_path / "ready")
            (tmp_path / "armed").touch()
            deadline = time.monotonic() + 60
            # Two walks of the workspace: what lies between them is one whole round.
            while not calls.exists() or calls.read_text().count(" -xdev ") < 2:
                assert time.monotonic() < deadline, "the watcher made no two rounds"
                time.sleep(0.05)
        finally:
            os.killpg(watched.pid, signal.SIGKILL)
    lines = calls.read_text().splitlines()
    walks = [index for index, line in enumerate(lines) if " -xdev " in line]
    round_ = lines[walks[0] + 1 : walks[1] + 1]
    followed = [arg for line in round_ for arg in line.split() if "/map_files" in arg]
    assert len(followed) == 1, round_
    assert re.fullmatch(r"/proc/[0-9]+/map_files/[0-9a-f]+-[0-9a-f]+", followed[0]), followed
    assert not Path(paths.limit_file).exists()


# A `find` whose first walk of the workspace once armed waits for the test, and a
# `sleep` that writes down the pause it was asked for once the walk was released.
SLOW_FIND = """#!/bin/sh
if [ "$2" = -xdev ] && [ -e {dir}/armed ] && [ ! -e {dir}/release ]; then
  : > {dir}/blocked
  while [ ! -e {dir}/release ]; do /usr/bin/sleep 0.01; done
fi
exec /usr/bin/find "$@"
"""
PAUSE_LOGGER = """#!/bin/sh
[ -e {dir}/release ] && printf '%s\\n' "$1" >> {dir}/pauses
exec /usr/bin/sleep "$@"
"""


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def test_a_slow_round_is_followed_by_a_pause_of_three_seconds_at_most(tmp_path: Path) -> None:
    """A round the agent made take a second (or ten) pauses three seconds after it,
    not four times as long: the agent would write unwatched for as long again."""
    shims, workspace, journals = (tmp_path / name for name in ("bin", "ws", "journals"))
    for directory in (shims, workspace, journals):
        directory.mkdir()
    for name, text in (("find", SLOW_FIND), ("sleep", PAUSE_LOGGER)):
        (shims / name).write_text(text.format(dir=tmp_path))
        (shims / name).chmod(0o755)
    paths = JournalPaths(str(journals), "disk")
    code = watched_launch("( exec /usr/bin/sleep 1000 )", str(workspace), paths, LIMIT)
    environment = {"PATH": f"{shims}:/usr/bin:/bin"}
    pauses = tmp_path / "pauses"
    with subprocess.Popen(["sh", "-c", code], env=environment, start_new_session=True) as watched:
        try:
            (tmp_path / "armed").touch()
            _wait_for(tmp_path / "blocked")
            blocked = _uptime()
            while _uptime() < blocked + 1:  # the round takes a second at least
                time.sleep(0.05)
            (tmp_path / "release").touch()
            _wait_for(pauses)
        finally:
            os.killpg(watched.pid, signal.SIGKILL)
    assert pauses.read_text().splitlines()[0] == "3.00"
