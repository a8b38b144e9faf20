"""The examples run against a real turnkeeper: its workers and web app (tests/web's
fixtures), with API keys in the test's database."""

from tests.web.conftest import api_keys, fleet, web

__all__ = ["api_keys", "fleet", "web"]
