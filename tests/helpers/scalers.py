"""A strategy's scaler driven by a sequence of overflow flags, outside a train step but compiled as one
runs it: the update cell as the cell engine's step calls it, or the LossScaler's adjust as the
functional engine's step calls it. For the parity tests against the reference transcriptions."""

from typing import Dict, List, Sequence, Tuple


def configure():
    """Graph mode and the oneDNN cap, as a run sets them."""
    from conftest import compose_cfg
    from lsexp import device

    cfg = compose_cfg()
    device.configure(cfg.device, cfg.train.mode, None, device.onednn_isa(cfg.device))


def columns(manager, flags: Sequence[int], engine: str, state: Sequence[str] = ()
            ) -> Tuple[List[float], Dict[str, List[int]]]:
    """The scale each step uses and, per name in `state`, that state Parameter's value at that step."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn

    if engine == "cell":
        cell = manager.get_update_cell()
        scale = Parameter(Tensor(manager.get_loss_scale(), ms.float32), name="scale")
        holder = cell

        def step(flag):
            cell(scale, Tensor(bool(flag)))
    else:
        class Adjust(nn.Cell):
            def __init__(self, scaler):
                super().__init__()
                self.scaler = scaler

            def construct(self, finite):
                return self.scaler.adjust(finite)

        scaler = manager.get_loss_scaler()
        scale, holder, adjust = scaler.scale_value, scaler, Adjust(scaler)

        def step(flag):
            adjust(Tensor(not flag))
    scales, seen = [], {name: [] for name in state}
    for flag in flags:
        scales.append(float(scale.asnumpy()))
        for name in state:
            seen[name].append(int(getattr(holder, name).asnumpy()))
        step(flag)
    return scales, seen
