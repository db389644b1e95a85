"""What lsexp decides when a job starts, beside the composed config, which it leaves as composed: the
optimizer's loss_scale, MindSpore's kernel threads, the cores the job is bound to, oneDNN's cap and,
for a data-parallel rank, its shard. Runs log these under the keys they fill (optimizer.loss_scale,
device.threads_num, ...), so a run's params say what it ran with."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from typing import Dict, Iterator, List, Optional, Tuple

from lsexp import device


@dataclass(frozen=True)
class Decided:
    optimizer_loss_scale: float
    threads_num: Optional[int] = None
    onednn_max_cpu_isa: Optional[str] = None
    affinity_cpu_list: Optional[List[int]] = None
    shard: Tuple[int, int] = (1, 0)  # (num_shards, shard_id): a data-parallel rank's part of each batch

    def params(self) -> Dict[str, object]:
        """The config keys these fill, with the values decided."""
        return {"optimizer.loss_scale": self.optimizer_loss_scale, "device.threads_num": self.threads_num,
                "device.onednn_max_cpu_isa": self.onednn_max_cpu_isa,
                "device.affinity_cpu_list": self.affinity_cpu_list}

    def for_rank(self, num_shards: int, shard_id: int) -> "Decided":
        return replace(self, shard=(num_shards, shard_id))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Decided":
        return cls(**{**d, "shard": tuple(d["shard"]),
                      "affinity_cpu_list": list(d["affinity_cpu_list"]) if d["affinity_cpu_list"] else None})


@contextlib.contextmanager
def decide(cfg, optimizer_loss_scale: float, parallel_jobs: int) -> Iterator[Decided]:
    """The job's decisions, holding its share of the cores while it runs: device.threads_num split among
    the jobs that share the machine, the calibrated cap `auto` stands for, and the optimizer's scale (as
    given, or the strategy's)."""
    dev = cfg.device
    opt = cfg.optimizer.get("loss_scale")
    with device.cpu_share(dev.affinity_cpu_list, parallel_jobs) as cpus:
        yield Decided(optimizer_loss_scale=float(opt) if opt is not None else float(optimizer_loss_scale),
                      threads_num=device.threads_for(dev.threads_num, parallel_jobs),
                      onednn_max_cpu_isa=device.onednn_isa(dev), affinity_cpu_list=cpus)
