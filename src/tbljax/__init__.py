"""tbljax: decode an image dataset once into a TBL file, then serve every epoch to JAX.

>>> import tbljax
>>> tbljax.convert("train-{000..099}.tar", "train.tbl", image_size=160)
>>> ds = tbljax.open("train.tbl")
>>> paths = tbljax.stage("gs://bucket/train-{0000..0063}.tbl", "/cache", partition="host")

The public surface is what this module exports (`__all__`) and the public submodules
`tbljax.torch`, `tbljax.mlx`, `tbljax.ops`, `tbljax.kernels`, `tbljax.order`, `tbljax.augment`
and `tbljax.show`. Everything under `tbljax._src` is private: its rooms are mapped in
docs/architecture.md.
"""

from tbljax import _core, augment, kernels, order, show
from tbljax._src.conversion.convert import convert
from tbljax._src.conversion.convert_options import ConvertSummary
from tbljax._src.datasets.mixture import Mixture, mix
from tbljax._src.datasets.reader import Dataset, open
from tbljax._src.engine.host_loader import HostLoader
from tbljax._src.engine.kernels import build_info
from tbljax._src.engine.plan import HostBatch
from tbljax._src.engine.rows import RowLayout
from tbljax._src.file.fields import Boxes, DenseMap, Keypoints, Mask
from tbljax._src.file.format import FORMATS, INDEX_DTYPE, Writer
from tbljax._src.jax.collectives import host_part
from tbljax._src.jax.loader import Loader, loader
from tbljax._src.jax.sharding import row_layout
from tbljax._src.remote.staging import stage
from tbljax._src.rules.augment import Augment
from tbljax._src.rules.buckets import Buckets
from tbljax._src.rules.contract import IMAGENET_MEAN, IMAGENET_STD
from tbljax._src.rules.erasing import RandomErasing
from tbljax._src.rules.errors import ConversionError, CorruptFileError, DecodeError
from tbljax._src.rules.image_ops import ColorJitter, GaussianBlur, Grayscale, Solarize, ThreeAugment, TrivialAugment
from tbljax._src.rules.naflex import Patches
from tbljax._src.rules.options import LoaderOptions
from tbljax._src.rules.randaug import RandAugment
from tbljax._src.sources.coco import coco
from tbljax._src.tools.benchmark import bench

__version__: str = _core.native_info()["version"]


def __getattr__(name: str):
    # Submodules that import a framework load on first use, so `import tbljax` and the CLI stay
    # quick and work without torch/mlx installed: tbljax.torch, tbljax.mlx, tbljax.ops (which
    # registers the XLA FFI handlers) and tbljax.ResidentDataset.
    if name in ("torch", "mlx", "ops"):
        import importlib

        return importlib.import_module(f"tbljax.{name}")
    if name == "ResidentDataset":
        from tbljax._src.jax.resident import ResidentDataset

        return ResidentDataset
    raise AttributeError(f"module 'tbljax' has no attribute {name!r}")


__all__ = [
    "FORMATS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "INDEX_DTYPE",
    "Augment",
    "Buckets",
    "Patches",
    "HostBatch",
    "HostLoader",
    "Loader",
    "LoaderOptions",
    "RandAugment",
    "RandomErasing",
    "TrivialAugment",
    "ColorJitter",
    "ThreeAugment",
    "Grayscale",
    "Solarize",
    "GaussianBlur",
    "RowLayout",
    "loader",
    "augment",
    "kernels",
    "order",
    "show",
    "ConversionError",
    "ConvertSummary",
    "CorruptFileError",
    "Boxes",
    "DenseMap",
    "Keypoints",
    "Mask",
    "coco",
    "Dataset",
    "DecodeError",
    "Writer",
    "ResidentDataset",
    "bench",
    "build_info",
    "convert",
    "Mixture",
    "host_part",
    "mix",
    "open",
    "ops",
    "row_layout",
    "stage",
]
