"""Which cells run in which precision: amp.level through MindSpore's own auto_mixed_precision (O0-O3, and
auto, which casts by operator type from MindSpore's auto white and black lists), the cast lists of
amp.white_list and amp.black_list on top of it (lsexp.amp.lists), and the cast map of the compiled
network that casts.csv records (lsexp.amp.graph).

Nothing here imports MindSpore at import time: preflight reads the rules below."""

from __future__ import annotations

from typing import List, Optional

# amp.black_list keeps cells in float32 where the level runs them in low precision; amp.white_list runs
# cells in low precision where the level keeps them in float32. custom_mixed_precision takes one list.
BLACK_LEVELS = ("O2", "O3", "auto")
WHITE_LEVELS = ("O0", "O1")


def lists_of(amp) -> tuple:
    """(white_list, black_list) of the amp group, each a list of names or None."""
    white, black = amp.get("white_list"), amp.get("black_list")
    return (list(white) if white else None), (list(black) if black else None)


# the levels under which lsexp emulates bfloat16 on a CPU (lsexp.amp.emulated): those that cast whole
# cells (and O0's white list); O1 rewrites the network's source and auto casts operator by operator
EMULATED_LEVELS = ("O2", "O3")


def emulates(amp, target: str) -> bool:
    """Whether a run on the device target emulates bfloat16, its CPU kernels lacking it
    (lsexp.amp.emulated)."""
    white, _ = lists_of(amp)
    cast = amp.level in EMULATED_LEVELS or (amp.level == "O0" and bool(white))
    return amp.dtype == "bfloat16" and cast and target == "CPU"


def records(amp, target: str) -> bool:
    """Whether the run records its cast map (casts.csv): under amp.level=auto, with a cast list, and where
    it emulates bfloat16."""
    white, black = lists_of(amp)
    return amp.level == "auto" or bool(white) or bool(black) or emulates(amp, target)


def problems(cfg) -> List[str]:
    """The amp group's keys: the level, the low-precision type and the cast lists."""
    from lsexp.config.schema import AMP_DTYPES, AMP_LEVELS

    amp, p = cfg.amp, []
    if amp.level not in AMP_LEVELS:
        p.append(f"amp.level={amp.level}: unknown amp level; use one of {', '.join(AMP_LEVELS)}")
    if amp.dtype not in AMP_DTYPES:
        p.append(f"amp.dtype={amp.dtype}: unknown low-precision type; use float16 or bfloat16")
    return p + list_problems(amp)


def list_problems(amp) -> List[str]:
    """The cast lists against amp.level, before the network is built."""
    white, black = lists_of(amp)
    p = []
    if white and black:
        p.append("amp.white_list with amp.black_list: custom_mixed_precision takes one list; keep the one "
                 "your level needs (white at O0/O1, black at O2/O3/auto)")
    if black and amp.level not in BLACK_LEVELS:
        p.append(f"amp.black_list with amp.level={amp.level}: the level runs nothing in low precision that a "
                 f"black list could keep in float32; use amp.white_list, or amp=O2, O3 or auto")
    if white and amp.level not in WHITE_LEVELS:
        p.append(f"amp.white_list with amp.level={amp.level}: the level already runs the cells in low "
                 f"precision; use amp.black_list to keep some in float32, or amp=O0 or O1")
    return p


def name_problems(amp, net) -> Optional[str]:
    """The one line refusing a name in a cast list that names no cell of `net`, or None."""
    from lsexp.amp.lists import valid_names

    white, black = lists_of(amp)
    key, names = ("amp.white_list", white) if white else ("amp.black_list", black)
    if not names:
        return None
    paths, classes = valid_names(net)
    unknown = [n for n in names if n not in paths and n not in classes]
    if not unknown:
        return None
    return (f"{key}={unknown[0]}: {type(net).__name__} has no cell of that name or class; use a cell name "
            f"({', '.join(paths)}) or a cell class ({', '.join(sorted(classes))})")
