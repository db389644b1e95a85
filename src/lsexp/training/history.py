"""A run's steps as they happen, and history.csv, which is what every report and comparison reads."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

HISTORY_COLUMNS = ("step", "epoch", "loss", "loss_scale", "overflow", "skipped_steps")
INTEGER_COLUMNS = ("step", "epoch", "overflow", "skipped_steps", "clipped")
STRING_COLUMNS = ("first_nonfinite_layer", "first_nonfinite_pass")  # the rest are floats


@dataclass
class History:
    """Every step of a run, kept on the host; written out even when the run is interrupted."""

    rows: List[Dict[str, float]] = field(default_factory=list)
    epoch_eval: List[Dict[str, float]] = field(
        default_factory=list
    )  # {"epoch", "step", "eval_accuracy", "eval_loss"}
    on_epoch: Optional[Callable[["History"], None]] = None  # e.g. stream to the tracker between epochs

    def write_csv(self, path: Path) -> None:
        columns = list(HISTORY_COLUMNS) + [
            k for k in (self.rows[0] if self.rows else {}) if k not in HISTORY_COLUMNS
        ]
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)


def read_history(path: Path) -> List[Dict[str, float]]:
    with open(path, newline="") as f:
        return [
            {k: int(v) if k in INTEGER_COLUMNS else v if k in STRING_COLUMNS else float(v)
             for k, v in row.items()}
            for row in csv.DictReader(f)
        ]
