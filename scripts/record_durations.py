"""Write tests/durations.json from one or more JUnit XML reports of whole-suite runs.

The suite runs its longest tests first (tests/tiers.py), by these recorded durations:
each xdist worker starts on a long test and the short ones fill the gaps at the end.
Record again after adding long tests::

    .venv/bin/pytest -n 4 --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/record_durations.py /tmp/suite.xml

Tests under half a second are left out (unknown tests rank by their tier), so the file
changes only when a long test does. With several reports, a test's duration is its
mean over them.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from xml.etree import ElementTree

SHORTEST = 0.5
DURATIONS = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def node_id(case: ElementTree.Element) -> str:
    """The pytest node id of a JUnit test case (``classname`` is the dotted file path)."""
    path = case.get("classname", "").replace(".", "/") + ".py"
    return f"{path}::{case.get('name', '')}"


def main(reports: list[str]) -> int:
    if not reports:
        print(__doc__, file=sys.stderr)
        return 2
    seconds: dict[str, list[float]] = defaultdict(list)
    for report in reports:
        for case in ElementTree.parse(report).iter("testcase"):  # noqa: S314 (our own pytest)
            seconds[node_id(case)].append(float(case.get("time", "0")))
    durations = {
        test: round(sum(times) / len(times), 1)
        for test, times in sorted(seconds.items())
        if sum(times) / len(times) >= SHORTEST
    }
    DURATIONS.write_text(json.dumps(durations, indent=0, sort_keys=True) + "\n")
    print(f"{len(durations)} tests of {len(seconds)} recorded in {DURATIONS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
