"""npm packages for web tests, installed from the registry once and kept across runs.

The same cache as the agent CLIs (``tests.integration.npm_cache``): an install is
built in a scratch directory and renamed into place once it is complete, under a
lock, so xdist workers starting together install once and a half-finished install
is never used. Versions are pinned exactly.

``run_script`` runs a Node script of the repo from inside an install, so its
``import`` finds the packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integration.npm_cache import INSTALL_TIMEOUT, NpmInstallError, _locked, cache_root

DURABLE_CLIENT = {"@durable-streams/client": "0.2.7"}
CONFORMANCE_TESTS = {"@durable-streams/server-conformance-tests": "0.3.6"}
COMPLETE = "turnkeeper-install.json"
SCRIPTS = Path(__file__).parent / "node"


def install_packages(pinned: dict[str, str]) -> Path:
    """The prefix of a cached install of exactly ``pinned`` (package -> version)."""
    key = "_".join(
        f"{name.strip('@').replace('/', '-')}-{version}" for name, version in sorted(pinned.items())
    )
    specs = [f"{name}@{version}" for name, version in sorted(pinned.items())]

    def fill(scratch: Path) -> None:
        (scratch / "package.json").write_text(json.dumps({"private": True, "type": "module"}))

    return install_once(
        key,
        fill,
        ["install", *specs],
        record=pinned,
        complete=lambda target: _complete(target, pinned),
    )


def install_once(
    key: str,
    fill: Callable[[Path], None],
    npm_args: list[str],
    *,
    record: Any,
    complete: Callable[[Path], bool],
    check: Callable[[Path], None] = lambda _: None,
) -> Path:
    """The cached install named ``key``, made when ``complete`` says it is missing:
    ``fill`` writes the scratch directory's package files, ``npm npm_args`` installs,
    ``check`` may refuse the result; then ``record`` is written as the completion mark
    and the scratch directory renamed into place, all under the key's lock."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    with _locked(root / f"{key}.lock"):
        if complete(target):
            return target
        scratch = root / f".{key}.{uuid.uuid4().hex[:8]}"
        try:
            scratch.mkdir(parents=True)
            fill(scratch)
            done = subprocess.run(
                ["npm", *npm_args, "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=scratch,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            if done.returncode != 0:
                raise NpmInstallError(f"npm {' '.join(npm_args)} failed:\n{done.stderr[-4000:]}")
            check(scratch)
            (scratch / COMPLETE).write_text(json.dumps(record))
            if target.exists():
                shutil.rmtree(target)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if not complete(target):
        raise NpmInstallError(f"install at {target} vanished after it completed")
    return target


def _complete(target: Path, pinned: dict[str, str]) -> bool:
    try:
        installed = json.loads((target / COMPLETE).read_text())
    except (OSError, ValueError):
        return False
    return bool(installed == pinned) and all(
        (target / "node_modules" / name / "package.json").exists() for name in pinned
    )


def run_script(
    prefix: Path,
    script: str,
    args: list[str],
    *,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``tests/web/node/<script>`` from a private copy inside ``prefix`` (or run
    ``command`` in the copy's directory: a test runner that finds it there)."""
    runs = prefix / "runs"
    runs.mkdir(exist_ok=True)
    place = runs / uuid.uuid4().hex
    place.mkdir()
    try:
        copy = place / script
        shutil.copyfile(SCRIPTS / script, copy)
        return subprocess.run(
            command or ["node", str(copy), *args],
            cwd=place,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env={**os.environ, **(env or {})},
        )
    finally:
        shutil.rmtree(place, ignore_errors=True)
