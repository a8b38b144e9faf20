"""Attach preflight, the prune sweep, and bubblewrap's isolation, on real sandboxes."""

# ruff: noqa: S105 - sentinel keys in these tests are fixtures, not credentials
from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from turnkeeper.errors import JournalUnavailableError
from turnkeeper.sandbox import (
    JournalReader,
    Sandbox,
    SandboxSpec,
    StopSignal,
    await_attachable_journal,
    nonce_for,
    prune_journals,
    spawn_journaled,
)
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.codec import journal_file_name
from turnkeeper.sandbox.journal import JournalPaths

SECRET = "s"


class StatusTable:
    """A dict-backed run-status lookup (the store's seam), counting its calls."""

    def __init__(self, statuses: dict[str, str] | None = None, *, broken: bool = False) -> None:
        self.statuses = statuses or {}
        self.broken = broken
        self.calls: list[str] = []

    def run_status(self, run_id: str) -> str | None:
        self.calls.append(run_id)
        if self.broken:
            raise RuntimeError("store down")
        return self.statuses.get(run_id)


def test_existing_journal_returns_without_asking_the_store(local_sandbox: Sandbox) -> None:
    handle = spawn_journaled(local_sandbox, "r", "echo hi", secret=SECRET)
    lookup = StatusTable(broken=True)
    assert await_attachable_journal(local_sandbox, "r", lookup=lookup) == handle.paths
    assert lookup.calls == []


@pytest.mark.parametrize(
    ("status", "reason"),
    [(None, "unknown-run"), ("completed", "terminal-run"), ("failed", "terminal-run"),
     ("aborted", "terminal-run")],
)  # fmt: skip
def test_unknown_and_terminal_runs_fail_without_waiting(
    local_sandbox: Sandbox, status: str | None, reason: str
) -> None:
    lookup = StatusTable({"r": status} if status else {})
    with pytest.raises(JournalUnavailableError) as caught:
        # A wait this long would trip the suite's timeout if it were ever waited out.
        await_attachable_journal(local_sandbox, "r", lookup=lookup, wait=3600)
    assert caught.value.reason == reason
    assert lookup.calls == ["r"]


def test_a_late_journal_of_a_running_run_is_waited_for(local_sandbox: Sandbox) -> None:
    lookup = StatusTable({"r": "running"})
    timer = threading.Timer(
        0.3, spawn_journaled, (local_sandbox, "r", "echo late"), {"secret": SECRET}
    )
    timer.start()
    paths = await_attachable_journal(local_sandbox, "r", lookup=lookup, wait=3600)
    timer.join()
    assert paths == JournalPaths(local_sandbox.ref.journal_dir, "r", 1)
    assert len(lookup.calls) >= 2
    lines = list(
        JournalReader(local_sandbox, paths, nonce=nonce_for(local_sandbox.ref, "r", SECRET))
    )
    assert lines == [(b"late", 5)]


@pytest.mark.parametrize("lookup", [StatusTable({"r": "running"}), StatusTable(broken=True), None])
def test_bounded_wait_then_journal_timeout(
    local_sandbox: Sandbox, lookup: StatusTable | None
) -> None:
    with pytest.raises(JournalUnavailableError) as caught:
        await_attachable_journal(local_sandbox, "r", lookup=lookup, wait=0.3)
    assert caught.value.reason == "journal-timeout"


def test_stop_during_the_wait_returns_none(local_sandbox: Sandbox) -> None:
    with StopSignal() as stop:
        threading.Timer(0.2, stop.set).start()
        assert (
            await_attachable_journal(
                local_sandbox, "r", lookup=StatusTable({"r": "queued"}), wait=3600, stop=stop
            )
            is None
        )


def _touch(sandbox: Sandbox, run_id: str, ext: str, *, age: float, process: int = 1) -> str:
    name = journal_file_name(run_id, process, ext)
    path = Path(sandbox.ref.journal_dir, name)
    path.write_bytes(b"x\n")
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return name


def test_prune_sweep_fails_closed(local_sandbox: Sandbox) -> None:
    names = {
        "done": [_touch(local_sandbox, "done", e, age=10) for e in ("ndjson", "err", "lock")],
        "failed": [_touch(local_sandbox, "failed", "ndjson", age=10)],
        "live": [_touch(local_sandbox, "live", "ndjson", age=7200)],
        "queued": [_touch(local_sandbox, "queued", "ndjson", age=7200)],
        "old-orphan": [_touch(local_sandbox, "old-orphan", e, age=7200) for e in ("ndjson", "err")],
        "mixed-orphan": [
            _touch(local_sandbox, "mixed-orphan", "ndjson", age=7200),
            _touch(local_sandbox, "mixed-orphan", "ndjson", age=60, process=2),
        ],
        "new-orphan": [_touch(local_sandbox, "new-orphan", "ndjson", age=60)],
        ".dot": [_touch(local_sandbox, ".dot", "ndjson", age=7200)],
    }
    for junk in ("notes.txt", "a_zz.1.ndjson", "x" * 190 + "-0123456789abcdef.1.ndjson"):
        Path(local_sandbox.ref.journal_dir, junk).write_text("keep me")
    lookup = StatusTable(
        {"done": "completed", "failed": "failed", "live": "running", "queued": "queued"}
    )
    result = prune_journals(local_sandbox, lookup, orphan_ttl=3600)
    assert result.listed
    assert result.age_gate == "listed"
    assert sorted(result.deleted_runs) == [".dot", "done", "failed", "old-orphan"]
    assert sorted(result.deleted) == sorted(
        names["done"] + names["failed"] + names["old-orphan"] + names[".dot"]
    )
    reasons = {(k.run_id, k.reason) for k in result.kept}
    assert reasons == {
        ("live", "non-terminal"), ("queued", "non-terminal"), ("mixed-orphan", "orphan-too-recent"),
        ("new-orphan", "orphan-too-recent"), (None, "malformed"), (None, "truncated"),
    }  # fmt: skip
    remaining = sorted(p.name for p in Path(local_sandbox.ref.journal_dir).iterdir())
    assert remaining == sorted(
        names["live"] + names["queued"] + names["mixed-orphan"] + names["new-orphan"]
        + ["notes.txt", "a_zz.1.ndjson", "x" * 190 + "-0123456789abcdef.1.ndjson"]
    )  # fmt: skip
    again = prune_journals(local_sandbox, lookup, orphan_ttl=3600)
    assert again.deleted == []
    assert again.failures == []


def test_prune_keeps_everything_when_the_store_fails_and_caps_deletions(
    local_sandbox: Sandbox,
) -> None:
    for i in range(5):
        _touch(local_sandbox, f"run{i}", "ndjson", age=10)
    broken = prune_journals(local_sandbox, StatusTable(broken=True))
    assert broken.deleted == []
    assert {k.reason for k in broken.kept} == {"store-error"}
    assert [f[0] for f in broken.failures] == ["store"] * 5
    capped = prune_journals(
        local_sandbox, StatusTable({f"run{i}": "completed" for i in range(5)}), max_deletes=2
    )
    assert len(capped.deleted_runs) == 2
    assert [k.reason for k in capped.kept] == ["max-deletes"] * 3


def test_prune_of_an_empty_or_missing_directory(local_sandbox: Sandbox) -> None:
    empty = prune_journals(local_sandbox, StatusTable())
    assert (empty.listed, empty.age_gate, empty.deleted, empty.kept) == (True, "listed", [], [])
    shutil.rmtree(local_sandbox.ref.journal_dir)
    missing = prune_journals(local_sandbox, StatusTable())
    assert (missing.listed, missing.deleted, missing.failures) == (True, [], [])


@pytest.fixture
def bwrap_provider(tmp_path: Path) -> BwrapProvider:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    return BwrapProvider(tmp_path / "sandboxes")


@pytest.mark.parametrize("network", [False, True])
def test_bwrap_isolation(bwrap_provider: BwrapProvider, network: bool) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ref = bwrap_provider.create("r", SandboxSpec(network=network))
        sandbox = bwrap_provider.resume(ref)
        assert sandbox is not None
        try:
            probe = (
                "touch /usr/turnkeeper-probe 2>/dev/null && echo root-writable; "
                "echo jailed > /tmp/private && cat /tmp/private; "
                f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo net || echo no-net; "
                "echo $$ > pid; touch ok"
            )
            result = sandbox.exec(["bash", "-c", probe])
            expected = b"jailed\nnet\n" if network else b"jailed\nno-net\n"
            assert result.stdout == expected
            assert Path(ref.workspace, "ok").exists()
            assert not Path("/usr/turnkeeper-probe").exists()
            assert int(Path(ref.workspace, "pid").read_text()) < 10  # its own PID namespace
        finally:
            bwrap_provider.destroy(ref)
