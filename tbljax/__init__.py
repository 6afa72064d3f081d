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
    """What this build was compiled with and what runs, for both native front ends.

    Keys include ``version``, ``compiler``, ``libjpeg_turbo``, ``lz4``; ``simd`` (the one SIMD
    target of the kernel, the resize and the CRC), ``simd_targets`` and ``cpu_features``;
    ``threads`` (the size of the one thread pool) and ``pool_started``; ``xla_cpu`` (whether
    the XLA CPU handlers are compiled into ``tbljax._core``) and ``xla_ffi_api``; ``xla_cuda``
    (whether ``tbljax._ffi_cuda`` imports) and, when it does not, ``xla_cuda_error``.

    >>> tbljax.build_info()["simd"] in tbljax.build_info()["simd_targets"]
    True
    """
    import importlib

    from tbljax import _core

    info = dict(_core._native_info())
    info.setdefault("simd", "none (kernel not built)")
    try:
        importlib.import_module("tbljax._ffi_cuda")  # imports no framework
    except ImportError as e:
        info["xla_cuda"], info["xla_cuda_error"] = False, str(e)
    else:
        info["xla_cuda"] = True
    return info


def __getattr__(name: str):
    # Submodules that import a framework load on first use, so `import tbljax` and the CLI stay
    # quick and work without torch/mlx installed: tbljax.torch, tbljax.mlx, tbljax.ops (which
    # registers the XLA FFI handlers) and tbljax.ResidentDataset.
    if name in ("torch", "mlx", "ops"):
        import importlib

        return importlib.import_module(f"tbljax.{name}")
    if name == "ResidentDataset":
        from tbljax.resident import ResidentDataset

        return ResidentDataset
    raise AttributeError(f"module 'tbljax' has no attribute {name!r}")


__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "Augment", "Loader", "loader", "order",
    "ConversionError", "ConvertSummary", "CorruptFileError", "Dataset", "DecodeError", "Writer",
    "ResidentDataset", "bench", "build_info", "convert", "open", "ops",
]
