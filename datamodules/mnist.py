"""MNIST handwritten digits as an :class:`IDXImageDataModule`."""

from __future__ import annotations

from lightning_dpgan.data.download import RemoteFile
from lightning_dpgan.datamodules.images import IDXImageDataModule

MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)


def _remote(name: str, md5: str, size: int) -> RemoteFile:
    return RemoteFile.mirrored(name, MIRRORS, md5, size)


class MNISTDataModule(IDXImageDataModule):
    """MNIST handwritten digits: 60k train / 10k test 28x28 grayscale images, 10 classes.

    Checksums are of the decompressed official files (md5 of the IDX bytes, not the gz).
    """

    name = "mnist"
    subdirs = ("mnist", "MNIST/raw")
    files = {
        "train": (
            _remote("train-images-idx3-ubyte.gz", "6bbc9ace898e44ae57da46a324031adb", 47_040_016),
            _remote("train-labels-idx1-ubyte.gz", "a25bea736e30d166cdddb491f175f624", 60_008),
        ),
        "test": (
            _remote("t10k-images-idx3-ubyte.gz", "2646ac647ad5339dbf082846283269ea", 7_840_016),
            _remote("t10k-labels-idx1-ubyte.gz", "27ae3e4e09519cfbb04c329615203637", 10_008),
        ),
    }
    classes = [str(digit) for digit in range(10)]
