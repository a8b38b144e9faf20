"""A RunLog per test, on the test's own key namespace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from turnkeeper.log import RunLog


@pytest.fixture
def runlog(redis_url: str, namespace: str) -> Iterator[RunLog]:
    log = RunLog.from_url(redis_url, namespace=namespace, retention_seconds=600, max_chunks=1000)
    yield log
    log.client.close()
