"""The fallback when a pinned CLI version is gone from the registry (no npm needed)."""

from __future__ import annotations

from tests.integration.npm_cache import closest_version


def test_the_pinned_version_itself_wins_when_published() -> None:
    assert closest_version(["0.168.0", "0.169.0", "0.170.0"], "0.169.0") == "0.169.0"


def test_the_nearest_release_of_the_same_major_and_minor_is_preferred() -> None:
    published = ["1.0.0", "2.0.9", "2.1.300", "2.1.331", "2.2.0", "2.1.400-beta.1"]
    assert closest_version(published, "2.1.328") == "2.1.331"
    assert closest_version(["0.167.0", "0.170.0", "0.171.0"], "0.169.0") == "0.170.0"


def test_nothing_when_no_release_is_published() -> None:
    assert closest_version(["1.0.0-rc.1", "latest"], "1.0.0") is None
    assert closest_version([], "1.0.0") is None
