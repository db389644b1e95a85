"""The networks. LeNet5 is the seed article's, layer for layer."""

from mindspore import nn
from mindspore.common.initializer import Normal


class LeNet5(nn.Cell):
    def __init__(self, num_class: int = 10, num_channel: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = nn.Dense(16 * 5 * 5, 120, weight_init=Normal(0.02))
        self.fc2 = nn.Dense(120, 84, weight_init=Normal(0.02))
        self.fc3 = nn.Dense(84, num_class, weight_init=Normal(0.02))
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


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
