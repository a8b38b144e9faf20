"""`turnkeeper demo` on the embedded default: a worker killed mid-run, every check passing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest


@pytest.mark.slow
def test_demo_kills_a_worker_and_every_check_passes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(TURNKEEPER_DATA_DIR=str(tmp_path / "data"), TURNKEEPER_WEB_PORT="0", COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "-m", "turnkeeper", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,  # a hang guard
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr[-4000:]}"
    killed = r"✗ SIGKILL worker process group \d+ \(owner .+:\d+:[0-9a-f]+, epoch 1\)"
    assert re.search(killed, out), out
    assert re.search(
        r"⟳ takeover: epoch 1 → 2 \d+ ms after the kill \(cause crash, lease 30s\)", out
    ), out
    delivered = re.search(r"ok   chunks delivered\s+(\d+)", out)
    assert delivered is not None, out
    assert int(delivered.group(1)) > 40
    for line in (
        r"ok   duplicates\s+0$",
        r"ok   gaps\s+0$",
        r"ok   same as the stored log\s+yes$",
        r"ok   takeover\s+epoch 1 → 2$",
        r"ok   run status\s+completed$",
        r"dashboard\s+http://127\.0\.0\.1:\d+/$",
    ):
        assert re.search(line, out, re.MULTILINE), (line, out)
    assert "FAIL" not in out
    # Everything it started is gone: no process still runs from its data directory.
    data = str(tmp_path / "data")
    leftovers = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            started_here = proc.environ().get("TURNKEEPER_DATA_DIR", "").startswith(data)
            if started_here or data in " ".join(proc.info["cmdline"] or []):
                leftovers.append(proc.info)
        except psutil.Error:
            continue
    assert leftovers == []
