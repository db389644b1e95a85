"""The CIFAR ResNet of He et al. 2016, section 4.2: 6n+2 layers in three stages of 16, 32 and 64
channels (times `width`), BatchNorm after every convolution, identity shortcuts (option A:
stride-2 subsampling, new channels zero-padded), global average pooling and one Dense layer.

BatchNorm is what tells amp O2 (kept in float32) from O3 (float16 too) apart on this network.
"""

from mindspore import nn, ops
from mindspore.common.initializer import HeNormal


def _conv3x3(c_in: int, c_out: int, stride: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, pad_mode="pad", padding=1, has_bias=False,
                     weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))


class BasicBlock(nn.Cell):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = _conv3x3(c_in, c_out, stride)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = _conv3x3(c_out, c_out, 1)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.downsample = stride != 1 or c_in != c_out

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.downsample:  # option A: no parameters, so the shortcut stays an identity
            # every second row and column; as a 1x1 pooling, since MindSpore 2.10's PyNative gradient of
            # the strided slice x[:, :, ::2, ::2] fails on a CPU ("StridedSliceGrad ... out of bounds")
            shortcut = ops.avg_pool2d(x, kernel_size=1, stride=2)
            shortcut = ops.concat((shortcut, ops.zeros_like(shortcut)), axis=1)
        return self.relu(out + shortcut)


class ResNet(nn.Cell):
    def __init__(self, num_class: int = 10, num_channel: int = 3, image_size: int = 32, depth: int = 20,
                 width: int = 1):
        super().__init__()
        del image_size  # global average pooling takes any size the stages leave
        blocks = (depth - 2) // 6
        channels = [16 * width, 32 * width, 64 * width]
        self.stem = nn.SequentialCell([_conv3x3(num_channel, channels[0], 1), nn.BatchNorm2d(channels[0]),
                                       nn.ReLU()])
        layers, c_in = [], channels[0]
        for stage, c_out in enumerate(channels):
            for i in range(blocks):
                layers.append(BasicBlock(c_in, c_out, 2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.stages = nn.SequentialCell(layers)
        self.head = nn.Dense(c_in, num_class)

    def construct(self, x):
        x = self.stages(self.stem(x))
        return self.head(x.mean(axis=(2, 3)))
