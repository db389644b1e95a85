"""The seed article's LeNet5, layer for layer; the dense input follows image_size (400 at 32x32)."""

from mindspore import nn
from mindspore.common.initializer import Normal


def feature_size(image_size: int) -> int:
    """Side of conv2's pooled output: two valid 5x5 convolutions, each followed by a 2x2 max-pool."""
    return ((image_size - 4) // 2 - 4) // 2


class LeNet5(nn.Cell):
    def __init__(self, num_class: int = 10, num_channel: int = 1, image_size: int = 32):
        super().__init__()
        side = feature_size(image_size)
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = nn.Dense(16 * side * side, 120, weight_init=Normal(0.02))
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
