"""Where the configs are: inside the package when installed from a wheel, at the top of a checkout
otherwise; and lsexp's cache folder on this machine."""

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # src/lsexp, or lsexp/ inside a wheel


def _find(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"lsexp: cannot find its {name}/ folder next to {_PACKAGE}; reinstall lsexp")


def conf_dir() -> Path:
    return _find("conf")


def experiments_dir() -> Path:
    return _find("experiments")


def cache_dir() -> Path:
    """$LSEXP_CACHE_DIR, else the XDG cache folder's lsexp/ (~/.cache/lsexp): oneDNN's calibration and
    the C++ kernels, once per machine."""
    if os.environ.get("LSEXP_CACHE_DIR"):
        return Path(os.environ["LSEXP_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "lsexp"
