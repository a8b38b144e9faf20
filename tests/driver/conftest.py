from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.driver.fleet import DEFAULT_TIMING, Fleet
from turnkeeper.config import Settings


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet.create(settings, tmp_path / "logs")
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def default_fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet at the settings' own lease, heartbeat, reconcile and requeue timing."""
    fleet = Fleet.create(settings, tmp_path / "logs", **DEFAULT_TIMING)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def slow_beat_fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet whose heartbeat beats every 300 s (a lease lasts 900 s): a run stopped
    within a test's hang guard was stopped by something else (a cancel's wake-up)."""
    fleet = Fleet.create(settings, tmp_path / "logs", heartbeat_interval=300.0, lease_ttl=900.0)
    try:
        yield fleet
    finally:
        fleet.stop()
