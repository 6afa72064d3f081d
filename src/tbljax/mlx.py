"""tbljax.mlx: serve a TBL dataset to MLX as ``mx.array`` batches.

>>> import tbljax.mlx
>>> for batch in tbljax.mlx.loader("train.tbl", batch_size=256, seed=0): ...

mlx is imported only when a loader is made (``pip install 'tbljax[mlx]'``). The implementation
lives in `tbljax._src.adapters.mlx`.
"""

from tbljax._src.adapters.mlx import MLXLoader, loader

__all__ = ["MLXLoader", "loader"]
