"""The real agent CLIs, installed from the npm registry once and kept across test runs.

Installs go to ``$XDG_CACHE_HOME/turnkeeper-npm/<versions>`` (``~/.cache`` by default;
``TURNKEEPER_NPM_CACHE`` overrides the parent directory). An install is built in a
scratch directory and renamed into place only once both CLIs answer ``--version``, so a
half-finished install is never mistaken for a good one; a lock file serialises the
installers, so xdist workers starting together install once and the rest wait.

When a pinned version is no longer on the registry, the closest published version is
installed instead and :attr:`AgentClis.versions` says which one.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CLAUDE_PACKAGE = "@anthropic-ai/claude-code"
CODEX_PACKAGE = "@openai/codex"
PINNED = {CLAUDE_PACKAGE: "2.1.328", CODEX_PACKAGE: "0.169.0"}  # the fixtures' versions
COMPLETE = "turnkeeper-install.json"
INSTALL_TIMEOUT = 900  # a hang guard for a slow registry, not an expectation


class NpmInstallError(RuntimeError):
    """npm could not install the CLIs (the test fails with npm's own words)."""


@dataclass(frozen=True)
class AgentClis:
    """Where the installed CLIs are and which versions they are."""

    prefix: Path
    versions: dict[str, str]

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "node_modules" / ".bin"

    @property
    def claude(self) -> Path:
        return self.bin_dir / "claude"

    @property
    def codex(self) -> Path:
        return self.bin_dir / "codex"

    def path_env(self) -> str:
        return search_path(self.bin_dir)


def search_path(bin_dir: Path) -> str:
    """A PATH finding the CLIs in ``bin_dir`` and node (the codex launcher is a node script)."""
    node = shutil.which("node")
    parts = [str(bin_dir)]
    if node is not None:
        parts.append(str(Path(node).resolve().parent))
    parts += ["/usr/local/bin", "/usr/bin", "/bin"]
    return ":".join(dict.fromkeys(parts))


def cache_root() -> Path:
    override = os.environ.get("TURNKEEPER_NPM_CACHE")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "turnkeeper-npm"


def install_agent_clis(pinned: dict[str, str] | None = None) -> AgentClis:
    """The cached install for ``pinned`` (package -> version), installing it when missing."""
    pinned = dict(pinned or PINNED)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = "_".join(
        f"{name.rsplit('/', 1)[-1]}-{version}" for name, version in sorted(pinned.items())
    )
    target = root / key
    with _locked(root / f"{key}.lock"):
        done = _completed(target)
        if done is not None:
            return done
        scratch = root / f".{key}.{uuid.uuid4().hex[:8]}"
        try:
            versions = _install(scratch, pinned)
            clis = AgentClis(scratch, versions)
            _repair_native_binaries(clis)
            _check_runs(clis)
            (scratch / COMPLETE).write_text(json.dumps(versions))
            if target.exists():
                shutil.rmtree(target)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        result = _completed(target)
        if result is None:
            raise NpmInstallError(f"install at {target} vanished after it completed")
        return result


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _completed(target: Path) -> AgentClis | None:
    try:
        versions = json.loads((target / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    clis = AgentClis(target, versions)
    if not (clis.claude.exists() and clis.codex.exists()):
        return None
    return clis


def _npm(args: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["npm", *args],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _install(prefix: Path, pinned: dict[str, str]) -> dict[str, str]:
    prefix.mkdir(parents=True)
    versions = {name: _available(name, version) for name, version in pinned.items()}
    specs = [f"{name}@{version}" for name, version in versions.items()]
    flags = ["--no-audit", "--no-fund", "--loglevel=error"]
    done = _npm(["install", "--prefix", str(prefix), *flags, *specs])
    if done.returncode != 0:
        raise NpmInstallError(f"npm install {' '.join(specs)} failed:\n{done.stderr[-4000:]}")
    return versions


def _available(name: str, wanted: str) -> str:
    """``wanted`` when the registry has it, else the closest published version."""
    done = _npm(["view", f"{name}@{wanted}", "version"])
    if done.returncode == 0 and done.stdout.strip():
        return wanted
    listing = _npm(["view", name, "versions", "--json"])
    if listing.returncode != 0:
        raise NpmInstallError(f"npm view {name} failed:\n{listing.stderr[-4000:]}")
    closest = closest_version([str(v) for v in json.loads(listing.stdout)], wanted)
    if closest is None:
        raise NpmInstallError(f"the registry lists no release of {name}")
    return closest


def closest_version(published: list[str], wanted: str) -> str | None:
    """The release nearest ``wanted``: same major first, then minor, then patch."""
    releases = [v for v in published if _numeric(v) is not None]
    target = _numeric(wanted) or (0, 0, 0)
    if not releases:
        return None
    return min(releases, key=lambda v: _distance(_numeric(v) or (0, 0, 0), target))


def _numeric(version: str) -> tuple[int, int, int] | None:
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None  # pre-releases and odd tags are never picked
    return int(parts[0]), int(parts[1]), int(parts[2])


def _distance(version: tuple[int, int, int], target: tuple[int, int, int]) -> tuple[int, ...]:
    return tuple(abs(a - b) for a, b in zip(version, target, strict=True))


def _repair_native_binaries(clis: AgentClis) -> None:
    """Run Claude Code's postinstall by hand when npm skipped install scripts.

    The package's ``bin/claude.exe`` is a placeholder until its postinstall copies the
    platform's native binary over it; npm versions that gate install scripts skip it.
    """
    if _version(clis.claude) is not None:
        return
    package = clis.prefix / "node_modules" / CLAUDE_PACKAGE
    subprocess.run(
        ["node", "install.cjs"],
        cwd=package,
        capture_output=True,
        timeout=INSTALL_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _version(executable: Path) -> str | None:
    try:
        done = subprocess.run(
            [str(executable), "--version"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
            env={**os.environ, "PATH": search_path(executable.parent)},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def _check_runs(clis: AgentClis) -> None:
    for executable in (clis.claude, clis.codex):
        if _version(executable) is None:
            raise NpmInstallError(f"{executable} --version does not run after the install")
