"""An agent's stderr and error message are stored whatever bytes it wrote: a NUL (which
Postgres text and jsonb cannot hold) is stored as ␀ and bytes that are no UTF-8 as �, and
the run keeps its reason, exit code, stderr tail and the limits it hit. An agent that
could make its own failure unstorable could hide it (a memory limit, say) behind a
``not-json`` one."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tests.driver.fleet import Fleet
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.store.records import RunStatus

# NULs, a byte that is never UTF-8 (0xff) and a cut sequence (0xe2 0x82 then a space).
STDERR = r"printf 'bad\0news \377 cut \342\202 end\0\n' >&2"
STORED_STDERR = "bad␀news \ufffd cut \ufffd end␀\n"


def text_agent(script: str) -> dict[str, object]:
    return {"command": ["/bin/sh", "-c", script], "format": "text"}


def test_nul_and_invalid_utf8_on_stderr_keep_the_agents_failure(fleet: Fleet) -> None:
    fleet.start_worker()
    exited = fleet.client.submit(text_agent(f"echo working; {STDERR}; exit 3"), "p")
    reported = {"type": "RUN_ERROR", "message": "it broke\u0000 here"}
    agui = fleet.client.submit(
        {
            "command": [
                "/bin/sh",
                "-c",
                f"{STDERR}; printf '%s\\n' {shlex.quote(json.dumps(reported))}",
            ],
            "format": "agui",
        },
        "p",
    )

    done = fleet.wait_settled(exited.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error == {
        "reason": "agent-exit",
        "message": "the agent exited with code 3",
        "exit_code": 3,
        "stderr": STORED_STDERR,
    }
    assert fleet.log_of(done.run_id)[-1][1] == lifecycle.run_error(
        "the agent exited with code 3", "agent-exit"
    )

    done = fleet.wait_settled(agui.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error == {
        "reason": "agent-error",
        "message": "it broke␀ here",
        "exit_code": 0,
        "stderr": STORED_STDERR,
    }
    # The log's last chunk says what Postgres holds, so that one rebuilt from the run
    # (lifecycle.final_chunk) is the same chunk.
    assert fleet.log_of(done.run_id)[-1][1] == lifecycle.run_error("it broke␀ here", "agent-error")
    assert lifecycle.final_chunk(done) == fleet.log_of(done.run_id)[-1][1]


def test_nul_on_stderr_never_hides_a_memory_limit(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", sandbox_memory=64 * 1024 * 1024)
    try:
        fleet.start_worker()
        hog = f"echo start; {STDERR}; exec python3 -c 'x = b\"m\" * (512 * 1024 * 1024)'"
        run = fleet.client.submit(text_agent(hog), "p")
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.FAILED
        assert done.error == {
            "reason": "memory-limit",
            "message": "the agent passed its memory limit and was killed",
            "exit_code": 137,
            "stderr": STORED_STDERR,
            "limits": {"memory_kills": 1, "pid_limit_hits": 0},
        }
        assert fleet.log_of(run.run_id)[-1][1] == lifecycle.run_error(
            "the agent passed its memory limit and was killed", "memory-limit"
        )
    finally:
        fleet.stop()
