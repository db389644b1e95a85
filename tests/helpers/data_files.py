"""Small synthetic data sets written in the real on-disk formats MindSpore's loaders read.

Tests and benchmarks need MnistDataset, Cifar10Dataset and ImageFolderDataset to run for real,
without downloads. Mocking the loaders would skip exactly the code we want to exercise, and the
files cannot simply be shrunk: MindSpore's Cifar10Dataset rejects any .bin file that is not a
whole 10000-record batch ("Invalid cifar10 file"). So these helpers write full-format files whose
pixels are learnable: every class has a fixed, seeded prototype image and each sample is its
class prototype plus uniform noise, so a small CNN separates the classes within one epoch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_RECORDS_PER_FILE = 10000

# Prototype pixels lie in 0..191 and noise in 0..63, so their uint8 sum never exceeds 254:
# no clipping pass and no wider intermediate dtype are needed (keeps the 176 MB CIFAR write fast).
_PROTO_MAX = 192
_NOISE_MASK = 0x3F
# Prototypes are drawn at 1/4 resolution and upsampled, so they have spatial structure a conv can use.
_BLOCK = 4


def _prototypes(rng: np.random.Generator, classes: int, shape: tuple[int, ...]) -> np.ndarray:
    """One blocky uint8 pattern per class, of shape (classes, *shape) with shape = (H, W, ...)."""
    h, w, *rest = shape
    coarse = rng.integers(0, _PROTO_MAX, size=(classes, -(-h // _BLOCK), -(-w // _BLOCK), *rest),
                          dtype=np.uint8)
    fine = coarse.repeat(_BLOCK, axis=1).repeat(_BLOCK, axis=2)
    return np.ascontiguousarray(fine[:, :h, :w])


def _balanced_labels(rng: np.random.Generator, n: int, classes: int) -> np.ndarray:
    return rng.permutation(np.arange(n) % classes).astype(np.uint8)


def _samples(
    rng: np.random.Generator, protos: np.ndarray, labels: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """protos[labels] + noise, written into `out` (shape (n, *protos.shape[1:]), uint8) if given."""
    shape = (len(labels), *protos.shape[1:])
    size = int(np.prod(shape))
    # Raw 64-bit draws viewed as bytes are several times faster than rng.integers(dtype=uint8),
    # which is most of write_cifar10's run time otherwise.
    noise = rng.bit_generator.random_raw(-(-size // 8)).view(np.uint8)[:size].reshape(shape)
    noise &= _NOISE_MASK
    return np.add(noise, protos[labels], out=out)


def _write_idx(path: Path, magic: int, array: np.ndarray) -> None:
    header = np.array([magic, *array.shape], dtype=">u4")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_mnist(root: Path, train: int = 60000, test: int = 10000, seed: int = 0) -> Path:
    """Write the four uncompressed MNIST IDX files into root; returns root (MnistDataset's dataset_dir).

    MnistDataset takes the record count from the headers, so train/test may be any size >= 1.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    protos = _prototypes(rng, 10, (28, 28))
    for prefix, n in (("train", train), ("t10k", test)):
        labels = _balanced_labels(rng, n, 10)
        _write_idx(root / f"{prefix}-images-idx3-ubyte", 2051, _samples(rng, protos, labels))
        _write_idx(root / f"{prefix}-labels-idx1-ubyte", 2049, labels)
    return root


def write_cifar10(root: Path, seed: int = 0) -> Path:
    """Write root/cifar-10-batches-bin/ (5 train batches, test_batch.bin, batches.meta.txt).

    Returns the cifar-10-batches-bin folder itself, which is what Cifar10Dataset's dataset_dir wants.
    Each .bin holds exactly 10000 records of <label byte><1024 R><1024 G><1024 B>.
    """
    folder = Path(root) / "cifar-10-batches-bin"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    protos = _prototypes(rng, 10, (32, 32, 3)).transpose(0, 3, 1, 2).reshape(10, 3072)  # channel-planar
    n = CIFAR10_RECORDS_PER_FILE
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    records = np.empty((n, 1 + 3072), dtype=np.uint8)
    for name in names:
        labels = _balanced_labels(rng, n, 10)
        records[:, 0] = labels
        _samples(rng, protos, labels, out=records[:, 1:])
        records.tofile(folder / name)
    (folder / "batches.meta.txt").write_text("\n".join(CIFAR10_CLASSES) + "\n\n")
    return folder


def write_image_folder(root: Path, classes: int = 3, per_class: int = 20, size: int = 16,
                       seed: int = 0) -> Path:
    """Write root/class_<i>/<j>.png RGB images (size x size); returns root (ImageFolderDataset's dataset_dir).

    ImageFolderDataset orders classes and files by name, so both are zero-padded to keep that order
    numeric: record k is class k // per_class, file k % per_class.
    """
    from PIL import Image

    root = Path(root)
    rng = np.random.default_rng(seed)
    protos = _prototypes(rng, classes, (size, size, 3))
    cw, fw = len(str(classes - 1)), len(str(per_class - 1))
    for c in range(classes):
        folder = root / f"class_{c:0{cw}d}"
        folder.mkdir(parents=True, exist_ok=True)
        images = _samples(rng, protos, np.full(per_class, c, dtype=np.intp))
        for j, image in enumerate(images):
            Image.fromarray(image).save(folder / f"{j:0{fw}d}.png")
    return root
