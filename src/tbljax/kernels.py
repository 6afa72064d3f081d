"""tbljax.kernels: the host kernel on NumPy arrays — gather rows by index, crop and resize,
flip, normalize, write dtype and layout, in one GIL-free SIMD pass.

>>> out = np.empty((256, 160, 160, 3), np.float32)
>>> tbljax.kernels.gather(tbljax.open("train.tbl").view(), indices, out)
"""

from tbljax._core import check_crops, check_crops_per_record
from tbljax._src.engine.kernels import (
    gather,
    jpeg_source,
    kernel_target,
    normalize_table,
    raw_source,
    serve_jpeg,
    variable_source,
)

__all__ = [
    "check_crops",
    "check_crops_per_record",
    "gather",
    "jpeg_source",
    "kernel_target",
    "normalize_table",
    "raw_source",
    "serve_jpeg",
    "variable_source",
]
