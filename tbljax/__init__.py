"""tbljax: decode an image dataset once into a TBL file, then serve every epoch to JAX.

>>> import tbljax
>>> tbljax.convert("train-{000..099}.tar", "train.tbl", image_size=160)
>>> ds = tbljax.open("train.tbl")
"""
from tbljax._core import CorruptFileError, DecodeError
from tbljax.convert import ConversionError, ConvertSummary, convert
from tbljax.format import Dataset, Writer, open
from tbljax import order
from tbljax.bench import bench
from tbljax.augment import Augment
from tbljax.loader import IMAGENET_MEAN, IMAGENET_STD, Loader, loader

__version__: str = __import__("tbljax._core", fromlist=["_native_info"])._native_info()["version"]


def build_info() -> dict:
    """What this build was compiled with and what runs: version, SIMD target in use,
    libjpeg-turbo and lz4 versions, compiler, default thread count."""
    from tbljax import _core

    info = dict(_core._native_info())
    info.setdefault("simd", "none (kernel not built)")
    return info


def __getattr__(name: str):
    # tbljax.torch and tbljax.mlx load on first use, so `import tbljax` never imports a
    # framework (and works without them installed).
    if name in ("torch", "mlx"):
        import importlib

        return importlib.import_module(f"tbljax.{name}")
    raise AttributeError(f"module 'tbljax' has no attribute {name!r}")


__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "Augment", "Loader", "loader", "order",
    "ConversionError", "ConvertSummary", "CorruptFileError", "Dataset", "DecodeError", "Writer",
    "bench", "build_info", "convert", "open",
]
