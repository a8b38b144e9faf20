"""A test this machine cannot run: skipped here, failed in CI.

The jail (bwrap), egress and ssh tests need system tools (bubblewrap, socat, curl,
setpriv, an OpenSSH server), root, and cgroups a developer's machine may lack; there
they skip and say why. In CI (``CI=true``, as GitHub Actions and ``.ci/run`` set it)
the same reason fails the test instead: a machine that cannot run them would
otherwise report green having checked none of the sandbox's promises.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

BWRAP_MISSING = "bubblewrap (bwrap) is not installed"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def cannot_run(reason: str | None) -> None:
    """Skip the test (fail it, in CI) when ``reason`` says why it cannot run here; return
    when it is None."""
    if reason is not None:
        skip_or_fail(reason)


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it in CI, saying ``reason``."""
    if in_ci():
        pytest.fail(f"{reason}; CI must run every jail, egress and ssh test", pytrace=False)
    pytest.skip(reason)


def bwrap_missing() -> str | None:
    """Why no bwrap jail can be made here (it is not installed), or None."""
    return BWRAP_MISSING if shutil.which("bwrap") is None else None


def require_bwrap() -> None:
    cannot_run(bwrap_missing())
