"""The soak of CI: two minutes of ``bench/soak.py`` (workers SIGKILLed and SIGSTOPped,
the log's Redis restarted empty, Postgres connections terminated, the ssh link cut)
while runs stream through a real fleet; then every run's log against its oracle.

The soak runs as its own process, as an operator runs it, on this session's
servers (the embedded ones when none are configured); its JSON report is the
verdict, and the minimum counts below make sure the chaos really happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
MINUTES = 2
LEAST = {
    "worker-sigkill": 3,
    "worker-sigstop": 10,
    "worker-zombie (stopped past the lease)": 3,
    "log-redis-restart": 1,
    "postgres-terminate": 4,
}
LEAST_WITH_SSH = {"ssh-cut": 1}


@pytest.mark.soak
@pytest.mark.fleet  # bench/soak.py starts its own
@pytest.mark.timeout(1800)
def test_a_two_minute_soak_loses_nothing(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    done = subprocess.run(
        [
            *(sys.executable, str(SOAK), "--minutes", str(MINUTES)),
            *("--json", str(report_path), "--workdir-parent", str(tmp_path)),
        ],
        cwd=SOAK.parent,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=False,
    )
    assert report_path.exists(), done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    summary = done.stdout[-20000:]
    assert report["runs_never_settled"] == [], summary
    assert report["failed"] == [], summary
    assert report["mismatched"] == [], summary
    assert (report["chunks_lost"], report["chunks_doubled"]) == (0, 0), summary
    assert report["runs_with_seq_gaps"] == [], summary
    assert report["max_attempts_used"] < report["max_attempts"], summary
    assert done.returncode == 0, summary
    # and the chaos really happened, to runs that really ran
    least = {**LEAST, **(LEAST_WITH_SSH if report["ssh"] else {})}
    counts = {kind: report["events"].get(kind, 0) for kind in least}
    assert {kind: n for kind, n in counts.items() if n < least[kind]} == {}, summary
    assert report["runs_completed"] >= 3, summary
