"""The `lsexp` command. `lsexp report ...` skips Hydra and MindSpore; anything else is a Hydra run."""

import sys


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        from lsexp.report import main as report

        sys.exit(report(sys.argv[2:]))
    from lsexp.app import main as app

    app()
