"""MLflow tracking: the job's run (run), the worker process that owns it (worker, supervisor, protocol),
the store and its database (store, database) and URIs with their credentials redacted (uri)."""
