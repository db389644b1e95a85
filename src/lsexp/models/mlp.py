"""Flatten, then Dense+ReLU per entry of hidden_units, then Dense to num_class; with scaling=unit, the
unit-scaled Dense, ReLU and cross-entropy gradient of lsexp.models.unit."""

from mindspore import nn
from mindspore.common.initializer import Normal


class MLP(nn.Cell):
    def __init__(self, num_class: int = 10, num_channel: int = 1, image_size: int = 32,
                 hidden_units=(256, 128), scaling: str = "standard"):
        super().__init__()
        widths = [num_channel * image_size * image_size, *hidden_units]
        if scaling == "unit":
            from lsexp.models.unit import UnitCrossEntropyGrad, UnitDense, UnitReLU

            dense, relu = UnitDense, UnitReLU
        else:
            dense, relu = (lambda w_in, w_out: nn.Dense(w_in, w_out, weight_init=Normal(0.02))), nn.ReLU
        layers = [nn.Flatten()]
        for w_in, w_out in zip(widths, widths[1:]):
            layers += [dense(w_in, w_out), relu()]
        if scaling == "unit":  # the read-out unconstrained, as the library's own models read out logits
            layers += [UnitDense(widths[-1], num_class, constraint=None), UnitCrossEntropyGrad(num_class)]
        else:
            layers.append(dense(widths[-1], num_class))
        self.layers = nn.SequentialCell(layers)

    def construct(self, x):
        return self.layers(x)
