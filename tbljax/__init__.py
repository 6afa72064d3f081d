"""tbljax: decode an image dataset once into a TBL file, then serve every epoch to JAX.

>>> import tbljax
>>> tbljax.convert("train-{000..099}.tar", "train.tbl", image_size=160)
>>> ds = tbljax.open("train.tbl")
>>> paths = tbljax.stage("gs://bucket/train-{0000..0063}.tbl", "/cache", partition="host")

The public surface is what this module exports (`__all__`); the modules behind it are the
rooms of DESIGN.md, and none of them is named like a function exported here.
"""
from tbljax import _core
from tbljax._core import CorruptFileError, DecodeError
from tbljax.augment import Augment
from tbljax.benchmark import bench
from tbljax.contract import IMAGENET_MEAN, IMAGENET_STD
from tbljax.conversion import ConversionError, ConvertSummary, convert
from tbljax.format import Writer
from tbljax.host_loader import HostLoader
from tbljax.jax_loader import Loader, loader
from tbljax.options import LoaderOptions
from tbljax.plan import HostBatch
from tbljax.reader import Dataset, open
from tbljax.staging import stage
from tbljax import order

__version__: str = _core.native_info()["version"]


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

    info = dict(_core.native_info())
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
    "IMAGENET_MEAN", "IMAGENET_STD", "Augment", "HostBatch", "HostLoader", "Loader",
    "LoaderOptions", "loader", "order", "ConversionError", "ConvertSummary", "CorruptFileError",
    "Dataset", "DecodeError", "Writer", "ResidentDataset", "bench", "build_info", "convert",
    "open", "ops", "stage",
]
