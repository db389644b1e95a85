"""Training: build the run (build), the loop (loop), history.csv (history), checkpoints (checkpoint),
the held-out evaluation (evaluate) and the gradient probe (telemetry)."""
