"""Reports from the MLflow store: a sweep's comparison (sweep), its study's table and figure (studies),
and `lsexp report` (cli)."""
