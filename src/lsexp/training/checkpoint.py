"""checkpoint.ckpt: the train step whole (network, optimizer, the strategy's state, the step counter),
plus the updates skipped so far, so that a resumed run continues the straight run's history."""

from __future__ import annotations

from pathlib import Path

from lsexp.config.errors import ConfigError

CHECKPOINT = "checkpoint.ckpt"
# rewritten every step, or before a replay, never read across steps: neither saved nor required on resume
# (the taps' probes, the weights a no-drop step keeps for the locator, inject.layer's factor, the
# gradients a histogram step keeps)
SCRATCH = ("lsexp_scale_used", "lsexp_tap.", "lsexp_shadow.", "lsexp_inject_factor", "lsexp_grad_snapshot")


def resume(step_cell, path: str, strategy, engine: str) -> tuple[int, int]:
    """Load a checkpoint into the train step; returns (steps done, updates skipped so far)."""
    import mindspore as ms

    params = ms.load_checkpoint(path)
    missing, _ = ms.load_param_into_net(step_cell, params)
    missing = [name for name in missing if not name.startswith(SCRATCH)]
    lost_state = [name for name in strategy.state_names(engine) if name in missing]
    if lost_state:
        raise ConfigError(
            [
                f"train.resume={path}: the checkpoint lacks {', '.join(lost_state[:3])}, the state "
                f"of loss_scale={strategy.name} under engine={engine}; it was saved with another "
                f"loss_scale or engine, so resume with the config it was saved with"
            ]
        )
    if missing:
        raise ConfigError(
            [
                f"train.resume={path}: the checkpoint lacks {', '.join(missing[:3])}; it was saved "
                f"by a different model, loss_scale or engine, so resume with the config it was saved with"
            ]
        )
    return int(step_cell.lsexp_step.asnumpy()), int(params["lsexp_skipped_steps"].asnumpy())


def save(step_cell, path: Path, step: int, skipped: int) -> None:
    import mindspore as ms

    step_cell.lsexp_step.set_data(ms.Tensor(step, ms.int32))
    ms.save_checkpoint(step_cell, str(path), append_dict={"lsexp_skipped_steps": skipped},
                       choice_func=lambda name: not name.startswith(SCRATCH))
