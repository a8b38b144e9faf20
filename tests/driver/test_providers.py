"""What a worker lets a run choose of its sandbox, and what a run's error says of limits."""

from __future__ import annotations

from pathlib import Path

from tests.driver.fleet import Fleet
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus

TEXT = {"command": ["/bin/sh", "-c", "echo ok"], "format": "text"}


def test_a_run_never_leaves_the_jail_the_worker_was_given(fleet: Fleet) -> None:
    fleet.start_worker()
    weaker = fleet.client.submit(TEXT, "p", provider="local")
    same = fleet.client.submit(TEXT, "p", provider="bwrap")
    default = fleet.client.submit(TEXT, "p")
    refused = fleet.wait_settled(weaker.run_id)
    assert refused.status is RunStatus.FAILED
    assert refused.error == {
        "reason": "provider-refused",
        "message": "the run asks for the 'local' sandbox, weaker than this worker's 'bwrap'",
    }
    assert refused.sandbox_ref is None  # nothing ever ran
    for run in (same, default):
        assert fleet.wait_settled(run.run_id).status is RunStatus.COMPLETED


def test_an_agent_killed_past_its_memory_limit_fails_with_that_reason(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", sandbox_memory=64 * 1024 * 1024)
    try:
        fleet.start_worker()
        hog = "echo start; exec python3 -c 'x = b\"m\" * (512 * 1024 * 1024)'"
        run = fleet.client.submit({"command": ["/bin/sh", "-c", hog], "format": "text"}, "p")
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.FAILED
        assert done.error == {
            "reason": "memory-limit",
            "message": "the agent passed its memory limit and was killed",
            "exit_code": 137,
            "stderr": "",
            "limits": {"memory_kills": 1, "pid_limit_hits": 0},
        }
        assert fleet.log_of(run.run_id)[-1][1] == {
            "type": "RUN_ERROR",
            "message": "the agent passed its memory limit and was killed",
            "code": "memory-limit",
        }
        assert all(proc.poll() is None for proc in fleet.procs)  # the worker lives on
    finally:
        fleet.stop()


def test_a_preset_with_its_permissions_off_is_named_when_it_runs_unjailed(
    settings: Settings, tmp_path: Path
) -> None:
    """claude-code turns its own permission checks off: only a jail bounds it, and the
    ``local`` provider is none, so the worker says so as it starts the agent; under
    ``bwrap`` it says nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    claude = bin_dir / "claude"  # a stand-in that reads its prompt and says one thing
    claude.write_text('#!/bin/sh\ncat >/dev/null\necho \'{"type": "unknown"}\'\n')
    claude.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    for provider in ("local", "bwrap"):
        fleet = Fleet.create(
            settings,
            tmp_path / f"logs-{provider}",
            sandbox_provider=provider,
            sandbox_ro_binds=str(bin_dir),
        )
        try:
            fleet.start_worker()
            run = fleet.client.submit("claude-code", "p", env=env)
            fleet.wait_settled(run.run_id)
            warned = fleet.events("agent.unbounded", run_id=run.run_id)
        finally:
            fleet.stop()
        assert [w["preset"] for w in warned] == (["claude-code"] if provider == "local" else [])
