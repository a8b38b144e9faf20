"""The wheel ships what an app that installs turnkeeper needs: its types (PEP 561's
``py.typed``) and the files the package reads at run time."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

wheel = pytest.importorskip("hatchling.builders.wheel")

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_py_typed_and_the_package_data(tmp_path: Path) -> None:
    builder = wheel.WheelBuilder(str(ROOT))
    (built,) = builder.build(directory=str(tmp_path), versions=["standard"])
    names = set(zipfile.ZipFile(built).namelist())
    assert "turnkeeper/py.typed" in names
    assert "turnkeeper/client.py" in names
    # What the package opens by path once installed: the dashboard and the migrations.
    assert "turnkeeper/web/static/index.html" in names
    for static in ("fleet.html", "fleet.js", "charts.js", "fleet.css"):
        assert f"turnkeeper/web/static/{static}" in names
    assert "turnkeeper/store/migrations/versions/0009_fleet_activity.py" in names
    assert any(name.startswith("turnkeeper/store/migrations/versions/") for name in names)
    assert not any(name.startswith(("tests/", "examples/")) for name in names)
