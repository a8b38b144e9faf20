"""The journal conformance suite, run against every provider (local, bwrap, ssh)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import cast

import psutil
import pytest

from tests.sandbox.conftest import TEST_UIDS
from tests.unremovable import unremovable
from turnkeeper.errors import AgentVanishedError, JournalExistsError, JournalStalledError
from turnkeeper.sandbox import (
    AgentCommand,
    JournalHandle,
    JournalPaths,
    JournalReader,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
    StopSignal,
    exit_sentinel_line,
    latest_journal,
    list_journals,
    parse_journal_name,
    spawn_journaled,
    stderr_tail,
    strategy_for,
)
from turnkeeper.sandbox.jail import WORKSPACE
from turnkeeper.sandbox.journal import (
    LIVENESS_ALIVE,
    LIVENESS_FREE,
    LIVENESS_NOT_STARTED,
    liveness_argv,
    new_nonce,
    writer_argv,
)
from turnkeeper.sandbox.runner import disarm, never_started
from turnkeeper.sandbox.ssh import SshProvider

RUN = "run-1"


def read_all(
    sandbox: Sandbox, handle: JournalHandle, **options: object
) -> tuple[list[tuple[bytes, int]], JournalReader]:
    reader = JournalReader(
        sandbox,
        handle.paths,
        nonce=handle.nonce,
        **options,  # type: ignore[arg-type]
    )
    return list(reader), reader


def journal_bytes(paths: JournalPaths) -> bytes:
    # Every provider under test keeps its files on this machine (ssh is loopback).
    return Path(paths.journal).read_bytes()


def sentinel(handle: JournalHandle, code: int) -> bytes:
    return exit_sentinel_line(code, handle.nonce)


def test_redirect_sentinel_and_stderr_apart(sandbox: Sandbox) -> None:
    handle = spawn_journaled(sandbox, RUN, "echo '{\"a\":1}'; echo oops >&2; echo two")
    lines, reader = read_all(sandbox, handle)
    assert lines == [(b'{"a":1}', 8), (b"two", 12)]
    assert (reader.exit_code, reader.end_position) == (0, 12 + len(sentinel(handle, 0)))
    assert journal_bytes(handle.paths) == b'{"a":1}\ntwo\n' + sentinel(handle, 0)
    assert stderr_tail(sandbox, handle.paths) == b"oops\n"
    assert strategy_for(sandbox.capabilities) == "follow"


def test_exit_inside_command_still_writes_the_sentinel(sandbox: Sandbox) -> None:
    handle = spawn_journaled(sandbox, RUN, "echo before; exit 7; echo after")
    lines, reader = read_all(sandbox, handle)
    assert lines == [(b"before", 7)]
    assert reader.exit_code == 7
    assert journal_bytes(handle.paths) == b"before\n" + sentinel(handle, 7)


def test_forged_sentinels_are_ordinary_lines(sandbox: Sandbox) -> None:
    wrong = b'{"__exit":0,"__nonce":"' + b"0" * 64 + b'"}'
    other_run = exit_sentinel_line(0, new_nonce()).rstrip()
    script = (
        "printf '%s\\n' '{\"__exit\":0}' "
        f'\'{wrong.decode()}\' \'{{"__exit":"x","__nonce":"abc"}}\' \'{other_run.decode()}\' '
        "'{\"__exit\":0} mid-stream' done; exit 3"
    )
    handle = spawn_journaled(sandbox, RUN, script)
    lines, reader = read_all(sandbox, handle)
    assert [line for line, _ in lines] == [
        b'{"__exit":0}', wrong, b'{"__exit":"x","__nonce":"abc"}', other_run,
        b'{"__exit":0} mid-stream', b"done",
    ]  # fmt: skip
    assert reader.exit_code == 3


def test_partial_last_line_big_line_and_invalid_utf8(sandbox: Sandbox) -> None:
    big = 10 * 1024 * 1024
    script = f"printf '\\377\\376ok\\n'; head -c {big} /dev/zero | tr '\\0' a; echo; printf tail"
    handle = spawn_journaled(sandbox, RUN, script)
    lines, reader = read_all(sandbox, handle)
    assert [(len(line), end) for line, end in lines] == [
        (4, 5),
        (big, 5 + big + 1),
        (4, 5 + big + 1 + 5),
    ]
    assert lines[0][0] == b"\xff\xfeok"
    assert lines[1][0] == b"a" * big
    assert lines[2][0] == b"tail"
    assert reader.exit_code == 0
    assert journal_bytes(handle.paths).endswith(b"\ntail\n" + sentinel(handle, 0))


def test_reads_resume_from_any_offset_with_absolute_positions(sandbox: Sandbox) -> None:
    handle = spawn_journaled(sandbox, RUN, "for i in 1 2 3 4; do echo line$i; done")
    full, _ = read_all(sandbox, handle)
    assert [end for _, end in full] == [6, 12, 18, 24]
    for strategy in ("follow", "poll"):
        resumed, reader = read_all(sandbox, handle, from_byte=12, strategy=strategy)
        assert resumed == full[2:]
        assert reader.exit_code == 0


def test_follow_delivers_each_line_before_the_next_is_written(sandbox: Sandbox) -> None:
    workspace = Path(sandbox.ref.workspace)
    script = "for i in 1 2 3; do echo $i; while [ ! -e go$i ]; do sleep 0.02; done; done"
    handle = spawn_journaled(sandbox, RUN, script)
    seen = []
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
    for line, _ in reader:  # each line unblocks the next: a buffering reader would hang
        seen.append(line)
        (workspace / f"go{line.decode()}").touch()
    assert seen == [b"1", b"2", b"3"]
    assert reader.exit_code == 0


def _tails_of(journal: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        following = "-F" in cmdline or any("tail -c +" in part for part in cmdline)
        if following and any(journal in part for part in cmdline):
            found.append(proc)
    return found


def test_stop_signal_ends_a_follow_and_kills_its_tail(sandbox: Sandbox) -> None:
    handle = spawn_journaled(sandbox, RUN, "echo first; sleep 30")
    stop = StopSignal()
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce, stop=stop)
    seen = []
    for line, _ in reader:
        seen.append(line)
        threading.Thread(target=stop.set).start()  # stopped from another thread
    stop.close()
    assert seen == [b"first"]
    assert reader.exit_code is None
    assert [p for p in _tails_of(handle.paths.journal) if p.is_running()] == []


def test_kill_ends_the_sandbox_side_process(sandbox: Sandbox) -> None:
    heartbeat = Path(sandbox.ref.root) / "hb"
    proc = sandbox.spawn(["/bin/sh", "-c", f"while :; do echo x >> {heartbeat}; sleep 0.02; done"])
    while not heartbeat.exists() or heartbeat.stat().st_size < 10:
        time.sleep(0.02)
    proc.kill()
    time.sleep(0.2)  # let any in-flight write land
    size = heartbeat.stat().st_size
    time.sleep(0.5)
    assert heartbeat.stat().st_size == size


def test_an_agent_process_never_reuses_a_journal(sandbox: Sandbox) -> None:
    first = spawn_journaled(sandbox, RUN, "echo a")
    read_all(sandbox, first)
    with pytest.raises(JournalExistsError):
        spawn_journaled(sandbox, RUN, "echo b", process=1)
    second = spawn_journaled(sandbox, RUN, "echo b")
    assert second.paths.process == 2
    assert second.journal_key != first.journal_key
    lines, _ = read_all(sandbox, second)
    assert lines == [(b"b", 2)]
    assert [p.process for p in list_journals(sandbox, RUN)] == [1, 2]
    assert latest_journal(sandbox, RUN) == second.paths
    assert journal_bytes(first.paths) == b"a\n" + sentinel(first, 0)


def test_shell_hostile_run_id_round_trips(sandbox: Sandbox) -> None:
    canary = Path(sandbox.ref.workspace) / "canary"
    run_id = f"a/../b c;$(touch {canary});`touch {canary}`\n'\"x" + "y" * 300
    handle = spawn_journaled(sandbox, run_id, "echo hello", prompt=b"in")
    lines, reader = read_all(sandbox, handle)
    assert lines == [(b"hello", 6)]
    assert reader.exit_code == 0
    assert Path(handle.paths.journal).parent == Path(sandbox.ref.journal_dir)
    assert latest_journal(sandbox, run_id) is None  # a truncated name is never claimed
    short = "x/../;$(touch canary) '\"\n"
    handle2 = spawn_journaled(sandbox, short, "cat", prompt=b"fed\n")
    lines, _ = read_all(sandbox, handle2)
    assert lines == [(b"fed", 4)]
    assert latest_journal(sandbox, short) == handle2.paths
    names = sorted(p.name for p in Path(sandbox.ref.journal_dir).iterdir())
    assert {parse_journal_name(n).run_id for n in names} >= {short}
    assert not canary.exists()


def agent_home(sandbox: Sandbox) -> str:
    """A jailed agent's home is the jail's /workspace (bwrap; ssh where the host has bwrap)."""
    return WORKSPACE if sandbox.capabilities.network_isolation else sandbox.ref.workspace


def test_agent_environment_is_minimal(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "worker-secret-value"  # noqa: S105 - a marker, not a credential
    monkeypatch.setenv("TURNKEEPER_SECRET", secret)
    monkeypatch.setenv("TURNKEEPER_DATABASE_URL", "postgresql://leak")
    handle = spawn_journaled(sandbox, RUN, "env | sort")
    lines, _ = read_all(sandbox, handle)
    names = sorted(line.split(b"=", 1)[0].decode() for line, _ in lines)
    assert names == ["HOME", "LANG", "PATH", "PWD", "TERM"]
    assert all(secret.encode() not in line for line, _ in lines)
    home = agent_home(sandbox).encode()
    assert (b"HOME=" + home, 6 + len(home)) in lines


def test_the_spec_env_reaches_only_the_agent_and_never_an_argv(sandbox: Sandbox) -> None:
    """Values with quotes and newlines arrive byte-exact; no process of the sandbox's host
    (writer, helpers, the jail's own bwrap) holds them on its command line."""
    value = "s3cr3t 'quoted' \"double\" $HOME `x`\nsecond line"
    workspace = Path(sandbox.ref.workspace)
    command = AgentCommand(
        ("/bin/sh", "-c", 'printf "%s" "$TOKEN" > token; while [ ! -e go ]; do sleep 0.02; done'),
        env={"TOKEN": value, "EMPTY": ""},
    )
    handle = spawn_journaled(sandbox, RUN, command)
    while not (workspace / "token").exists():
        time.sleep(0.02)
    argvs = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    (workspace / "go").touch()
    _, reader = read_all(sandbox, handle)
    assert reader.exit_code == 0
    assert (workspace / "token").read_text() == value
    assert [a for a in argvs if "s3cr3t" in a] == []
    assert not Path(handle.paths.env_file).exists()  # deleted before the agent started


def test_stall_on_a_run_that_never_existed(sandbox: Sandbox) -> None:
    paths = JournalPaths(sandbox.ref.journal_dir, "never-existed", 1)
    with pytest.raises(JournalStalledError) as caught:
        list(JournalReader(sandbox, paths, nonce=new_nonce(), first_byte_timeout=0.5))
    assert caught.value.reason == "journal-stalled"
    assert caught.value.run_id == "never-existed"
    assert not Path(paths.journal).exists()  # the follow never creates the journal


def test_a_silent_but_running_agent_is_not_stalled(sandbox: Sandbox) -> None:
    """Past the first-byte bound, a writer that holds its lock is waited for: a slow
    start must never be mistaken for a dead agent (and started a second time)."""
    handle = spawn_journaled(sandbox, RUN, "sleep 2; echo late")
    while sandbox.exec(liveness_argv(handle.paths), timeout=30).exit_code != LIVENESS_ALIVE:
        time.sleep(0.02)  # the detached writer took its lock: the agent runs, silently
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce, first_byte_timeout=0.3)
    assert [line for line, _ in reader] == [b"late"]
    assert reader.exit_code == 0


def test_agent_killed_without_sentinel_is_vanished(sandbox: Sandbox) -> None:
    handle = spawn_journaled(sandbox, RUN, "echo one; sleep 60")
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce, liveness_interval=0.2)
    seen = []
    lines = iter(reader)
    seen.append(next(lines)[0])
    assert sandbox.exec(liveness_argv(handle.paths), timeout=30).exit_code == LIVENESS_ALIVE
    _kill_recorded_groups(sandbox)  # the OOM killer takes writer and agent
    with pytest.raises(AgentVanishedError) as caught:
        next(lines)
    assert seen == [b"one"]
    assert caught.value.reason == "agent-vanished"
    assert journal_bytes(handle.paths) == b"one\n"


class _ProbeCounter:
    """The sandbox itself, counting the reader's liveness probes of one journal."""

    def __init__(self, sandbox: Sandbox, paths: JournalPaths) -> None:
        self._sandbox = sandbox
        self._probe = liveness_argv(paths)
        self.probes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._sandbox, name)

    def exec(self, argv: list[str], **options: object) -> object:
        self.probes += argv == self._probe
        return self._sandbox.exec(argv, **options)  # type: ignore[arg-type]


def test_an_idle_live_writer_is_probed_less_and_less(sandbox: Sandbox) -> None:
    """Each probe is a process in the sandbox: three silent seconds at a 0.1 s base
    cost a handful of them (0.1, 0.3, 0.7, 1.5, 3.1 s), not one per idle tick."""
    handle = spawn_journaled(sandbox, RUN, "echo one; sleep 3; echo two")
    counter = _ProbeCounter(sandbox, handle.paths)
    reader = JournalReader(
        cast("Sandbox", counter), handle.paths, nonce=handle.nonce, liveness_interval=0.1
    )
    assert [line for line, _ in reader] == [b"one", b"two"]
    assert reader.exit_code == 0
    assert 1 <= counter.probes <= 6


def _kill_recorded_groups(sandbox: Sandbox) -> None:
    procs = Path(sandbox.ref.root, "procs").read_text().split()
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)


def test_journal_size_limit(provider: SandboxProvider) -> None:
    ref = provider.create(RUN, SandboxSpec(journal_max_bytes=4096))
    sandbox = provider.resume(ref)
    assert sandbox is not None
    try:
        handle = spawn_journaled(sandbox, RUN, "while :; do echo 0123456789abcdef; done")
        lines, reader = read_all(sandbox, handle, max_bytes=4096)
        # The writer's side of the pipe stops at the limit; the agent then gets SIGPIPE.
        code = 128 + signal.SIGPIPE
        assert reader.exit_code == code
        data = journal_bytes(handle.paths)
        assert data.endswith(b"\n" + sentinel(handle, code))
        assert len(data) == 4096 + 1 + len(sentinel(handle, code))
        assert [line for line, _ in lines] == [b"0123456789abcdef"] * 240 + [
            b"0123456789abcdef"[:16]
        ]
    finally:
        provider.destroy(ref)


def test_destroy_kills_detached_agents_and_is_idempotent(provider: SandboxProvider) -> None:
    ref = provider.create(RUN, SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    handle = spawn_journaled(sandbox, RUN, "echo up; sleep 60")
    while Path(handle.paths.journal).stat().st_size == 0:
        time.sleep(0.02)
    pids = [int(p) for p in Path(ref.root, "procs").read_text().split()]
    provider.destroy(ref)
    provider.destroy(ref)
    assert provider.resume(ref) is None
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for _ in range(500):  # hang guard: SIGKILL is delivered asynchronously
                if proc.status() == psutil.STATUS_ZOMBIE:
                    break
                time.sleep(0.02)
            assert proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            continue


WORKER = Path(__file__).with_name("worker_process.py")


def test_worker_sigkill_leaves_the_agent_running(
    provider: SandboxProvider, request: pytest.FixtureRequest
) -> None:
    ref = provider.create(RUN, SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    target = request.getfixturevalue("ssh_target") if ref.provider == "ssh" else None
    control_dir = Path(tempfile.mkdtemp(prefix="tk-w-"))  # short: a socket path limit
    config = {
        "ref": ref.to_dict(),
        "root": str(Path(ref.root).parent),
        "uids": list(TEST_UIDS),
        "ssh": None
        if target is None
        else {
            "host": target.host, "port": target.port, "user": target.user, "root": target.root,
            "identity_file": str(target.identity_file), "control_dir": str(control_dir),
        },
        "command": "echo started; while [ ! -e go ]; do sleep 0.02; done; echo finished",
    }  # fmt: skip
    if target is not None:  # the killed worker's ssh master connection is ended here
        request.addfinalizer(SshProvider(replace(target, control_dir=control_dir)).close)
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(config)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert worker.stdout is not None
        output = [worker.stdout.readline()]
        while not output[-1].startswith(b"spawned ") and output[-1]:  # structlog comes first
            output.append(worker.stdout.readline())
        assert output[-1].startswith(b"spawned "), output
        nonce = output[-1].split()[1].decode()
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
    (Path(ref.workspace) / "go").touch()
    handle = JournalHandle(ref, JournalPaths(ref.journal_dir, RUN, 1), nonce)
    lines, reader = read_all(sandbox, handle)
    assert lines == [(b"started", 8), (b"finished", 17)]
    assert reader.exit_code == 0
    assert journal_bytes(handle.paths) == b"started\nfinished\n" + sentinel(handle, 0)
    provider.destroy(ref)


class _KilledBeforeStartError(Exception):
    """Stands for the worker's death between the journal's creation and the writer's start."""


def _killed() -> None:
    raise _KilledBeforeStartError


def test_a_writer_launched_after_never_started_exits_before_the_agent(sandbox: Sandbox) -> None:
    """A frozen predecessor launches its writer after the successor found the journal
    never started: the writer takes the lock, finds no nonce, and never runs the agent."""
    command = AgentCommand(("/bin/sh", "-c", "echo ran >> ran.txt; echo the agent ran"))
    with pytest.raises(_KilledBeforeStartError):
        spawn_journaled(sandbox, RUN, command, after_prepare=_killed)
    paths = JournalPaths(sandbox.ref.journal_dir, RUN, 1)
    assert sandbox.exec(liveness_argv(paths)).exit_code == LIVENESS_NOT_STARTED
    assert never_started(sandbox, paths) is True
    late = sandbox.launch(paths, command)
    sandbox.start_detached(writer_argv(paths, late.code, after_exit=late.after_exit))
    while sandbox.exec(liveness_argv(paths)).exit_code != LIVENESS_FREE:  # it ran, then ended
        time.sleep(0.05)
    assert journal_bytes(paths) == b""
    assert not (Path(sandbox.ref.workspace) / "ran.txt").exists()
    assert never_started(sandbox, paths) is False  # its lock file is there now


def test_a_nonce_the_disarm_cannot_remove_is_no_never_started(sandbox: Sandbox) -> None:
    """The disarm's ``rm`` fails and the nonce file stays: a writer that has not started
    yet can still read it and run the agent, so the journal is not found never started,
    however missing its lock file is. Once the file can go, the disarm says so."""
    command = AgentCommand(("/bin/sh", "-c", "echo ran >> ran.txt; echo the agent ran"))
    nonce = new_nonce()
    with pytest.raises(_KilledBeforeStartError):
        spawn_journaled(sandbox, RUN, command, nonce=nonce, after_prepare=_killed)
    paths = JournalPaths(sandbox.ref.journal_dir, RUN, 1)
    with unremovable(Path(paths.nonce_file)):
        assert disarm(sandbox, paths) is False
        assert never_started(sandbox, paths) is False
    assert sandbox.exec(liveness_argv(paths)).exit_code == LIVENESS_NOT_STARTED
    # The writer a frozen predecessor launches now finds its nonce: the agent runs.
    late = sandbox.launch(paths, command)
    sandbox.start_detached(writer_argv(paths, late.code, after_exit=late.after_exit))
    # The writer makes its lock file before it takes the lock: a free lock means done
    # only once the writer has taken its nonce, which it does holding the lock.
    while (
        Path(paths.nonce_file).exists()
        or sandbox.exec(liveness_argv(paths)).exit_code != LIVENESS_FREE
    ):
        time.sleep(0.05)
    handle = JournalHandle(sandbox.ref, paths, nonce)
    assert journal_bytes(paths) == b"the agent ran\n" + sentinel(handle, 0)
    assert (Path(sandbox.ref.workspace) / "ran.txt").read_bytes() == b"ran\n"
    assert not Path(paths.nonce_file).exists()
    assert disarm(sandbox, paths) is True  # nothing left to remove: disarmed


def test_never_started_leaves_a_running_writer_alone(sandbox: Sandbox) -> None:
    # The agent waits for a gate the test opens: the probe sees it running however slow
    # the transport is (it cannot end before the first probe).
    handle = spawn_journaled(
        sandbox, RUN, "while [ ! -e gate ]; do sleep 0.02; done; echo still here"
    )
    while sandbox.exec(liveness_argv(handle.paths)).exit_code != LIVENESS_ALIVE:
        time.sleep(0.02)
    assert never_started(sandbox, handle.paths) is False
    (Path(sandbox.ref.workspace) / "gate").touch()
    lines, _ = read_all(sandbox, handle)
    assert [line for line, _ in lines] == [b"still here"]
    assert journal_bytes(handle.paths) == b"still here\n" + sentinel(handle, 0)
