"""Flatten, then Dense+ReLU per entry of hidden_units, then Dense to num_class."""

from mindspore import nn
from mindspore.common.initializer import Normal


class MLP(nn.Cell):
    def __init__(self, num_class: int = 10, num_channel: int = 1, image_size: int = 32,
                 hidden_units=(256, 128)):
        super().__init__()
        widths = [num_channel * image_size * image_size, *hidden_units]
        layers = [nn.Flatten()]
        for w_in, w_out in zip(widths, widths[1:]):
            layers += [nn.Dense(w_in, w_out, weight_init=Normal(0.02)), nn.ReLU()]
        layers.append(nn.Dense(widths[-1], num_class, weight_init=Normal(0.02)))
        self.layers = nn.SequentialCell(layers)

    def construct(self, x):
        return self.layers(x)
