"""The values precision.* takes, as plain data, and the checks of its keys: read without MindSpore."""

RECIPES = ("none", "delayed", "current", "mx")
# Transformer Engine's recipe.Format, and Ascend's HiFloat8
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2", "HIF8")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
MX_BLOCK_SIZES = (32,)
ROUNDINGS = ("even", "away")


def problems(cfg) -> list:
    """precision.* against the recipes and formats above."""
    pr, p = cfg.get("precision"), []
    if pr is None or pr.recipe == "none":
        return p
    if pr.recipe not in RECIPES:
        return [f"precision.recipe={pr.recipe}: no such recipe; use one of {', '.join(RECIPES)} "
                f"(conf/precision/: fp8_delayed, fp8_current, mxfp8, hif8_current)"]
    if pr.fp8_format not in FP8_FORMATS:
        p.append(f"precision.fp8_format={pr.fp8_format}: no such format; use one of {', '.join(FP8_FORMATS)}")
    if pr.recipe == "delayed":
        p += _delayed_problems(pr)
    if pr.recipe == "mx":
        p += _mx_problems(pr)
    if cfg.amp.level == "O0":
        p.append(f"precision={pr.recipe} with amp.level=O0: nothing runs in low precision for the recipe to "
                 f"scale; use amp=O2 (or amp=O1, O3)")
    return p


def _delayed_problems(pr) -> list:
    """The delayed recipe's keys: its margin and amax history."""
    p = []
    if pr.margin < 0:
        p.append(f"precision.margin={pr.margin}: must be >= 0 (the scale is 2^-margin * FP8_MAX / amax)")
    if pr.amax_history_len < 1:
        p.append(f"precision.amax_history_len={pr.amax_history_len}: must be >= 1 step; TE's default "
                 f"is 1024")
    if pr.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
        p.append(f"precision.amax_compute_algo={pr.amax_compute_algo}: use one of "
                 f"{', '.join(AMAX_COMPUTE_ALGOS)}")
    return p


def _mx_problems(pr) -> list:
    """The mx recipe's keys: OCP MX's block size and element formats, and how the elements round."""
    p = []
    if pr.block_size not in MX_BLOCK_SIZES:
        p.append(f"precision.block_size={pr.block_size}: OCP MX v1.0 defines blocks of "
                 f"{', '.join(map(str, MX_BLOCK_SIZES))} elements only; set precision.block_size=32")
    if pr.fp8_format == "HIF8":
        p.append("precision.fp8_format=HIF8 with precision.recipe=mx: MX's elements are OCP FP8; use "
                 "HYBRID, E4M3 or E5M2, or precision=hif8_current")
    if pr.rounding not in ROUNDINGS:
        p.append(f"precision.rounding={pr.rounding}: use one of {', '.join(ROUNDINGS)}")
    return p
