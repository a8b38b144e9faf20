"""Zero-config real servers: PostgreSQL and Redis from pip packages, for dev, demo and tests."""

from turnkeeper.embedded.stack import EmbeddedStack, StackUrls, resolve_services

__all__ = ["EmbeddedStack", "StackUrls", "resolve_services"]
