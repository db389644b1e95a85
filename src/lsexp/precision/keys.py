"""The values precision.* takes, as plain data: the config's checks read them without MindSpore."""

RECIPES = ("none", "delayed", "current", "mx")
# Transformer Engine's recipe.Format, and Ascend's HiFloat8
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2", "HIF8")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
MX_BLOCK_SIZES = (32,)
ROUNDINGS = ("even", "away")
