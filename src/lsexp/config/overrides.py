"""Hydra overrides as typed on a command line or kept in a run's tags."""

from __future__ import annotations

from typing import Dict, Iterable


def overrides_dict(overrides: Iterable[str]) -> Dict[str, str]:
    """Hydra overrides (`+a.b=1`, `amp=O2`) as key -> value, the add/delete prefixes dropped."""
    return dict(o.lstrip("+~").partition("=")[::2] for o in overrides)
