"""The disk watcher's cost: CPU of a core per watched agent, by how it finds the agent's
processes, beside a host that runs many other processes.

Two sides in one run, each the watcher's own loop (``sandbox/disk.py``) run alone
against a ``sleep`` that stands for the agent, at the default 4 GiB limit (so it only
measures, never stops), for the same seconds:

- ours: the agent's processes from a members file, as a cgroup's ``cgroup.procs``
  (``AgentLaunch.members``, a root worker's sandbox), read by the watcher's shell;
- plain: the agent's process tree, read from the parent of every process on the host
  (what a sandbox without a cgroup still does).

The host is given ``--others`` more sleeping processes first (a busy worker host: two
hundred live turns run a thousand processes or more), then the two sides run in turn.

    .venv/bin/python bench/disk_watcher.py [--seconds 10] [--others 600]
"""

from __future__ import annotations

import argparse
import resource
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from turnkeeper.sandbox import disk


def watcher_cpu(workdir: Path, seconds: float, with_members: bool) -> float:
    """Seconds of CPU the watcher spent per second while its agent slept ``seconds``."""
    workspace = workdir / "workspace"
    workspace.mkdir(parents=True)
    agent = subprocess.run(
        ["sh", "-c", f"sleep {seconds} >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        check=True,
        text=True,
    )
    pid = int(agent.stdout)  # an orphan init reaps, so the watcher sees it end
    members = ""
    if with_members:
        members = str(workdir / "cgroup.procs")
        Path(members).write_text(f"{pid}\n")
    settings = {
        "ws": workspace,
        "verdict": workdir / "verdict",
        "verdict_name": disk.VERDICT,
        "limit": 4 * 1024**3,
        "max_files": disk.file_limit(4 * 1024**3),
        "min_pause": disk.MIN_PAUSE,
        "pause_factor": disk.PAUSE_FACTOR,
        "max_pause": disk.MAX_PAUSE,
        "stop": "",
        "members": members,
    }
    assignments = " ".join(f"{name}={shlex.quote(str(value))}" for name, value in settings.items())
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(["sh", "-c", f"agent={pid}; {assignments}\n{disk.WATCHER}"], check=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--others", type=int, default=600)
    args = parser.parse_args()
    others = [subprocess.Popen(["sleep", str(args.seconds * 3 + 30)]) for _ in range(args.others)]
    try:
        host = sum(1 for entry in Path("/proc").iterdir() if entry.name.isdigit())
        print(f"{host} processes on the host, {args.seconds:.0f} s of watching per side")
        with tempfile.TemporaryDirectory() as tmp:
            ours = watcher_cpu(Path(tmp, "ours"), args.seconds, with_members=True)
            plain = watcher_cpu(Path(tmp, "plain"), args.seconds, with_members=False)
        print(f"ours  (members file): {100 * ours:5.2f}% of a core per watched agent")
        print(f"plain (process tree): {100 * plain:5.2f}% of a core per watched agent")
        print(f"plain / ours: {plain / ours:.2f}")
    finally:
        for process in others:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
