"""`turnkeeper demo` on the embedded default: a worker killed mid-run, every check passing;
with ``--exit`` it stops at once, without it the stack and the dashboard stay up (the run
and fleet pages it prints answer, with the key it prints) until Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import psutil
import pytest

from turnkeeper.web.serve import free_port

_URL = r"http://127\.0\.0\.1:\d+"


def _demo_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(
        TURNKEEPER_DATA_DIR=str(tmp_path / "data"),
        TURNKEEPER_WEB_PORT="0",
        COLUMNS="200",
        PYTHONUNBUFFERED="1",
    )
    return env


LINKS = (
    rf"dashboard\s+{_URL}/$",
    rf"run page\s+{_URL}/ui/runs/demo-[0-9a-f-]+$",
    rf"fleet page\s+{_URL}/ui/fleet$",
)


def _check_output(out: str) -> None:
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
    ):
        assert re.search(line, out, re.MULTILINE), (line, out)
    assert "FAIL" not in out


def _leftovers(tmp_path: Path) -> list[dict[str, object]]:
    """Processes still running from the demo's data directory."""
    data = str(tmp_path / "data")
    leftovers = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            started_here = proc.environ().get("TURNKEEPER_DATA_DIR", "").startswith(data)
            if started_here or data in " ".join(proc.info["cmdline"] or []):
                leftovers.append(proc.info)
        except psutil.Error:
            continue
    return leftovers


@pytest.mark.slow
def test_demo_kills_a_worker_and_every_check_passes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnkeeper", "demo", "--exit"],
        env=_demo_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,  # a hang guard
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr[-4000:]}"
    _check_output(out)
    # Nothing answers once it exited: no links to the dashboard, no key to sign in with.
    assert [link for link in LINKS if re.search(link, out, re.MULTILINE)] == []
    assert "sign in at" not in out
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_demo_keeps_the_stack_and_the_dashboard_up_until_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "turnkeeper", "demo", "--port", str(port)],
        env=_demo_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as demo:
        lines, returncode = _until_ctrl_c(demo)
    dashboards = [line.split() for line in lines if line.split()[:1] == ["dashboard"]]
    assert dashboards == [["dashboard", f"http://127.0.0.1:{port}/"]]  # --port, exactly
    assert returncode == 0, "".join(lines)
    assert _leftovers(tmp_path) == []


def _until_ctrl_c(demo: subprocess.Popen[str]) -> tuple[list[str], int]:
    """Check what the demo left up once it says so; then Ctrl-C, and its exit status."""
    lines: list[str] = []
    up = threading.Event()

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("The stack stays up"):
                up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert up.wait(240), "".join(lines)  # a hang guard
        out = "".join(lines)
        _check_output(out)
        for link in LINKS:
            assert re.search(link, out, re.MULTILINE), (link, out)
        sign_in = re.search(rf"sign in at\s+({_URL})/login\?next=%2Fui%2Ffleet$", out, re.MULTILINE)
        key = re.search(r"with the admin key\s+(tk_\S+)$", out, re.MULTILINE)
        run_page = re.search(rf"run page\s+{_URL}(/ui/runs/\S+)$", out, re.MULTILINE)
        assert sign_in is not None, out
        assert key is not None, out
        assert run_page is not None, out
        assert demo.poll() is None  # still up after its checks
        with httpx.Client(base_url=sign_in.group(1), timeout=60) as http:
            assert http.get("/ui/fleet").status_code == 200
            assert http.get(run_page.group(1)).status_code == 200
            fleet = http.get("/fleet", headers={"Authorization": f"Bearer {key.group(1)}"})
            assert fleet.status_code == 200, fleet.text
            assert len(fleet.json()["workers"]) == 2  # the killed one stays listed a while
    finally:
        demo.send_signal(signal.SIGINT)  # Ctrl-C
        returncode = demo.wait(timeout=120)
        reader.join(60)
    return lines, returncode
