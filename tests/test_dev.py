"""`turnkeeper dev` on the embedded default: the whole stack, the web app included, with
the dashboard's address and a key to sign in with; the trusted client finds its servers
in the same data directory, as docs/api.md's "From Python" script shows."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from turnkeeper.embedded import EmbeddedStack
from turnkeeper.web.serve import free_port

pytestmark = pytest.mark.fleet  # each test starts `turnkeeper dev`

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _python_block(markdown: Path, heading: str) -> str:
    """The first ```python block after ``heading``."""
    text = markdown.read_text()
    section = text[text.index(heading) :]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, heading
    return found.group(1)


class DevStack:
    """A `turnkeeper dev` process and what it printed."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.lines: list[str] = []
        self.up = threading.Event()
        data_dir = Path(env["TURNKEEPER_DATA_DIR"])
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.stderr = data_dir.parent / f"dev-{time.monotonic_ns()}.err"
        with self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "turnkeeper", "dev", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("turnkeeper dev is up"):
                self.up.set()

    def wait_up(self, timeout: float = 240.0) -> None:
        """Until it says it is up (a hang guard); a dev that ended or hung first fails
        the test with what it printed on both streams."""
        deadline = time.monotonic() + timeout
        while not self.up.wait(0.1):
            ended = self.proc.poll()
            if ended is not None or time.monotonic() > deadline:
                self._reader.join(timeout=5)
                raise AssertionError(
                    f"turnkeeper dev {'exited ' + str(ended) if ended is not None else 'hung'}"
                    f"\n--- stdout\n{''.join(self.lines)}"
                    f"--- stderr\n{self.stderr.read_text(errors='replace')[-6000:]}"
                )

    def field(self, name: str) -> str:
        values = [line.split()[1:] for line in self.lines if line.split()[:1] == [name]]
        assert len(values) == 1, self.lines
        return values[0][0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        returncode = self.proc.wait(timeout=120)  # a hang guard
        self._reader.join(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return returncode


@pytest.mark.slow
def test_dev_runs_the_web_app_and_the_client_finds_its_servers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(TURNKEEPER_DATA_DIR=str(tmp_path / "data"), COLUMNS="200", PYTHONUNBUFFERED="1")
    port = free_port()
    dev = DevStack(env, "--port", str(port))
    try:
        dev.wait_up()
        base_url = f"http://127.0.0.1:{port}"
        assert dev.field("dashboard") == f"{base_url}/"
        key = dev.field("key")
        listed = httpx.get(
            f"{base_url}/runs", headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        assert listed.status_code == 200, listed.text
        assert listed.json()["runs"] == []

        script = tmp_path / "tidy.py"
        script.write_text(_python_block(DOCS / "api.md", "## From Python"))
        ran = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,  # a hang guard
            check=False,
        )
        assert ran.returncode == 0, ran.stderr[-4000:]
        printed = [line.split(" ", 1) for line in ran.stdout.splitlines()]
        kinds = [kind for _, kind in printed]
        assert kinds.count("RUN_STARTED") == 2, ran.stdout  # the run, then the session's
        assert kinds.count("RUN_FINISHED") == 2, ran.stdout
        first_end = kinds.index("RUN_FINISHED")
        assert [int(seq) for seq, _ in printed[: first_end + 1]] == list(range(1, first_end + 2))
    finally:
        returncode = dev.stop()
    assert returncode == 0, "".join(dev.lines)
    assert dev.lines[-1] == "stopped.\n"


def test_dev_refuses_a_port_it_cannot_serve_on(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(TURNKEEPER_DATA_DIR=str(tmp_path / "data"), COLUMNS="200")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "turnkeeper", "dev", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: cannot serve the web app on 127.0.0.1:{port} (Address already in use); "
        "pass --port or set TURNKEEPER_WEB_PORT, or --no-web"
    )
    assert not (tmp_path / "data" / "postgres").exists(), "refused before starting anything"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(TURNKEEPER_DATA_DIR=str(tmp_path / "data"), COLUMNS="200", PYTHONUNBUFFERED="1")
    return env


def _fleet_of(data_dir: Path) -> list[int]:
    """The worker, beat and web processes a dev started for ``data_dir`` (not the
    embedded servers, which outlive a dev by design and are reused by the next)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        try:
            ours = proc.environ().get("TURNKEEPER_DATA_DIR") == str(data_dir.resolve())
        except psutil.Error:
            continue
        if ours and cmdline[1:3] == ["-m", "turnkeeper"] and cmdline[3] != "dev":
            found.append(proc.info["pid"])
    return found


def _wait_gone(data_dir: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard
    while left := _fleet_of(data_dir):
        assert time.monotonic() < deadline, f"left running: {left}"
        time.sleep(0.1)


def _status_with(base_url: str, key: str) -> int:
    return httpx.get(f"{base_url}/key", headers={"Authorization": f"Bearer {key}"}).status_code


@pytest.mark.slow
def test_a_dev_killed_outright_leaves_nothing_running_and_its_key_dies_with_the_next(
    tmp_path: Path,
) -> None:
    env, data_dir = _env(tmp_path), tmp_path / "data"
    port = free_port()
    first = DevStack(env, "--port", str(port))
    try:
        first.wait_up()
        old_key = first.field("key")
        assert _fleet_of(data_dir) != []
        second = subprocess.run(  # one dev per data directory
            [sys.executable, "-m", "turnkeeper", "dev", "--port", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert second.returncode == 1, second.stdout + second.stderr
        assert second.stderr.splitlines()[-1] == (
            f"error: another turnkeeper dev runs in {data_dir}; stop it first"
        )
        os.kill(first.proc.pid, signal.SIGKILL)  # no chance to stop anything
        first.proc.wait()
        _wait_gone(data_dir)  # its worker, beat and web go with it

        third = DevStack(env, "--port", str(port))
        try:
            third.wait_up()
            base_url = f"http://127.0.0.1:{port}"
            assert _status_with(base_url, third.field("key")) == 200
            assert _status_with(base_url, old_key) == 401  # revoked as the third started
        finally:
            assert third.stop() == 0, "".join(third.lines)
        _wait_gone(data_dir)
    finally:
        first.stop()
        EmbeddedStack(data_dir).stop()  # the killed dev's servers, which the third reused


def test_ctrl_c_while_dev_starts_stops_what_it_started(tmp_path: Path) -> None:
    env, data_dir = _env(tmp_path), tmp_path / "data"
    dev = DevStack(env, "--port", "0")
    try:
        deadline = time.monotonic() + 240  # a hang guard
        while not any(line.startswith("broker") for line in dev.lines):
            assert time.monotonic() < deadline, dev.lines
            assert dev.proc.poll() is None, dev.lines
            time.sleep(0.01)
    finally:
        returncode = dev.stop()  # SIGINT, before (or as) it says it is up
    assert returncode == 0, "".join(dev.lines)
    assert dev.lines[-1] == "stopped.\n"
    _wait_gone(data_dir)
    assert EmbeddedStack(data_dir).running() is None, "the servers it started are stopped"
