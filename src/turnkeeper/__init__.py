"""turnkeeper: run AI-agent turns durably on a fleet of Celery workers."""

__version__ = "0.1.0"
