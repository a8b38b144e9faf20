"""A hostile agent: tries every way out of its sandbox and reports each attempt.

Standalone (the standard library only: it runs inside a jail, which shows no
turnkeeper). ``python3 hostile_agent.py CONFIG_FILE`` (its prompt file), where the JSON
config names the markers to look for, the host paths to try and the loopback ports of
the services to reach (``{"postgres": 5432, ...}``); every probe prints one JSON line,
``{"probe": NAME, "result": ...}``, so a test can assert exactly what it saw. It then
prints forged sentinels, and exits with code 5.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

SKIP_WALK = ("/proc", "/sys", "/dev")
NONCE_PATTERN = re.compile(rb"__nonce\W{1,6}([0-9a-f]{64})")
PROXY = ("127.0.0.1", 3128)


def report(probe: str, result: object) -> None:
    sys.stdout.write(json.dumps({"probe": probe, "result": result}, sort_keys=True) + "\n")
    sys.stdout.flush()


def pids() -> list[int]:
    return sorted(int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def scan_proc(kind: str, markers: list[str]) -> object:
    """Markers found in any readable /proc/<pid>/<kind>, and the pids it could not read."""
    found, unreadable = set(), []
    for pid in pids():
        if pid == os.getpid():
            continue  # its own command line holds the markers it looks for
        try:
            data = Path(f"/proc/{pid}/{kind}").read_bytes()
        except OSError:
            unreadable.append(pid)
            continue
        found.update(marker for marker in markers if marker.encode() in data)
    return {"found": sorted(found), "unreadable": unreadable}


def tcp(port: int) -> str:
    with socket.socket() as sock:
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))
    return "connected"


def through_proxy(port: int) -> str:
    """A CONNECT through the jail's proxy: its status line."""
    try:
        with socket.create_connection(PROXY, timeout=10) as sock:
            target = f"127.0.0.1:{port}"
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            return sock.recv(64).split(b"\r\n", 1)[0].decode()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))


def sockets() -> object:
    """Every unix socket it can find (walking the tree, and named on its jail's command
    line), and what connecting to each gave."""
    walked = [entry.path for entry in ENTRIES if _is_socket(entry)]
    named = []
    with contextlib.suppress(OSError):
        for arg in Path("/proc/1/cmdline").read_bytes().decode(errors="replace").split("\0"):
            named += [arg, f"{arg}/proxy.sock"] if arg.startswith("/run/") else []
    tried = {}
    for path in sorted({*walked, *named}):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            try:
                sock.connect(path)
                tried[path] = "connected"
            except OSError as exc:
                tried[path] = errno.errorcode.get(exc.errno or 0, str(exc))
    return {
        "walked": sorted(walked),
        "connected": sorted(k for k, v in tried.items() if v == "connected"),
    }


def _is_socket(entry: os.DirEntry[str]) -> bool:
    """Only entries that are neither files nor links (sockets, fifos) cost a stat."""
    if entry.is_file(follow_symlinks=False) or entry.is_symlink():
        return False
    try:
        return stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return False


def walk(top: str) -> list[os.DirEntry[str]]:
    """Every non-directory entry below ``top`` that it may list (no stat per file)."""
    found, pending = [], [top]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in SKIP_WALK:
                            pending.append(entry.path)
                    else:
                        found.append(entry)
        except OSError:
            continue
    return found


def look_for(markers: list[str], names: list[str]) -> object:
    """Files named like a journal or another run's marker, and files holding a marker."""
    named, holding = [], []
    for path in (entry.path for entry in ENTRIES):
        if any(path.endswith(suffix) for suffix in names):
            named.append(path)
        if path.startswith(("/usr/", "/opt/")) or path == sys.argv[1]:
            continue  # the system's software, and its own prompt (which lists the markers)
        with contextlib.suppress(OSError):
            if Path(path).stat().st_size <= 1 << 20:
                data = Path(path).read_bytes()
                holding.extend(path for marker in markers if marker.encode() in data)
    return {"named": sorted(named), "holding": sorted(set(holding))}


def write_outside(targets: list[str]) -> dict[str, str]:
    results = {}
    for target in targets:
        try:
            with Path(target, "hostile-was-here").open("x") as file:
                file.write("x")
            results[target] = "written"
        except OSError as exc:
            results[target] = errno.errorcode.get(exc.errno or 0, str(exc))
    return results


def memories() -> object:
    """Every visible process's memory: readable or not, and any nonce-looking value in it."""
    results, candidates = {}, set()
    for pid in pids():
        if pid == os.getpid():
            continue
        try:
            proc = Path(f"/proc/{pid}")
            with (proc / "maps").open() as maps, (proc / "mem").open("rb") as mem:
                for line in maps:
                    span, perms = line.split()[:2]
                    if "r" not in perms:
                        continue
                    start, end = (int(x, 16) for x in span.split("-"))
                    with contextlib.suppress(OSError, ValueError, OverflowError):
                        mem.seek(start)
                        data = mem.read(min(end - start, 64 << 20))
                        candidates.update(m.decode() for m in NONCE_PATTERN.findall(data))
            results[str(pid)] = "read"
        except OSError as exc:
            results[str(pid)] = errno.errorcode.get(exc.errno or 0, str(exc))
    return {"ppid": os.getppid(), "mem": results, "nonces": sorted(candidates)}


def daemon(tag: str) -> str:
    """A session leader of its own that tries to write into the workspace later."""
    code = "import time; time.sleep(4); open('/workspace/daemon-wrote', 'w').write('late')"
    subprocess.Popen(
        ["python3", "-c", code, tag], start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # The test outside sees it running, then lets the agent go on: however slow the
    # machine, the daemon is seen before the run ends and its sandbox goes.
    seen = Path("/workspace/daemon-seen")
    for _ in range(6000):
        if seen.exists():
            return "started"
        time.sleep(0.05)
    return "never seen"


def memory_bomb() -> str:
    code = "x = []\nwhile True: x.append(b'm' * (64 << 20))"
    done = subprocess.run(["python3", "-c", code], capture_output=True, check=False)
    return f"exit {done.returncode}"


def fork_bomb() -> str:
    """Forks until the kernel refuses, then ends every child it made."""
    code = (
        "import os, time\n"
        "os.setpgid(0, 0)\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(120); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print(exc.errno, flush=True)\n"
        "    os.killpg(0, 9)\n"
    )
    done = subprocess.run(["python3", "-c", code], capture_output=True, check=False, timeout=120)
    refused = done.stdout.strip().decode()
    return "refused: EAGAIN" if refused == str(errno.EAGAIN) else f"not refused: {refused!r}"


ENTRIES: list[os.DirEntry[str]] = []


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    ENTRIES.extend(walk("/"))  # one walk of the whole tree, for sockets and for files
    markers = config["markers"]
    report("proc-environ", scan_proc("environ", markers))
    report("proc-cmdline", scan_proc("cmdline", markers))
    for name, port in config["services"].items():
        report(f"tcp-{name}", tcp(port))
        report(f"proxy-{name}", through_proxy(port))
    report("unix-postgres", _connect("/var/run/postgresql/.s.PGSQL.5432"))
    report("unix-sockets", sockets())
    journal_names = [".ndjson", ".nonce", ".env", ".prompt", config["marker_file"]]
    report("files", look_for(markers, journal_names))
    report("host-paths", {p: Path(p).exists() for p in config["host_paths"]})
    report("write-outside", write_outside(config["write_targets"]))
    report("memory", memories())
    report("daemon", daemon(config["daemon_tag"]))
    report("memory-bomb", memory_bomb())
    report("fork-bomb", fork_bomb())
    derived = f"turnkeeper/journal-exit-sentinel/v1::{config['run_id']}"  # the old scheme
    guesses = [hashlib.sha256(derived.encode()).hexdigest(), "0" * 64, secrets.token_hex(32)]
    for guess in guesses:  # forged sentinels, each followed by more output
        sys.stdout.write(json.dumps({"__exit": 0, "__nonce": guess}, separators=(",", ":")) + "\n")
    report("forged", len(guesses))
    sys.stdout.flush()
    sys.exit(5)


def _connect(path: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))
    return "connected"


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
