"""The seccomp filter of a root worker's jailed agent: no user namespaces, no blocks
past a file's end, no io_uring.

A root worker's jail has no user namespace of its own (the agent is a uid of its own on
the host, ``jail.py``), so bwrap's ``--disable-userns`` cannot apply, and an agent with
no capability could otherwise ``unshare(CLONE_NEWUSER)`` and hold every capability
again inside a namespace of its own: the kernel's whole namespace surface (mounts,
netfilter, ...), which is where its privilege escalations usually start. The disk limit
(``disk.py``) needs two more refusals: ``RLIMIT_FSIZE`` caps a file's size, which
``fallocate`` with ``FALLOC_FL_KEEP_SIZE`` leaves alone while it allocates any number of
blocks in one call; and a file io_uring holds in its registered table is named by no
``/proc/<pid>/fd`` entry, so the watcher could not count it once deleted. bwrap loads
this program (``--seccomp``) just before it runs the agent:

- ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail with ``EPERM``;
- ``clone3`` fails with ``ENOSYS`` (its flags are in memory, out of a filter's reach),
  which makes libc fall back to ``clone``;
- ``fallocate`` with ``FALLOC_FL_KEEP_SIZE`` fails with ``EOPNOTSUPP``, as on a file
  system without it (``posix_fallocate`` never asks for it), unless it punches a hole,
  which frees blocks;
- ``io_uring_setup``, ``io_uring_enter`` and ``io_uring_register`` fail with ``ENOSYS``,
  as on a kernel without io_uring, which its users fall back from (Docker's default
  profile refuses them too);
- a system call of another ABI (i386 or x32 on x86-64, arm32 on arm64) kills the
  process: its numbers differ, so the checks above would not see it.

A pure function of the architecture: classic BPF, as ``struct sock_filter`` bytes.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

from turnkeeper.errors import SandboxError

CLONE_NEWUSER = 0x10000000
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
_LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_KILL_PROCESS = 0x80000000
# Offsets in struct seccomp_data: nr, arch, then args[0] and args[1] (their low 32 bits,
# little-endian; fallocate's mode, args[1], is an int).
_NR, _ARCH, _ARG0_LOW, _ARG1_LOW = 0, 4, 16, 24
_X32_BIT = 0x40000000


@dataclass(frozen=True, slots=True)
class _Abi:
    audit_arch: int
    clone: int
    unshare: int
    fallocate: int
    # Calls added since 5.1 have one number on every architecture.
    clone3: int = 435
    io_uring: tuple[int, ...] = (425, 426, 427)  # setup, enter, register
    x32_bit: bool = False


_ABIS = {
    "x86_64": _Abi(audit_arch=0xC000003E, clone=56, unshare=272, fallocate=285, x32_bit=True),
    "aarch64": _Abi(audit_arch=0xC00000B7, clone=220, unshare=97, fallocate=47),
}


def jail_filter(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (``platform.machine()`` by default)."""
    machine = machine or platform.machine()
    abi = _ABIS.get(machine)
    if abi is None:
        raise SandboxError(
            f"no seccomp filter for {machine}: a root worker's jails need one (x86_64, aarch64)",
            reason="seccomp-unsupported",
        )
    # (code, jump if true, jump if false, k); jumps name labels, resolved below.
    program: list[tuple[int, str | None, str | None, int] | str] = [
        (_LD_ABS_W, None, None, _ARCH),
        (_JEQ, None, "kill", abi.audit_arch),
        (_LD_ABS_W, None, None, _NR),
    ]
    if abi.x32_bit:
        program.append((_JGE, "kill", None, _X32_BIT))
    program += [
        (_JEQ, "enosys", None, abi.clone3),
        *((_JEQ, "enosys", None, number) for number in abi.io_uring),
        (_JEQ, "flags", None, abi.unshare),
        (_JEQ, "flags", None, abi.clone),
        (_JEQ, "mode", None, abi.fallocate),
        (_RET, None, None, _ALLOW),
        "mode",
        (_LD_ABS_W, None, None, _ARG1_LOW),
        (_JSET, "allow", None, FALLOC_FL_PUNCH_HOLE),
        (_JSET, "eopnotsupp", None, FALLOC_FL_KEEP_SIZE),
        "allow",
        (_RET, None, None, _ALLOW),
        "flags",
        (_LD_ABS_W, None, None, _ARG0_LOW),
        (_JSET, "eperm", None, CLONE_NEWUSER),
        (_RET, None, None, _ALLOW),
        "eperm",
        (_RET, None, None, _ERRNO | errno.EPERM),
        "enosys",
        (_RET, None, None, _ERRNO | errno.ENOSYS),
        "eopnotsupp",
        (_RET, None, None, _ERRNO | errno.EOPNOTSUPP),
        "kill",
        (_RET, None, None, _KILL_PROCESS),
    ]
    return _assemble(program)


def _assemble(program: list[tuple[int, str | None, str | None, int] | str]) -> bytes:
    labels: dict[str, int] = {}
    instructions: list[tuple[int, str | None, str | None, int]] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)
    out = bytearray()
    for index, (code, if_true, if_false, k) in enumerate(instructions):
        jt = 0 if if_true is None else labels[if_true] - index - 1
        jf = 0 if if_false is None else labels[if_false] - index - 1
        out += struct.pack("=HBBI", code, jt, jf, k)
    return bytes(out)
