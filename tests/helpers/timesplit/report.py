"""The time split's table: per test, its wall time and what of it went to starting processes and
importing MindSpore, to MindSpore's graph compiler, to running compiled graphs, and to processes
that import mlflow (the tracking worker, mlflow servers, the CLI's own tracking), summed over the test's
own process and every process it started. python tests/helpers/timesplit/report.py DIR [N]"""

import collections
import json
import sys
from pathlib import Path


def load(folder):
    tests, procs = {}, collections.defaultdict(list)
    for path in Path(folder).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["kind"] == "process":
                procs[row["test"]].append(row)
            else:
                tests[row["test"]] = row
    return tests, procs


def split(test, children):
    """(wall, start+import, compile, graphs, mlflow processes, other) of one test, in seconds; a child's
    own start (lifetime minus what it spent in compile/graphs) counts as start+import unless it imported
    mlflow without mindspore (a tracking worker or server): that goes to tracking."""
    start = test["import_mindspore"]
    compile_, graphs = test["compile"], test["run_graph"]
    tracking = test["import_mlflow"]
    for c in children:
        if c["import_mlflow"] and not c["import_mindspore"]:
            tracking += c["lifetime"]
            continue
        compile_ += c["compile"]
        graphs += c["run_graph"]
        start += c["import_mindspore"] + 0.05  # the interpreter's own start, about 50 ms here
        tracking += c["import_mlflow"]
    return test["wall"], start, compile_, graphs, tracking


def main(folder, n=20):
    tests, procs = load(folder)
    rows = sorted(((name, *split(t, procs.get(name, []))) for name, t in tests.items()),
                  key=lambda r: -r[1])
    total = [sum(r[i] for r in rows) for i in range(1, 6)]
    print(f"{len(rows)} tests, {total[0]:.0f} s of worker time: start+import {total[1]:.0f} s, compile "
          f"{total[2]:.0f} s, compiled graphs {total[3]:.0f} s, tracking processes {total[4]:.0f} s "
          "(children overlap their test, so the parts may exceed the wall)")
    print("| test | wall s | start+import s | compile s | graphs s | tracking s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, wall, start, comp, graphs, track in rows[:n]:
        print(f"| `{name}` | {wall:.1f} | {start:.1f} | {comp:.1f} | {graphs:.1f} | {track:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
