from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet
from turnkeeper.config import Settings


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet.create(settings, tmp_path / "logs")
    try:
        yield fleet
    finally:
        fleet.stop()
