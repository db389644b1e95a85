"""The dataset group: one module per data set (what its `_target_` calls) and its schema beside it
(`<name>_schema.py`, imports nothing heavy: the keys, the file checks, the training-set size).

A data set tells the model its shapes and class count through its keys (`${dataset.num_classes}`).
"""
