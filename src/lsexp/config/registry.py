"""Every schema and experiment registered with Hydra's ConfigStore, before anything is composed."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from lsexp.config import families, paths
from lsexp.config.schema import (
    AmpConfig,
    Config,
    DeviceConfig,
    EngineConfig,
    ParallelConfig,
    PrecisionConfig,
    TelemetryConfig,
    TrackingConfig,
    TrainConfig,
)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group in families.PACKAGES:  # the families' schemas: base_lenet5, base_mnist, base_fixed, ...
        for name, module in families.schemas(group).items():
            cs.store(group=group, name=f"base_{name}", node=module.SCHEMA)
    for group, name, node in [
        ("amp", "base_amp", AmpConfig),
        ("engine", "base_engine", EngineConfig),
        ("device", "base_device", DeviceConfig),
        ("train", "base_train", TrainConfig),
        ("tracking", "base_tracking", TrackingConfig),
        ("telemetry", "base_telemetry", TelemetryConfig),
        ("parallel", "base_parallel", ParallelConfig),
        ("precision", "base_precision", PrecisionConfig),
    ]:
        cs.store(group=group, name=name, node=node)
    # experiments/ sits at the top of the checkout; ConfigStore makes its files the options of
    # the `experiment` group, so `experiment=seed_blog` works from a checkout and from a wheel.
    for path in sorted(paths.experiments_dir().glob("*.yaml")):
        cs.store(group="experiment", name=path.stem, node=OmegaConf.load(path), package="_global_")
