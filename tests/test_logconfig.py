"""Logging configured before structlog is loaded: nothing loads it until something logs,
and whatever loads it then, our modules' lazy loggers or a module importing structlog
itself, finds it configured (JSON on stderr at the level asked, nothing on stdout).
Each case is a fresh interpreter: which modules are loaded is the point."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import sys
from turnkeeper.logconfig import configure_library_logging, configure_logging, get_logger

{setup}
lazy = get_logger("tests.lazy")
print("loaded before the first event:", "structlog" in sys.modules, file=sys.stderr)
{events}
"""


def _run(setup: str, events: str) -> tuple[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(setup=setup, events=events)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout, done.stderr.splitlines()


def _events(lines: list[str]) -> list[dict[str, object]]:
    return [
        {k: v for k, v in json.loads(line).items() if k != "timestamp"}
        for line in lines
        if line.startswith("{")
    ]


def test_whoever_loads_structlog_first_finds_it_configured() -> None:
    stdout, stderr = _run(
        'configure_logging("INFO", "json")',
        """
import structlog  # a module logging through structlog itself, loaded after the fact
structlog.get_logger("tests.direct").debug("direct.hidden")
structlog.get_logger("tests.direct").info("direct.shown", n=1)
lazy.debug("lazy.hidden")
lazy.warning("lazy.shown", n=2)
""",
    )
    assert stdout == ""
    assert stderr[0] == "loaded before the first event: False"
    assert _events(stderr) == [
        {"event": "direct.shown", "n": 1, "level": "info"},
        {"event": "lazy.shown", "n": 2, "level": "warning"},
    ]


def test_the_first_event_of_a_lazy_logger_loads_structlog_configured() -> None:
    stdout, stderr = _run(
        'configure_logging("WARNING", "json")',
        """
lazy.info("lazy.hidden")
lazy.error("lazy.shown", run_id="r")
print("loaded after the first event:", "structlog" in sys.modules, file=sys.stderr)
""",
    )
    assert stdout == ""
    assert stderr[0] == "loaded before the first event: False"
    assert stderr[-1] == "loaded after the first event: True"
    assert _events(stderr) == [{"event": "lazy.shown", "run_id": "r", "level": "error"}]


def test_an_event_below_the_level_is_dropped_without_loading_structlog() -> None:
    stdout, stderr = _run(
        'configure_logging("WARNING", "json")',
        """
lazy.debug("lazy.hidden")
lazy.info("lazy.hidden", run_id="r")
print("loaded after the dropped events:", "structlog" in sys.modules, file=sys.stderr)
lazy.warning("lazy.shown")
""",
    )
    assert stdout == ""
    assert "loaded after the dropped events: False" in stderr
    assert _events(stderr) == [{"event": "lazy.shown", "level": "warning"}]


def test_the_last_configuration_before_structlog_loads_is_the_one_applied() -> None:
    """The CLI configures logging, then the client asks for the library default, which
    leaves the CLI's alone; a second ``configure_logging`` replaces the first."""
    stdout, stderr = _run(
        """
configure_logging("ERROR", "json")
configure_logging("INFO", "json")
configure_library_logging("console")
""",
        'lazy.info("lazy.shown")',
    )
    assert stdout == ""
    assert _events(stderr) == [{"event": "lazy.shown", "level": "info"}]


def test_the_library_default_applies_when_nobody_configured_logging() -> None:
    stdout, stderr = _run(
        'configure_library_logging("json")',
        'lazy.info("lazy.hidden")\nlazy.warning("lazy.shown")',
    )
    assert stdout == ""
    assert _events(stderr) == [{"event": "lazy.shown", "level": "warning"}]


def test_an_application_configuration_made_first_is_kept() -> None:
    """structlog loaded and configured by the application before the client: the
    library default does not replace it (here: events on stdout, its choice)."""
    stdout, stderr = _run(
        """
import structlog
structlog.configure(processors=[structlog.processors.JSONRenderer()])
configure_library_logging("json")
""",
        'lazy.info("app.event")',
    )
    assert json.loads(stdout) == {"event": "app.event"}
    assert _events(stderr) == []
