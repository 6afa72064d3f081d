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
from tbljax._src.datasets import reader
from tbljax._src.rules import contract
from tbljax._src.rules.mixup import Mixup
from tbljax._src.rules.options import front_end

__all__ = ["MLXLoader", "loader"]


def _mx():
    try:
        return importlib.import_module("mlx.core")
    except ImportError as e:
        raise ImportError("tbljax.mlx needs MLX: pip install 'tbljax[mlx]' (on Linux it installs mlx[cpu])") from e


def _to_mlx(host) -> tuple[_adapter.TensorBatch, list]:
    """A HostBatch → mx.arrays (one copy of each array; the HostBatch is dropped after)."""
    mx = _mx()
    # Only constructors here, no lazy MLX op: this runs in the producer thread, and MLX binds
    # ops to the stream of the thread that makes them ("no Stream(cpu, 0) in current thread").
    # mx.array takes ml_dtypes' bfloat16 bit for bit (tested over every finite value).
    images = {n: mx.array(a[0]) for n, a in host.views.items()} if host.views else mx.array(host.image)
    valid = None if host.valid is None else mx.array(host.valid)
    batch = _adapter.TensorBatch(
        images,
        mx.array(host.label),
        index=mx.array(host.index),
        valid=valid,
        epoch=host.epoch,
        position=host.position,
        source=None if host.sources is None else mx.array(host.sources[0]),
        repeat=None if host.repeats is None else mx.array(host.repeats[0]),
        fields={**{n: mx.array(a[0]) for n, a in host.fields.items()}, **host.texts},
    )
    return batch, []  # copies: nothing handed out views the ring slot


class MLXLoader(_adapter.EpochLoader):
    """Yields `TensorBatch` ``(images, labels)`` of ``mx.array``s; one epoch per pass. Create it
    with `tbljax.mlx.loader`. ``len()`` is steps per epoch; ``set_epoch``, ``state_dict`` and
    ``load_state_dict`` work as for `tbljax.torch.loader`. Batches own their memory: keep
    them as long as you like."""

    def to_arrays(self):
        return _to_mlx


@front_end("tbljax.mlx.loader", without=("num_epochs",))  # one epoch per pass
def loader(
    path_or_paths,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    partition: None = None,
    mixup: Mixup | None = None,
    **options,
) -> MLXLoader:
    """Serves a TBL dataset to MLX: ``(images, labels)`` mx.arrays, one epoch per pass.

    Args:
      path_or_paths: a TBL file, a list of shard files read as one, or a `tbljax.Dataset`.
      batch_size, seed, ...: the loader options: see `tbljax.LoaderOptions` (all but
        num_epochs: one epoch per pass). Read here: batch_size is rows per batch on this rank
        (the global batch is batch_size * world_size); dtype may be the mx dtype; layout
        "NHWC" (the default) is what ``mlx.nn.Conv2d`` takes.
      rank, world_size: this process's place in a data-parallel job (e.g. from
        ``group = mx.distributed.init(); rank=group.rank(), world_size=group.size()``);
        both None for a single process. Rank r gets the rows the JAX loader gives process r.
      partition: None only: every rank draws its rows from the whole dataset. Host parts
        (partition="host") need the ranks to exchange their parts' sizes, which tbljax does
        over JAX (`tbljax.loader`) and torch.distributed (`tbljax.torch.loader`), not MLX.
      mixup: None, or a `tbljax.ops.Mixup`: each batch is mixed on the host as
        `tbljax.ops.mixup_cutmix` mixes it in jit (this rank's rows are one block), keyed by
        (seed, the step counted across epochs); labels are then float32 (b, num_classes)
        soft targets. As for `tbljax.torch.loader`.

    Returns:
      An `MLXLoader`. Labels and index are int32 (-1 on padding rows; labels float32 soft
      targets with mixup); ``valid`` is a bool array without drop_remainder, else None.

    >>> ld = tbljax.mlx.loader("train.tbl", 128, seed=0)
    >>> images, labels = next(iter(ld))      # (128, H, W, 3) float32, (128,) int32
    """
    if partition is not None:
        raise ValueError(
            f"tbljax.mlx.loader supports partition=None only (rows from the whole "
            f"dataset on every rank), got {partition!r}: host parts "
            "(partition='host') are served by tbljax.loader (JAX) and "
            "tbljax.torch.loader (torch.distributed)"
        )
    _mx()  # a clear ImportError here, not on the first batch
    rank, world_size = _adapter.check_rank(rank, world_size)
    options["dtype"] = contract.dtype_name(options["dtype"], _mx(), "mx")
    opts = _adapter.options(world_size=world_size, **options)
    return MLXLoader(reader.as_dataset(path_or_paths), opts, rank, world_size, mixup=mixup)
