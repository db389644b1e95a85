"""The model group: one module per family (the nn.Cell) and its schema beside it (`<family>_schema.py`).

A schema module imports nothing heavy, so every config can be composed and checked before MindSpore
is imported; it holds `SCHEMA` (the typed keys, registered as `base_<family>`) and may hold
`problems(cfg)`, the checks a type cannot express. lsexp.config.families finds them; nothing central
lists them.
"""
