"""The suite's tiers, marked on every test at collection from what it asks for.

- ``pure``: no service at all;
- ``store``: real Postgres and Redis (the store, the run log, the web app in-process);
- ``system``: real jails, an ssh host, the agents' real CLIs or a browser;
- ``fleet``: real worker processes (started by a ``*fleet`` fixture, or by the test).

``slow`` and ``soak`` are marked by hand on top. ``make test`` runs every tier;
``make test-fast`` the first two (``-m "pure or store"``).

A test is put in the highest tier its fixtures reach. Whether that was right is checked
while it runs: a test outside ``fleet`` that starts a worker or beat fails, saying so,
so a tier never hides a fleet test from ``make test-fast``'s promise.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

TIERS = ("pure", "store", "system", "fleet")
_STORE_FIXTURES = {"database_url", "redis_url", "namespace", "settings", "store", "runlog"}
_SYSTEM_FIXTURES = {
    "sandbox",
    "local_sandbox",
    "provider",
    "sshd",
    "ssh_target",
    "ssh_agent_target",
    "agent_clis",
    "browser",
}
_FLEET_COMMANDS = {"worker", "beat", "dev", "demo", "up"}


# What in a test's code (or a helper of its module it calls) starts workers.
_FLEET_WORDS = re.compile(
    r"Fleet\b|_fleet\(|start_worker|start_beat|[\"'](worker|beat|dev|demo)[\"']"
)


def _starts_workers(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    if function is None:
        return False
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    module = inspect.getmodule(function)
    helpers = [
        value
        for name, value in vars(module).items()
        if inspect.isfunction(value) and value is not function and f"{name}(" in source
    ]
    for helper in helpers:
        with contextlib.suppress(OSError, TypeError):
            source += inspect.getsource(helper)
    return _FLEET_WORDS.search(source) is not None


def tier_of(item: pytest.Item) -> str:
    """The highest tier ``item``'s fixtures (their whole closure), its code or its own
    marks reach."""
    if item.get_closest_marker("fleet") is not None:
        return "fleet"
    names = set(getattr(item, "fixturenames", ()))
    if any(name.endswith("fleet") for name in names) or _starts_workers(item):
        return "fleet"
    if item.get_closest_marker("system") is not None or names & _SYSTEM_FIXTURES:
        return "system"
    if names & _STORE_FIXTURES:
        return "store"
    return "pure"


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: the suite's {tier} tier (tests/tiers.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test's tier, then order the suite longest first, by the durations a
    whole run recorded (``tests/durations.json``, ``scripts/record_durations.py``), a
    test not recorded there by its marks. ``make test`` hands tests out one at a time to
    whichever xdist worker is free (``--dist load --maxschedchunk 1``), so the long tests
    start at once, side by side, and the thousand short ones fill the gaps at the end,
    instead of one long test started last keeping a worker busy alone."""
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)
    recorded = _recorded_durations()
    items.sort(key=lambda item: _expected_seconds(item, recorded), reverse=True)


DURATIONS = Path(__file__).with_name("durations.json")
_GUESSED_SECONDS = {"pure": 0.0, "store": 0.2, "system": 0.4, "fleet": 0.45}
"""What a test not in ``durations.json`` is taken to last: less than any recorded one
(only tests of half a second or more are), in tier order."""


def _recorded_durations() -> dict[str, float]:
    try:
        recorded = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {str(test): float(seconds) for test, seconds in recorded.items()}


def _expected_seconds(item: pytest.Item, recorded: dict[str, float]) -> float:
    if item.nodeid in recorded:
        return recorded[item.nodeid]
    marked = {name for name in ("soak", "slow", *TIERS) if item.get_closest_marker(name)}
    if marked & {"soak", "slow"}:
        return 20.0  # long by its mark, though not recorded yet
    return max(_GUESSED_SECONDS[name] for name in marked & set(TIERS))


_current: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    return (yield from _running(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    return (yield from _running(item))


def _running(item: pytest.Item) -> Any:
    _current.append(item)
    try:
        return (yield)
    finally:
        _current.pop()


class MisTieredError(AssertionError):
    """A test started a worker without being in the fleet tier."""


_popen_init = subprocess.Popen.__init__


def _checked_popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    argv = [str(arg) for arg in args] if isinstance(args, (list, tuple)) else []
    starts_fleet = (
        len(argv) > 3
        and argv[1:3] == ["-m", "turnkeeper"]
        and argv[3] in _FLEET_COMMANDS
        and "--help" not in argv
    )
    if starts_fleet and _current and _current[-1].get_closest_marker("fleet") is None:
        raise MisTieredError(
            f"{_current[-1].nodeid} starts `turnkeeper {argv[3]}` but is not in the fleet "
            "tier: request a *fleet fixture or mark it pytest.mark.fleet (tests/tiers.py)"
        )
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _checked_popen_init  # type: ignore[method-assign]
