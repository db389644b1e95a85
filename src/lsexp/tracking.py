"""Tracking backends. Placeholder until MLflow lands."""
import contextlib


class _NoTracker:
    def record(self, history, out_dir):
        pass


@contextlib.contextmanager
def tracker(cfg, out_dir):
    yield _NoTracker()
