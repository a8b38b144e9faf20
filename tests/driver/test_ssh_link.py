"""The ssh link to a run's sandbox host drops mid-run: the run rides it out.

A real ``sshd`` on loopback holds the sandboxes; a worker with the ssh provider
runs the agent there. Mid-run the sshd is stopped, every connection it holds
included, for 2.5 leases, then started again on the same port. The run completes
with exactly its oracle's output, in its first attempt.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_adoption import AGENT, PROMPT, assert_log_is_oracle, attempts
from tests.sshd import Sshd, sshd_unavailable
from turnkeeper.config import Settings
from turnkeeper.errors import SandboxUnreachableError
from turnkeeper.sandbox.provider import SandboxSpec
from turnkeeper.sandbox.ssh import SshProvider
from turnkeeper.store.records import RunStatus


@pytest.fixture
def sshd(tmp_path: Path) -> Sshd:
    unavailable = sshd_unavailable()
    if unavailable is not None:
        pytest.skip(unavailable)
    return Sshd(tmp_path / "sshd")


# A lease of 4 s renewed every 0.5 s: a heartbeat starved for a few seconds on a
# loaded machine does not lose it, and the cut still outlasts it well.
LEASE_TTL = 4.0
CUT_SECONDS = 2.5 * LEASE_TTL


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
