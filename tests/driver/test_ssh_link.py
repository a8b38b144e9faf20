"""The ssh link to a run's sandbox host drops mid-run: the run rides it out.

A real ``sshd`` on loopback holds the sandboxes; a worker with the ssh provider
runs the agent there. Mid-run the sshd is stopped, every connection it holds
included, for 2.5 leases, then started again on the same port. The run completes
with exactly its oracle's output, in its first attempt. A cut in the middle of a
line over the cap resumes the follow mid-line, and the rest of the line is still
that line's last piece (docs/architecture.md, "Long lines").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_adoption import AGENT, PROMPT, assert_log_is_oracle, attempts
from tests.driver.test_log_loss import lose_logs
from tests.sshd import Sshd, sshd_unavailable
from tests.unavailable import cannot_run
from turnkeeper.agents.formats import translator_for
from turnkeeper.agents.translator import UNPARSED
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.placement import Placement
from turnkeeper.errors import SandboxUnreachableError
from turnkeeper.sandbox.provider import SandboxSpec
from turnkeeper.sandbox.ssh import SshProvider
from turnkeeper.store.records import RunStatus


@pytest.fixture
def sshd(tmp_path: Path) -> Sshd:
    cannot_run(sshd_unavailable())
    return Sshd(tmp_path / "sshd")


# A lease of 4 s renewed every 0.5 s: a heartbeat starved for a few seconds on a
# loaded machine does not lose it, and the cut still outlasts it well.
LEASE_TTL = 4.0
CUT_SECONDS = 2.5 * LEASE_TTL


@pytest.mark.slow
def test_the_ssh_link_dropped_for_longer_than_the_lease_mid_run(
    settings: Settings, sshd: Sshd, database_url: str, tmp_path: Path
) -> None:
    sshd.start()
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        sandbox_provider="ssh",
        lease_ttl=LEASE_TTL,
        **sshd.settings(),  # as the test sshd's only account, root
    )
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(AGENT, PROMPT)
        fleet.wait_chunks(run.run_id, 6)
        assert sshd.cut(with_commands=True) >= 1, "the worker's connections were cut"
        time.sleep(CUT_SECONDS)
        sshd.start()
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        # No takeover: the lease was renewed all along, the link was retried.
        assert (done.epoch, done.attempt_count) == (1, 1)
        assert attempts(database_url, run.run_id) == [(1, "completed")]
        assert fleet.events("journal.link_lost", run_id=run.run_id), "the follow saw the cut"
        assert_log_is_oracle(fleet, done, AGENT, tmp_path / "oracle")
    finally:
        fleet.stop()
        sshd.stop()


def test_ssh_tells_a_dropped_link_from_the_remote_commands_answers(
    sshd: Sshd, tmp_path: Path
) -> None:
    """Exit 255 is ssh's own (the link); every other status is the command's answer,
    a command's own 255 included (reported as 254); a gone sandbox is None."""
    sshd.start()
    target = sshd.target(control_dir=tmp_path / "control")
    (tmp_path / "control").mkdir()
    provider = SshProvider(target)
    try:
        ref = provider.create("link-run", SandboxSpec())
        sandbox = provider.resume(ref)
        assert sandbox is not None
        answers = [
            sandbox.exec(["/bin/sh", "-c", f"exit {code}"]).exit_code for code in (0, 3, 255)
        ]
        assert answers == [0, 3, 254]
        sshd.cut(with_commands=True)
        with pytest.raises(SandboxUnreachableError) as unreachable:
            sandbox.exec(["true"])
        assert unreachable.value.reason == "ssh-unreachable"
        with pytest.raises(SandboxUnreachableError):
            provider.resume(ref)  # out of reach is not gone
        sshd.start()
        assert sandbox.exec(["/bin/sh", "-c", "exit 7"]).exit_code == 7
        provider.destroy(ref)
        assert provider.resume(ref) is None  # gone: the answer a run may fail on
    finally:
        provider.close()
        sshd.stop()


CAP = 1 << 20
# A claude-code agent (stream-json, so its lines are parsed as JSON): a session line and
# a message, then a line of exactly 5 MiB whose text has a euro sign across its fourth
# cut (one byte in piece 3, two in piece 4), a line of 1.5 MiB with one across its first
# cut, a message, and the result. It stops twice, each time until a file of that name is
# in its workspace: 17 bytes into the fifth piece of the long line (so the fourth piece
# has been handed out), and before the result.
LONG_LINE_AGENT = f"""
import json, os, sys, time
CAP = {CAP}
out = sys.stdout.buffer

def message(ident, text):
    event = {{"type": "assistant", "message": {{"id": ident, "type": "message",
        "role": "assistant", "content": [{{"type": "text", "text": text}}]}}}}
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()

def sized(ident, size, euro_at):
    # A message line of exactly size bytes whose euro sign starts at byte euro_at.
    head = message(ident, "@").index(b"@")
    rest = size - len(message(ident, "")) - (euro_at - head) - 3
    return message(ident, "x" * (euro_at - head) + "\\N{{EURO SIGN}}" + "y" * rest)

def wait(name):
    while os.environ.get("WAIT") == "1" and not os.path.exists(name):
        time.sleep(0.05)

init = {{"type": "system", "subtype": "init", "session_id": "sess-long", "model": "m"}}
result = {{"type": "result", "subtype": "success", "is_error": False, "result": "done"}}
long_line = sized("msg_long", 5 * CAP, 4 * CAP - 1)
held = 4 * CAP + 17
out.write(json.dumps(init).encode() + b"\\n" + message("msg_a", "Here it comes.") + b"\\n")
out.write(long_line[:held])
out.flush()
wait("release")
out.write(long_line[held:] + b"\\n" + sized("msg_next", 3 * CAP // 2, CAP - 2) + b"\\n")
out.write(message("msg_b", "That was long.") + b"\\n")
out.flush()
wait("finish")
out.write(json.dumps(result).encode() + b"\\n")
out.flush()
"""


def _long_line_agent(*, wait: bool) -> dict[str, Any]:
    return {
        "command": [sys.executable, "-c", LONG_LINE_AGENT],
        "format": "claude-code",
        "env": {"WAIT": "1" if wait else "0"},
    }


def _long_line_output(workdir: Path) -> bytes:
    """What the agent prints, run directly, without waiting."""
    workdir.mkdir(parents=True)
    return subprocess.run(
        _long_line_agent(wait=False)["command"],
        cwd=workdir,
        capture_output=True,
        check=True,
        timeout=120,
        env={"PATH": os.environ["PATH"]},
    ).stdout


def _long_line_oracle(run_id: str, session_id: str, out: bytes) -> list[Chunk]:
    """The log of an uninterrupted run whose agent printed ``out``: each line over the
    cap cut at ``[0, CAP)``, ``[CAP, 2 CAP)``, ... of its own bytes (the cut rule, without
    the splitter under test) and fed to the translator piece by piece."""
    translator = translator_for("claude-code", run_id)
    chunks: list[Chunk] = [lifecycle.run_started(run_id, session_id)]
    for line in out.splitlines():
        if len(line) <= CAP:
            chunks.extend(translator.feed(line + b"\n"))
            continue
        for offset in range(0, len(line), CAP):
            final = offset + CAP >= len(line)
            piece = line[offset : offset + CAP] + (b"\n" if final else b"")
            chunks.extend(translator.feed_piece(piece, final=final))
    chunks.extend(translator.finish())
    chunks.append(lifecycle.run_finished(run_id, session_id))
    return chunks


def _shape(chunks: list[Chunk]) -> list[tuple[Any, ...]]:
    """Each chunk with a piece's text by its length, so a mismatch prints in lines, not
    in megabytes."""
    shapes: list[tuple[Any, ...]] = []
    for chunk in chunks:
        value = chunk.get("value")
        if chunk.get("name") == UNPARSED and isinstance(value, dict):
            brief = {k: v for k, v in value.items() if k not in ("text", "base64")}
            shapes.append((chunk["type"], sorted(brief.items()), len(value["text"])))
        else:
            shapes.append((chunk["type"], chunk.get("name"), chunk.get("delta")))
    return shapes


def _assert_chunks(found: list[tuple[int, Chunk]], expected: list[Chunk]) -> None:
    assert [seq for seq, _ in found] == list(range(1, len(found) + 1))
    chunks = [chunk for _, chunk in found]
    assert _shape(chunks) == _shape(expected)
    assert chunks == expected


def test_a_link_cut_in_the_middle_of_a_long_line_resumes_the_line_where_it_was(
    settings: Settings, sshd: Sshd, tmp_path: Path
) -> None:
    """The follow resumes at the end of the line's fourth piece: what comes after is the
    line's fifth and last piece, not a line of its own (which a JSON format would call
    not-json, leaving its piece state to the next long line). The live log, the log
    rebuilt from Postgres, and a successor's replay from byte 0 all agree with an
    uninterrupted run."""
    sshd.start()
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        sandbox_provider="ssh",
        lease_ttl=LEASE_TTL,
        max_line_bytes=CAP,
        **sshd.settings(),
    )
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(_long_line_agent(wait=True), PROMPT)
        out = _long_line_output(tmp_path / "oracle")
        oracle = _long_line_oracle(run.run_id, run.session_id, out)
        unparsed = [
            (c["value"]["piece"], c["value"]["final"]) for c in oracle if c.get("name") == UNPARSED
        ]
        five = [(0, False), (1, False), (2, False), (3, False), (4, True)]
        assert unparsed == [*five, (0, False), (1, True)], "two long lines, each from piece 0"
        # RUN_STARTED, the session, a message of three chunks, then the long line's first
        # four pieces: the agent waits 17 bytes into the fifth.
        held = 9
        assert oracle[held - 1]["value"]["piece"] == 3
        fleet.wait_chunks(run.run_id, held)
        _assert_chunks(fleet.log_of(run.run_id), oracle[:held])
        owned = fleet.client.require(run.run_id)
        placement = Placement.of(owned)
        assert placement.sandbox is not None
        workspace = Path(placement.sandbox.workspace)

        assert sshd.cut(with_commands=True) >= 1, "the worker's connections were cut"
        # The follow failed and is retried: the next read starts where this one stopped.
        fleet.wait_events("sandbox.retrying", timeout=120)
        (workspace / "release").touch()
        sshd.start()
        # Everything but the result, as the resumed follow read it: the live log.
        before_result = len(oracle) - 2
        fleet.wait_chunks(run.run_id, before_result)
        _assert_chunks(fleet.log_of(run.run_id), oracle[:before_result])

        # A successor replays the journal from byte 0 and aligns it with that log.
        fleet.start_worker()
        fleet.wait_ready()
        fleet.signal_worker_of(owned, signal.SIGKILL)
        (workspace / "finish").touch()
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (2, 2)
        _assert_chunks(fleet.log_of(run.run_id), oracle)
        # The log rebuilt from Postgres (segments cut from byte 0) is the same log.
        assert lose_logs(fleet) > 0
        _assert_chunks(fleet.log_of(run.run_id), oracle)
        # The cut came where it was meant to: the follow resumed inside the long line.
        line_start = len(b"".join(out.splitlines(keepends=True)[:2]))
        resumed = fleet.events("journal.follow_resumed", run_id=run.run_id)
        assert {(r["offset"], r["line_start"]) for r in resumed} == {
            (line_start + 4 * CAP, line_start)
        }
    finally:
        fleet.stop()
        sshd.stop()
