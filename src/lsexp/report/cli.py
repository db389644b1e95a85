"""`lsexp report NAME_OR_RUN_ID`: redraw a sweep's comparison (and its study) from the MLflow store alone."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

from lsexp.report.sweep import labels, sweep_report


def _latest_sweep(client, experiment_name: str) -> str:
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise LookupError(f"no experiment named {experiment_name!r} in this store")
    parents = client.search_runs([experiment.experiment_id], "tags.`lsexp.sweep` = 'true'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    if not parents:
        raise LookupError(f"experiment {experiment_name!r} has no sweep; run one with python -m lsexp -m ...")
    return parents[0].info.run_id


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(
        prog="lsexp report",
        description="Redraw a sweep's comparison figure and table from the MLflow store, "
        "without re-running it.",
    )
    parser.add_argument("sweep", help="a sweep's parent run id, or an experiment name (its latest sweep)")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: MLflow's own, sqlite:///mlflow.db here)",
    )
    parser.add_argument(
        "--out", default=None, help="folder for the figure and tables (default: reports/<run id>)"
    )
    parser.add_argument(
        "--baseline", default=None, metavar="GROUP",
        help="a group, as its runs' lsexp.group tag names it (e.g. 'loss_scale=none amp=O2'), to compare "
        "every other group with, seed by seed, or some of a group's choices ('loss_scale=none'): each "
        "group is then compared with the one that differs from it in those alone. Writes "
        "comparison_paired.csv and .md",
    )
    args = parser.parse_args(list(argv))

    from lsexp.tracking.store import TrackingError, check_reachable, client_for, resolve_uri
    from lsexp.tracking.uri import redact, scrub

    uri = resolve_uri(args.tracking_uri)
    try:
        check_reachable(uri, "--tracking-uri")
        client = client_for(uri)
        run_id = (
            args.sweep if re.fullmatch(r"[0-9a-f]{32}", args.sweep) else _latest_sweep(client, args.sweep)
        )
        out = Path(args.out or Path("reports") / run_id)
        children = sweep_report(client, run_id, out, args.baseline)
        study = client.get_run(run_id).data.tags.get("lsexp.study")
        if study and children:
            from lsexp.report import studies

            studies.write(study, client, children, labels(children), out)
    except (TrackingError, LookupError) as err:
        print(f"lsexp report: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # e.g. an unknown run id: MLflow's RESOURCE_DOES_NOT_EXIST
        print(
            f"lsexp report: {args.sweep} in {redact(uri)}: {scrub(str(err).splitlines()[0], uri)}",
            file=sys.stderr,
        )
        return 2
    print(f"{len(children)} runs of sweep {run_id} -> {out}/comparison.png, comparison.csv, comparison.md")
    print((out / "comparison.md").read_text(), end="")
    if args.baseline is not None and (out / "comparison_paired.md").exists():
        print(f"paired with {args.baseline!r}, seed by seed -> {out}/comparison_paired.csv, .md")
        print((out / "comparison_paired.md").read_text(), end="")
    if study and children:
        print(f"study {study} -> {out}/{study}.png, {study}.csv, {study}.md")
        print((out / f"{study}.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
