"""Serve a TBL dataset to an MLX training loop as ``mx.array`` batches.

The order, pixels and state are those of `tbljax.loader` (and of `tbljax.torch`): the same
kernel fills the same ring. MLX arrays own their memory, so each batch is copied once from the
ring into an MLX buffer, in the loader's producer thread, overlapping your step; the ring slot
is free again right after. On macOS (Apple silicon) that buffer is unified memory the GPU reads
in place: no host-to-device transfer follows. On Linux it runs on ``mlx[cpu]``, which is how it
is tested. MLX is imported only when a loader is made (``pip install 'tbljax[mlx]'``).

Example:
    >>> import mlx.core as mx, tbljax.mlx
    >>> loader = tbljax.mlx.loader("train.tbl", batch_size=256, augment="rrc_flip")
    >>> for epoch in range(90):
    ...     for images, labels in loader:        # NHWC float32, int32
    ...         loss, grads = loss_and_grad(model, images, labels)
    ...         optimizer.update(model, grads)
    ...         mx.eval(model.parameters(), optimizer.state)
"""
from __future__ import annotations

import importlib

from tbljax._src.adapters import common as _adapter
from tbljax._src.rules import contract
from tbljax._src.datasets import reader
from tbljax._src.rules.contract import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["MLXLoader", "loader"]


def _mx():
    try:
        return importlib.import_module("mlx.core")
    except ImportError as e:
        raise ImportError("tbljax.mlx needs MLX: pip install 'tbljax[mlx]' (on Linux it "
                          "installs mlx[cpu])") from e


def _to_mlx(host) -> tuple[_adapter.TensorBatch, list]:
    """A HostBatch → mx.arrays (one copy of each array; the HostBatch is dropped after)."""
    mx = _mx()
    # Only constructors here, no lazy MLX op: this runs in the producer thread, and MLX binds
    # ops to the stream of the thread that makes them ("no Stream(cpu, 0) in current thread").
    # mx.array takes ml_dtypes' bfloat16 bit for bit (tested over every finite value).
    images = mx.array(host.image)
    valid = None if host.valid is None else mx.array(host.valid)
    batch = _adapter.TensorBatch(images, mx.array(host.label), index=mx.array(host.index),
                           valid=valid, epoch=host.epoch, position=host.position,
                           source=None if host.sources is None else mx.array(host.sources[0]),
                           fields={**{n: mx.array(a[0]) for n, a in host.fields.items()}, **host.texts})
    return batch, []  # copies: nothing handed out views the ring slot


class MLXLoader(_adapter.EpochLoader):
    """Yields `TensorBatch` ``(images, labels)`` of ``mx.array``s; one epoch per pass. Create it
    with `tbljax.mlx.loader`. ``len()`` is steps per epoch; ``set_epoch``, ``state_dict`` and
    ``load_state_dict`` work as for `tbljax.torch.loader`. Batches own their memory: keep
    them as long as you like."""

    def finisher(self):
        return _to_mlx


def loader(path_or_paths, batch_size: int, *, seed: int = 0, shuffle: bool = True,
           dtype="float32", layout: str = "NHWC", mean=IMAGENET_MEAN, std=IMAGENET_STD,
           augment=None, drop_remainder: bool = True, prefetch: int = 2,
           threads: int | None = None, read_ahead: int = 2, rank: int | None = None,
           world_size: int | None = None, partition: None = None,
           jpeg_dct_scale: bool = False,
           fields="all", field_fn=None, pad=None, verify_records: bool = False) -> MLXLoader:
    """Serves a TBL dataset to MLX: ``(images, labels)`` mx.arrays, one epoch per pass.

    Args:
      path_or_paths: a TBL file, a list of shard files read as one, or a `tbljax.Dataset`.
      batch_size: rows per batch on this rank; the global batch is batch_size * world_size.
      dtype: "float32" (default), "bfloat16" or "uint8", or the mx dtype.
      layout: "NHWC" (default: what ``mlx.nn.Conv2d`` takes) or "NCHW".
      rank, world_size: this process's place in a data-parallel job (e.g. from
        ``group = mx.distributed.init(); rank=group.rank(), world_size=group.size()``);
        both None for a single process. Rank r gets the rows the JAX loader gives process r.
      seed, shuffle, mean, std, augment, drop_remainder, prefetch, threads, read_ahead,
        jpeg_dct_scale, fields, field_fn, pad, verify_records: as `tbljax.torch.loader` and
        `tbljax.loader`.
      partition: None only: every rank draws its rows from the whole dataset. Host parts
        (partition="host") need the ranks to exchange their parts' sizes, which tbljax does
        over JAX (`tbljax.loader`) and torch.distributed (`tbljax.torch.loader`), not MLX.

    Returns:
      An `MLXLoader`. Labels and index are int32 (-1 on padding rows); ``valid`` is a bool
      array without drop_remainder, else None.

    >>> ld = tbljax.mlx.loader("train.tbl", 128, seed=0)
    >>> images, labels = next(iter(ld))      # (128, H, W, 3) float32, (128,) int32
    """
    if partition is not None:
        raise ValueError(f"tbljax.mlx.loader supports partition=None only (rows from the whole "
                         f"dataset on every rank), got {partition!r}: host parts "
                         "(partition='host') are served by tbljax.loader (JAX) and "
                         "tbljax.torch.loader (torch.distributed)")
    _mx()  # a clear ImportError here, not on the first batch
    rank, world_size = _adapter.check_rank(rank, world_size)
    opts = _adapter.options(batch_size, world_size, seed=seed, shuffle=shuffle,
                            dtype=contract.dtype_name(dtype, _mx(), "mx"),
                            layout=layout, mean=mean, std=std,
                            augment=augment, drop_remainder=drop_remainder, prefetch=prefetch,
                            threads=threads, read_ahead=read_ahead,
                            jpeg_dct_scale=jpeg_dct_scale, fields=fields,
                            field_fn=field_fn, pad=pad, verify_records=verify_records)
    return MLXLoader(reader.as_dataset(path_or_paths), opts, rank, world_size)
