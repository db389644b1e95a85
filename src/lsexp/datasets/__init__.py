"""The dataset group: one module per data set (what its `_target_` calls) and its schema beside it
(`<name>_schema.py`, imports nothing heavy: the keys, the file checks, the training-set size).

A data set tells the model its shapes and class count through its keys (`${dataset.num_classes}`).
"""

from __future__ import annotations

import re
from typing import List


def problems(cfg) -> List[str]:
    """dataset.batch_size, the data set's files and keys, then whether the model can take what the data
    set gives (its sizes come from the data set, so they mean nothing before)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from lsexp.config import families

    if cfg.dataset.batch_size < 1:
        return [f"dataset.batch_size={cfg.dataset.batch_size}: must be >= 1; e.g. 32"]
    dataset, model = families.of("dataset", cfg.dataset._target_), families.of("model", cfg.model._target_)
    p = list(getattr(dataset, "problems", lambda _: [])(cfg))
    if p:
        return p
    try:
        m = OmegaConf.to_container(cfg.model, resolve=True)
    except OmegaConfBaseException as err:
        key = re.search(r"dataset\.(\w+)", str(err))
        kind = ("model=transformer for token data" if "vocab_size" in cfg.dataset
                else "an image model, e.g. model=resnet")
        return [f"model._target_={cfg.model._target_}: takes dataset.{key.group(1) if key else '?'}, which "
                f"dataset._target_={cfg.dataset._target_} does not have; pick a model made for this "
                f"data set: {kind}"]
    if m.get("num_class", 1) < 1:
        p.append(f"model.num_class={m['num_class']}: a classifier needs >= 1 class; leave it to the data set")
    for key in ("num_channel", "image_size"):
        if key in m and key in cfg.dataset and m[key] != cfg.dataset[key]:
            p.append(f"model.{key}={m[key]} but dataset.{key}={cfg.dataset[key]}: the model would not fit "
                     f"the data; set them equal, or leave model.{key} to follow the data set")
    if model is not None and not p:
        p += getattr(model, "problems", lambda _: [])(cfg)
    return p
