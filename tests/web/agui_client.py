"""The real ``@ag-ui/client`` from the npm registry, installed once and kept across runs.

``agui_node/`` holds the package file, its lock (exact versions of the whole tree) and
the script that drives ``HttpAgent``. The install is ``npm ci`` of that lock into
``<npm cache>/agui-client-<lock digest>`` (the directory ``tests/integration/
npm_cache.py`` uses), built in a scratch directory and renamed into place once the
client loads; a lock file serialises installers, so xdist workers install once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.npm_cache import NpmInstallError
from tests.web.npm_packages import COMPLETE, install_once

PROJECT = Path(__file__).parent / "agui_node"
SCRIPT = PROJECT / "run_agent.cjs"
RUN_TIMEOUT = 300  # a hang guard for a whole conversation, not an expectation


@dataclass(frozen=True)
class AguiClient:
    """The installed client: ``run`` drives HttpAgent through turns of one thread."""

    modules: Path

    def start(self, request: dict[str, Any], workdir: Path) -> Conversation:
        """The script started on ``request`` (see run_agent.cjs); read it with ``result``."""
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / f"agui-request-{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps(request))
        env = {**os.environ, "AGUI_MODULES": str(self.modules)}
        env.pop("NODE_ENV", None)  # the client freezes its inputs under NODE_ENV=test
        proc = subprocess.Popen(
            ["node", str(SCRIPT), str(path)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return Conversation(proc)

    def run(self, request: dict[str, Any], workdir: Path) -> dict[str, Any]:
        return self.start(request, workdir).result()


@dataclass
class Conversation:
    proc: subprocess.Popen[bytes]

    def result(self) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=RUN_TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        code = self.proc.returncode
        assert code == 0, f"the AG-UI client failed ({code}):\n{err.decode(errors='replace')}"
        value: dict[str, Any] = json.loads(out)
        return value


def install_agui_client() -> AguiClient:
    """The cached install of ``agui_node/package-lock.json``, installing it when missing."""
    lock = (PROJECT / "package-lock.json").read_bytes()
    key = f"agui-client-{hashlib.sha256(lock).hexdigest()[:16]}"

    def fill(scratch: Path) -> None:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(PROJECT / name, scratch / name)

    target = install_once(
        key,
        fill,
        ["ci"],
        record={"lock": key},
        complete=lambda target: (target / COMPLETE).exists(),
        check=lambda scratch: _check_loads(scratch / "node_modules"),
    )
    return AguiClient(target / "node_modules")


def _check_loads(modules: Path) -> None:
    probe = "require(require('node:path').join(process.argv[1], '@ag-ui/client')).HttpAgent.name"
    done = subprocess.run(
        ["node", "-e", f"process.stdout.write({probe})", str(modules)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0 or not done.stdout:
        raise NpmInstallError(f"@ag-ui/client does not load after the install:\n{done.stderr}")
