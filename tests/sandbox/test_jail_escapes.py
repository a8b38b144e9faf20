"""What a jailed agent may not do beyond the hostile suite's probes: make a user
namespace of its own (where it would hold every capability again, and the kernel's
whole namespace surface with them), or grow the jail's own filesystems past its
memory limit (tmpfs pages are no process's data: ``RLIMIT_DATA`` never counts them);
nor reach a host's abstract unix socket or signal a process outside its jail.

Both jails are tried: ``bwrap`` under a root worker (no user namespace, the agent a
uid of its own, limits by cgroup) and the remote jail of ``ssh`` as its unprivileged
account (a user namespace, limits by rlimits).
"""

from __future__ import annotations

import json
import shlex
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.conftest import TEST_UIDS, release_remote
from tests.unavailable import require_bwrap, skip_or_fail
from turnkeeper.errors import SandboxError
from turnkeeper.sandbox import (
    JournalReader,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
    spawn_journaled,
    stderr_tail,
)
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.cgroup import CgroupTree, Limits
from turnkeeper.sandbox.command import AgentCommand
from turnkeeper.sandbox.journal import LIVENESS_ALIVE, liveness_argv
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool

MIB = 1024 * 1024
LIMITS = Limits(memory_bytes=64 * MIB, cpus=1, pids=64)
PROBE = r"""
import ctypes, errno, json, os, platform, struct
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
CLONE = {"x86_64": 56, "aarch64": 220}[platform.machine()]

def cloned(result):
    if result == 0:
        os._exit(0)  # the child made by clone
    if result > 0:
        os.waitpid(result, 0)
        return "made"
    return errno.errorcode[ctypes.get_errno()]

def write(directory):
    try:
        with open(os.path.join(directory, "escape"), "xb") as file:
            file.write(b"x" * 4096)
        return "written"
    except OSError as exc:
        return errno.errorcode[exc.errno]

args = struct.pack("=11Q", CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0)
tmp = os.statvfs("/tmp")
print(json.dumps({
    "clone": cloned(libc.syscall(CLONE, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)),
    "clone3": cloned(libc.syscall(435, ctypes.c_char_p(args), len(args))),
    "writes": {d: write(d) for d in ("/", "/etc", "/run/turnkeeper", "/dev", "/dev/shm", "/tmp")},
    "tmp_bytes": tmp.f_blocks * tmp.f_frsize,
    # Last: once it succeeds, this process is in a namespace of its own.
    "unshare": "made" if libc.unshare(CLONE_NEWUSER) == 0 else errno.errorcode[ctypes.get_errno()],
}))
"""


def _tree() -> CgroupTree:
    try:
        return CgroupTree.detect()
    except SandboxError as exc:
        skip_or_fail(f"no usable cgroup here: {exc.message}")


@pytest.fixture(params=["bwrap", "ssh"])
def jailed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxProvider]:
    require_bwrap()
    if request.param == "bwrap":
        yield BwrapProvider(
            tmp_path / "sandboxes", limits=LIMITS, cgroups=_tree(), uids=UidPool(*TEST_UIDS)
        )
        return
    target: SshTarget = request.getfixturevalue("ssh_agent_target")
    provider = SshProvider(target, limits=LIMITS)
    assert provider.remote_jail() is not None
    try:
        yield provider
    finally:
        provider.close()
        release_remote(target)


def _probe(sandbox: Sandbox) -> dict[str, object]:
    handle = spawn_journaled(sandbox, "escapes", f"python3 -I -c {shlex.quote(PROBE)}")
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
    lines = [line for line, _ in reader]
    assert reader.exit_code == 0, lines
    [line] = lines
    result: dict[str, object] = json.loads(line)
    return result


def test_a_jailed_agent_can_neither_make_a_user_namespace_nor_grow_its_filesystems(
    jailed: SandboxProvider,
) -> None:
    ref = jailed.create("escapes", SandboxSpec())
    try:
        sandbox = jailed.resume(ref)
        assert sandbox is not None
        result = _probe(sandbox)
    finally:
        jailed.destroy(ref)
    # bwrap's own --disable-userns answers ENOSPC; turnkeeper's seccomp filter, EPERM.
    refused = "EPERM" if jailed.name == "bwrap" else "ENOSPC"
    # Only /tmp is the agent's, and it holds no more than its memory limit.
    writes = dict.fromkeys(["/", "/etc", "/run/turnkeeper", "/dev", "/dev/shm"], "EROFS")
    assert result == {
        "unshare": refused,
        "clone": refused,
        "clone3": "ENOSYS" if jailed.name == "bwrap" else refused,
        "writes": {**writes, "/tmp": "written"},
        "tmp_bytes": LIMITS.memory_bytes,
    }


KILLER = r"""
import errno, json, os, signal, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    try:
        sock.connect(sys.argv[1].encode().replace(b"@", b"\0", 1))
        reached = "connected"
    except OSError as exc:
        reached = errno.errorcode[exc.errno]
try:
    os.kill(-1, signal.SIGKILL)  # every process it may signal, but itself
    killed = "signalled"
except OSError as exc:
    killed = errno.errorcode[exc.errno]  # ESRCH: not one
print(json.dumps({"abstract-socket": reached, "kill-all": killed}))
"""
VICTIM = "echo ready; while :; do sleep 0.1; done"


def test_an_agent_reaches_no_abstract_socket_and_no_process_outside_its_jail(
    jailed: SandboxProvider,
) -> None:
    """The jail's network namespace has abstract unix sockets of its own; its pid
    namespace takes ``kill(-1)`` to its own processes, even where the agents of all
    sandboxes share one uid (ssh)."""
    name = f"@turnkeeper-escape-{uuid.uuid4().hex}"
    refs = [jailed.create(run_id, SandboxSpec()) for run_id in ("victim", "killer")]
    try:
        victim, killer = (jailed.resume(ref) for ref in refs)
        assert victim is not None
        assert killer is not None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as host_socket:
            host_socket.bind(name.encode().replace(b"@", b"\0", 1))
            host_socket.listen()
            handle = spawn_journaled(victim, "victim", VICTIM)
            for line, _ in JournalReader(victim, handle.paths, nonce=handle.nonce):
                assert line == b"ready"
                break
            command = AgentCommand(("python3", "-I", "-c", KILLER, name))
            killed = spawn_journaled(killer, "killer", command)
            reader = JournalReader(killer, killed.paths, nonce=killed.nonce)
            lines = [json.loads(line) for line, _ in reader]
        assert not stderr_tail(killer, killed.paths)
        assert (lines, reader.exit_code) == (
            [{"abstract-socket": "ECONNREFUSED", "kill-all": "ESRCH"}],
            0,
        )
        alive = victim.exec(liveness_argv(handle.paths)).exit_code
        assert alive == LIVENESS_ALIVE  # the other sandbox's agent runs on
    finally:
        for ref in refs:
            jailed.destroy(ref)
