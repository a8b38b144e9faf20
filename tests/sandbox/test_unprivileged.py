"""A worker that is not root: bwrap makes a user namespace, the agent keeps the worker's
uid with no capability, no nested user namespace, and rlimits where no cgroup is
delegated. Run here as uid 65534, from the system's Python on this checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import turnkeeper
from tests.unavailable import skip_or_fail

NOBODY = 65534
SCRIPT = """
import os, sys
from pathlib import Path
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
from turnkeeper.config import Settings
from turnkeeper.sandbox import JournalReader, SandboxSpec, spawn_journaled
from turnkeeper.sandbox.factory import provider_for
provider = provider_for("bwrap", Settings(data_dir=Path(sys.argv[1]), sandbox_egress=""))
ref = provider.create("r", SandboxSpec())
sandbox = provider.resume(ref)
handle = spawn_journaled(sandbox, "r", sys.argv[2])
reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
for line, _ in reader:
    print(line.decode())
print("exit", reader.exit_code)
print("host-owner", os.stat(Path(ref.workspace) / "mine").st_uid)
provider.destroy(ref)
"""
AGENT = (
    "id -u; cat /proc/self/uid_map; grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status; "
    "unshare -U true 2>/dev/null && echo nested-userns || echo no-nested-userns; "
    "grep -E '^Max (data size|processes) ' /proc/self/limits; "
    "touch /workspace/mine && echo wrote"
)


def _python() -> str:
    """A Python uid 65534 can run that matches this one (same minor, same ABI)."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or shutil.which("bwrap") is None or system is None:
        skip_or_fail("needs root (to become uid 65534), bwrap and /usr/bin/python3")
    version = subprocess.run(
        [system, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if version != str(sys.version_info[:2]):
        pytest.skip(f"the system's Python is {version}, this one {sys.version_info[:2]}")
    return system


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A directory of uid 65534's own (pytest's base directory is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="tk-nobody-"))
    base.chmod(0o755)
    os.chown(base, NOBODY, NOBODY)
    yield base / "data"
    shutil.rmtree(base, ignore_errors=True)


def test_an_unprivileged_worker_jails_its_agent_in_a_user_namespace(data_dir: Path) -> None:
    python = _python()
    paths = [str(Path(turnkeeper.__file__).parent.parent), sysconfig.get_paths()["purelib"]]
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         python, "-c", SCRIPT, str(data_dir), AGENT],
        env={"PATH": "/usr/bin:/bin", "HOME": str(data_dir.parent),
             "PYTHONPATH": ":".join(paths)},
        cwd=data_dir.parent, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert [line.split() for line in done.stdout.splitlines()] == [
        [str(NOBODY)],
        # One uid: 65534 in the agent's namespace, 0 in the one bwrap nests it in to
        # forbid more (see host-owner: it is the worker's own uid on the host).
        [str(NOBODY), "0", "1"],
        ["CapEff:", "0000000000000000"],
        ["CapBnd:", "0000000000000000"],
        ["NoNewPrivs:", "1"],
        ["no-nested-userns"],
        # No cgroup is delegated to uid 65534 here: the limits are rlimits.
        ["Max", "data", "size", "4294967296", "4294967296", "bytes"],
        ["Max", "processes", "1024", "1024", "processes"],
        ["wrote"],
        ["exit", "0"],
        ["host-owner", str(NOBODY)],
    ]
