"""What amp.level=auto's step costs against O1's and O2's, alternating in one process, timed over epochs 2
to the last:

    python benchmarks/amp_cost.py [pairs] [overrides ...]
    python benchmarks/amp_cost.py record [overrides ...]   what recording casts.csv adds to a run's start

Each round runs amp=auto, amp=O1 and amp=O2 on the default experiment with loss_scale=dynamic from 2^10
(no step overflows), plus the overrides (model=mlp dataset=digits for the MLP, workload=gpt_python ... for
the GPT). auto casts operator by operator (MindSpore's auto white and black lists), O1 casts its white-listed
cells' inputs, O2 every cell but its black list's.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from handwritten_loop import lsexp_loop
from ratios import report

COMMON = ("loss_scale=dynamic", "loss_scale.init_loss_scale=1024")
LEVELS = ("amp=auto", "amp=O1", "amp=O2")


def main(pairs: int, overrides: list) -> None:
    ms_per_step = {level: [] for level in LEVELS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for level in LEVELS:
                ms_per_step[level].append(lsexp_loop(Path(tmp), i, *COMMON, *overrides, level))
    note = " ".join(COMMON + tuple(overrides))
    for other in LEVELS[1:]:
        report({LEVELS[0]: ms_per_step[LEVELS[0]], other: ms_per_step[other]}, f"auto / {other[4:]}", note)


def record(overrides: list) -> None:
    """Seconds lsexp.training.build.record_casts takes at amp=auto: the copy built, compiled with the IR
    dump on, the map read and written."""
    import time

    import mindspore as ms
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lsexp.config import paths
    from lsexp.config.registry import register_configs
    from lsexp.training.build import load_data, record_casts

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(paths.conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["amp=auto", *overrides])
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    data = load_data(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        record_casts(cfg, data, Path(tmp))
        print(f"record_casts: {time.perf_counter() - started:.2f} s ({' '.join(['amp=auto', *overrides])})")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "record":
        record(args[1:])
    else:
        main(int(args[0]) if args else 5, args[1:])
