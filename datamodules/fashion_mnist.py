"""Fashion-MNIST (Zalando article images) as an :class:`IDXImageDataModule`."""

from __future__ import annotations

from lightning_dpgan.data.download import RemoteFile
from lightning_dpgan.datamodules.images import IDXImageDataModule

MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)


def _remote(name: str, md5: str, size: int) -> RemoteFile:
    return RemoteFile.mirrored(name, MIRRORS, md5, size)


class FashionMNISTDataModule(IDXImageDataModule):
    """Fashion-MNIST clothing images: 60k train / 10k test 28x28 grayscale images, 10 classes.

    Checksums are of the decompressed content, so both the canonical gz files and Debian's
    recompressed ones (package ``dataset-fashion-mnist``) are accepted.
    """

    name = "fashion-mnist"
    subdirs = ("fashion-mnist", "fashion_mnist", "FashionMNIST/raw")
    files = {
        "train": (
            _remote("train-images-idx3-ubyte.gz", "f4a8712d7a061bf5bd6d2ca38dc4d50a", 47_040_016),
            _remote("train-labels-idx1-ubyte.gz", "9018921c3c673c538a1fc5bad174d6f9", 60_008),
        ),
        "test": (
            _remote("t10k-images-idx3-ubyte.gz", "8181f5470baa50b63fa0f6fddb340f0a", 7_840_016),
            _remote("t10k-labels-idx1-ubyte.gz", "15d484375f8d13e6eb1aabb0c3f46965", 10_008),
        ),
    }
    classes = [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ]
