"""The checks the Adam family's keys share (beta1, beta2, eps), before MindSpore sees them."""

from __future__ import annotations

from typing import List


def problems(cfg) -> List[str]:
    o, p = cfg.optimizer, []
    for key in ("beta1", "beta2"):
        if not 0 < o[key] < 1:
            p.append(f"optimizer.{key}={o[key]}: must be in (0, 1); e.g. {0.9 if key == 'beta1' else 0.999}")
    if not o.eps > 0:
        p.append(f"optimizer.eps={o.eps}: must be > 0; e.g. 1e-8")
    return p
