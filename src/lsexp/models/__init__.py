"""The model group: one module per family (the nn.Cell) and its schema beside it (`<family>_schema.py`).

A schema module imports nothing heavy, so every config can be composed and checked before MindSpore
is imported; it holds `SCHEMA` (the typed keys, registered as `base_<family>`) and may hold
`problems(cfg)`, the checks a type cannot express. lsexp.config.families finds them; nothing central
lists them.
"""


def attention_size_problems(cfg) -> list:
    """The sizes a Transformer and a GPT share: every size >= 1, heads that divide the width, a dropout
    below 1, and positions for the data set's sequences."""
    m, p = cfg.model, []
    for key in ("vocab_size", "max_len", "num_layers", "d_model", "nhead", "dim_feedforward"):
        if m[key] < 1:
            p.append(f"model.{key}={m[key]}: must be >= 1")
    if m.nhead >= 1 and m.d_model >= 1 and m.d_model % m.nhead:
        p.append(f"model.d_model={m.d_model} with model.nhead={m.nhead}: d_model must be a multiple of nhead")
    if not 0 <= m.dropout < 1:
        p.append(f"model.dropout={m.dropout}: must be in [0, 1)")
    if "seq_len" in cfg.dataset and m.max_len < cfg.dataset.seq_len:
        p.append(f"model.max_len={m.max_len}: shorter than dataset.seq_len={cfg.dataset.seq_len}; raise it")
    return p


SCALINGS = ("standard", "unit")


def scaling_problems(cfg) -> list:
    """model.scaling, on the models that have it (lsexp.models.unit)."""
    if cfg.model.scaling not in SCALINGS:
        return [f"model.scaling={cfg.model.scaling}: use standard or unit (docs/unit_scaling.md)"]
    if cfg.model.scaling == "unit" and cfg.model.get("dropout", 0.0):
        return [f"model.dropout={cfg.model.dropout} with model.scaling=unit: the unit-scaled cells have no "
                f"dropout; set model.dropout=0.0"]
    return []
