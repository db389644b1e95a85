"""The `lsexp` command. `lsexp report ...` and `lsexp server ...` skip Hydra and MindSpore, `lsexp layers
...` composes a config and builds its network; anything else is a Hydra run."""

import sys


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        from lsexp.report.cli import main as report

        sys.exit(report(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        from lsexp.server import main as server

        sys.exit(server(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "layers":
        from lsexp.layers import main as layers

        sys.exit(layers(sys.argv[2:]))
    from lsexp.tracking import worker as tracking_worker

    if tracking_worker.wanted(sys.argv[1:]):
        from lsexp.tracking import supervisor

        # The job runs in a child, so that its teardown overlaps the worker's last writes.
        report_fd = supervisor.fork_job()
        # Before Hydra is even imported: the worker's ~1.5 s of mlflow imports then overlap Hydra's
        # and MindSpore's, while the job still uses one core.
        tracking_worker.start_early(report_fd)
    from lsexp.app import main as app

    app()
