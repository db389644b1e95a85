"""The config is the API: the typed schema of every group (schema), the one error every check raises
(errors), the facts derived from a composed config (facts), where the model, data set and strategy
families are found (families), and the registration of it all with Hydra's ConfigStore (registry).

Nothing here imports MindSpore, and nothing here imports another lsexp package: every other package
may import this one.
"""
