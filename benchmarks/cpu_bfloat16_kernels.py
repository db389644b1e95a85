"""Which operators MindSpore"s CPU kernels compute in bfloat16: each on a small bfloat16 tensor, eagerly,
in its own process (a failed kernel selection can surface at a later operator). docs/casts.md quotes it.

    python benchmarks/cpu_bfloat16_kernels.py
"""
import subprocess
import sys

import numpy as np


def cases():
    import mindspore as ms
    from mindspore import Tensor, ops

    ms.set_device("CPU")
    a = Tensor(np.ones((2, 4, 8, 8), np.float32) * 0.5).astype(ms.bfloat16)
    m = Tensor(np.ones((4, 4), np.float32)).astype(ms.bfloat16)
    i = Tensor(np.array([0, 1], np.int32))
    return {
        "MatMul": lambda: ops.matmul(m, m), "BatchMatMul": lambda: ops.bmm(m[None], m[None]),
        "Conv2D": lambda: ops.conv2d(a, Tensor(np.ones((4, 4, 3, 3), np.float32)).astype(ms.bfloat16)),
        "Gather": lambda: ops.gather(m, i, 0), "Flatten": lambda: ops.flatten(a),
        "ReLU": lambda: ops.relu(m), "GeLU": lambda: ops.gelu(m), "Softmax": lambda: ops.softmax(m),
        "Exp": lambda: ops.exp(m), "Log": lambda: ops.log(m), "Sqrt": lambda: ops.sqrt(m),
        "Tanh": lambda: ops.tanh(m),
        "ReduceSum": lambda: m.sum(), "ReduceMean": lambda: m.mean(), "ReduceMax": lambda: m.max(),
        "MaxPool": lambda: ops.max_pool2d(a, 2, 2), "AvgPool": lambda: ops.avg_pool2d(a, 1, 2),
        "BiasAdd": lambda: ops.bias_add(m, m[0]),
        "LayerNorm": lambda: ops.layer_norm(m, (4,), m[0], m[0]),
        "BatchNorm": lambda: ops.batch_norm(a, ops.zeros(4), ops.ones(4), m[0], m[0], training=True),
        "Add": lambda: m + m, "Mul": lambda: m * m, "RealDiv": lambda: m / m, "Sub": lambda: m - m,
        "Maximum": lambda: ops.maximum(m, m), "Transpose": lambda: m.T, "Concat": lambda: ops.concat((m, m)),
        "IsFinite": lambda: ops.isfinite(m), "Greater": lambda: m > m, "Neg": lambda: -m,
        "Select": lambda: ops.where(Tensor(np.ones((4, 4), np.bool_)), m, m),
        "Square": lambda: ops.square(m), "Pow": lambda: ops.pow(m, 2.0), "Erf": lambda: ops.erf(m),
        "Cast": lambda: ops.cast(m, ms.float32), "Reshape": lambda: m.reshape(16),
    }


def one(name: str) -> None:
    try:
        cases()[name]().asnumpy()
        print("has")
    except Exception as err:  # the kernel"s refusal, as MindSpore words it
        first = next((line for line in str(err).splitlines() if line.strip(" -")), type(err).__name__)
        print("lacks: " + first.strip()[:90])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(sys.argv[1])
    else:
        import mindspore as ms

        print(f"MindSpore {ms.__version__}, CPU, bfloat16 inputs")
        for name in cases():
            out = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True)
            print(f"{name:12s} {(out.stdout.strip().splitlines() or [out.stderr.strip()[-90:]])[-1]}")
