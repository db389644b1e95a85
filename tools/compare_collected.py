#!/usr/bin/env python3
"""Compare the tests two commits collect: every test of the old commit must still be collected by the
new one, or be named as replaced in docs/testing.md's table of replaced tests.

    python3 tools/compare_collected.py f22524e HEAD   # exit 0: "N tests then, M now, K replaced, none lost"
                                                      # exit 1: one line per test lost, unnamed

Each commit is checked out into a temporary git worktree and collected there with every marker
(`pytest --collect-only -q -m ""`), by the interpreter that runs this script (the project's venv, so
that pytest and lsexp's dependencies import). A replaced test is a row of the table under the heading
"Replaced tests" in docs/testing.md whose first cell is the old node id in backticks; its second cell
names what checks it now.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "testing.md"


def collected(commit: str) -> set[str]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), commit],
                       check=True)
        try:
            out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "",
                                  "-p", "no:cacheprovider", "--rootdir", str(tree), str(tree / "tests")],
                                 cwd=tree, capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(tree / "src")))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    ids = {line.strip() for line in out.stdout.splitlines() if "::" in line}
    if not ids:
        sys.exit(f"compare_collected: {commit} collected no tests:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return ids


def replaced(doc: Path = DOC) -> dict[str, str]:
    """old node id -> what replaced it, from the "Replaced tests" table of docs/testing.md."""
    text = doc.read_text()
    section = re.split(r"^#+ Replaced tests\s*$", text, flags=re.M)
    if len(section) < 2:
        return {}
    body = re.split(r"^#+ ", section[1], maxsplit=1, flags=re.M)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python3 tools/compare_collected.py OLD_COMMIT NEW_COMMIT", file=sys.stderr)
        return 2
    old, new = (collected(c) for c in argv)
    names = replaced()
    lost = sorted(t for t in old - new if t not in names)
    for test in lost:
        print(f"lost: {test} (neither collected now nor named in docs/testing.md's Replaced tests)")
    gone = len(old - new) - len(lost)
    print(f"{len(old)} tests then, {len(new)} now, {gone} replaced, "
          + ("none lost" if not lost else f"{len(lost)} lost"))
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
