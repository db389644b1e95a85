"""lsexp: config-driven experiments on loss scaling in MindSpore mixed-precision training."""

__version__ = "0.1.0"
