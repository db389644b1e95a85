"""tests/durations.json, the order pytest runs the tests in (tests/conftest.py), from JUnit XML files of
the runs CI makes (docs/testing.md, "CI"):

    python -m pytest -n 2 --junitxml=/tmp/quick.xml
    python -m pytest -n 2 -m "slow or msrun or postgres or ray or slurm or browser" --junitxml=/tmp/rest.xml
    python tests/helpers/durations.py /tmp/quick.xml /tmp/rest.xml

Each test's seconds (setup, call and teardown), rounded to a tenth, sorted by node id so that a new run
changes only the lines of tests whose time moved."""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).parent.parent / "durations.json"


def main(*junits: str) -> None:
    seconds = {}
    for junit in junits:  # a test in several files takes the later file's time
        for case in ET.parse(junit).iter("testcase"):
            module = case.get("classname").replace(".", "/") + ".py"
            seconds[f"{module}::{case.get('name')}"] = round(float(case.get("time")), 1)
    OUT.write_text(json.dumps(dict(sorted(seconds.items())), indent=0) + "\n")
    print(f"{len(seconds)} tests' seconds in {OUT}")


if __name__ == "__main__":
    main(*sys.argv[1:])
