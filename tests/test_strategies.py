"""A strategy is its schema module, its object and its YAML: one written from outside lsexp, found through
PYTHONPATH and hydra.searchpath, trains under both engines with nothing of lsexp edited."""

import csv
import json
import textwrap

import pytest

from conftest import run_cli

SCHEMA = '''
from dataclasses import dataclass
from typing import List

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, scale_ok


@dataclass
class HalvingConfig(LossScaleConfig):
    _target_: str = "halving.HalvingLossScaleManager"
    init_loss_scale: float = 1024.0


class Halving(Strategy):
    """Back off at every overflow, never grow."""

    name = "halving"
    changes = True

    @property
    def scale(self) -> float:
        return float(self.config.init_loss_scale)

    @property
    def floor(self) -> float:
        return 1.0

    def problems(self, cfg) -> List[str]:
        ls = self.config
        if not scale_ok(ls.init_loss_scale):
            return [f"loss_scale.init_loss_scale={ls.init_loss_scale}: must be >= 1; e.g. 1024"]
        return super().problems(cfg)

    def scaler(self):
        from halving import HalvingLossScaler

        return HalvingLossScaler(self.scale)


SCHEMA, STRATEGY = HalvingConfig, Halving
'''

MODULE = '''
from mindspore.amp import DynamicLossScaleManager, DynamicLossScaler

NEVER = 2**30  # steps: a window no run reaches


class HalvingLossScaleManager(DynamicLossScaleManager):
    def __init__(self, init_loss_scale: float = 1024.0):
        super().__init__(init_loss_scale, scale_factor=2, scale_window=NEVER)


class HalvingLossScaler(DynamicLossScaler):
    def __init__(self, scale_value: float):
        super().__init__(scale_value, 2, NEVER)
'''


def _write_strategy(root):
    root.mkdir()
    (root / "halving_schema.py").write_text(SCHEMA)
    (root / "halving.py").write_text(MODULE)
    (root / "conf" / "loss_scale").mkdir(parents=True)
    (root / "conf" / "loss_scale" / "halving.yaml").write_text(textwrap.dedent("""\
        # Halve the scale at every overflow and never grow it: a strategy lsexp does not ship.
        _target_: halving.HalvingLossScaleManager
        init_loss_scale: 1024.0
    """))
    return ["loss_scale=halving", f"hydra.searchpath=[file://{root / 'conf'}]"]


@pytest.mark.slow  # in CI's slow session: the default suite stays under 10 minutes
def test_a_strategy_from_outside_lsexp_trains_under_both_engines(tmp_path):
    args = _write_strategy(tmp_path / "mine")
    out = run_cli("-m", *args, "engine=cell,functional", "amp=O2", "train.max_steps=8",
                  "inject.overflow_steps=[3,5]", "tracking=none", "train.progress=false",
                  f"hydra.sweep.dir={tmp_path / 'runs'}", "hydra.sweep.subdir=${engine.name}", cwd=tmp_path,
                  env={"PYTHONPATH": str(tmp_path / "mine")})
    assert out.returncode == 0, out.stderr[-3000:]
    columns = {}
    for engine in ("cell", "functional"):
        summary = json.loads((tmp_path / "runs" / engine / "summary.json").read_text())
        assert summary["strategy"] == "halving" and "halving" in summary["run_name"]
        with open(tmp_path / "runs" / engine / "history.csv") as f:
            rows = list(csv.DictReader(f))
        columns[engine] = [(float(r["loss_scale"]), int(r["overflow"]), int(r["skipped_steps"]))
                           for r in rows]
    # the scale each step used: halved after each injected overflow, whose update is skipped
    assert [s for s, _, _ in columns["cell"]] == [1024, 1024, 1024, 512, 512, 256, 256, 256]
    assert [o for _, o, _ in columns["cell"]] == [0, 0, 1, 0, 1, 0, 0, 0]
    assert columns["cell"][-1][2] == 2
    assert columns["functional"] == columns["cell"]


def test_a_strategy_from_outside_lsexp_is_validated_by_its_own_schema_and_checks(tmp_path):
    args = _write_strategy(tmp_path / "mine")
    env = {"PYTHONPATH": str(tmp_path / "mine")}
    out = run_cli(*args, "loss_scale.init_loss_scale=0.5", "tracking=none", cwd=tmp_path, env=env)
    assert out.returncode == 2
    assert out.stderr.strip() == ("lsexp: config error: loss_scale.init_loss_scale=0.5: "
                                  "must be >= 1; e.g. 1024")
    out = run_cli(*args, "+loss_scale.window=3", "tracking=none", cwd=tmp_path, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("lsexp: config error: loss_scale: ") and "window" in out.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("engine", ["cell", "functional"])
@pytest.mark.slow  # out of the quick suite, which holds 6 minutes (docs/testing.md)
def test_each_strategys_state_names_are_in_its_checkpoint(train_run, engine):
    import mindspore as ms

    from conftest import compose_cfg
    from lsexp.strategies import resolve

    for option in ("dynamic", "dynamic_hysteresis"):
        overrides = (f"loss_scale={option}", f"engine={engine}", "amp=O2", "train.max_steps=2",
                     "train.checkpoint=true")
        _, _, out = train_run(*overrides)
        saved = ms.load_checkpoint(str(out / "checkpoint.ckpt"))
        names = resolve(compose_cfg(*overrides)).state_names(engine)
        assert names and set(names) <= set(saved), (option, names, sorted(saved))
