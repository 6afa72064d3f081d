"""Serve a TBL dataset to a PyTorch training loop, where a DataLoader was.

Batches are ``(images, labels)`` torch tensors whose images share memory with the loader's
ring of 4 KiB-aligned host buffers (no copy between the kernel and your step), page-locked
when CUDA is present so ``.cuda(non_blocking=True)`` is a direct DMA. The order, the pixels
and the state are those of `tbljax.loader`: rank r of a data-parallel job gets exactly the
rows the JAX loader would give process r, and a `state_dict` saved here resumes there and
back, with another world size too. torch is imported only when a loader is made
(``pip install 'tbljax[torch]'``).

Example:
    >>> import tbljax.torch
    >>> loader = tbljax.torch.loader("train.tbl", batch_size=256, augment="rrc_flip")
    >>> for epoch in range(90):
    ...     loader.set_epoch(epoch)
    ...     for images, labels in loader:        # NCHW float32, int64
    ...         loss = criterion(model(images.cuda(non_blocking=True)), labels.cuda())
"""

from __future__ import annotations

import functools
import importlib

import numpy as np

from tbljax._src.adapters import common as _adapter
from tbljax._src.datasets import opening, reader
from tbljax._src.engine import ring
from tbljax._src.rules import contract
from tbljax._src.rules.mixup import Mixup
from tbljax._src.rules.options import front_end

__all__ = ["TorchLoader", "loader"]


def _torch():
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise ImportError("tbljax.torch needs PyTorch: pip install 'tbljax[torch]'") from e


def _pinned_empty(nbytes: int) -> np.ndarray:
    """Page-locked host memory from torch's pinned allocator, seen from NumPy (so the ring's
    in-use check works on it unchanged) and aligned like `tbljax.batch.aligned_empty`."""
    torch = _torch()
    raw = torch.empty(nbytes + ring.ALIGN, dtype=torch.uint8, pin_memory=True).numpy()
    start = -raw.ctypes.data % ring.ALIGN
    return raw[start : start + nbytes]


def _to_torch(host) -> tuple[_adapter.TensorBatch, list]:
    """A HostBatch → (tensors, the images tensor, which views the ring slot). It holds a
    reference to the NumPy view, so the slot counts as in use for as long as the tensor (or
    any tensor sharing its storage: slices, permutes, .view) lives."""
    torch = _torch()

    def tensor(img):
        if img.dtype.name == "bfloat16":  # torch.from_numpy knows no ml_dtypes: same bits as int16
            return torch.from_numpy(img.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(img)

    # views=: {name: (B, count, ...)} in place of the images tensor, each viewing the slot.
    images = {n: tensor(a[0]) for n, a in host.views.items()} if host.views else tensor(host.image)
    valid = None if host.valid is None else torch.from_numpy(host.valid)
    label = host.label  # class ids as int64 (what cross_entropy takes); mixup='s soft targets float32
    labels = torch.from_numpy(label if label.dtype == np.float32 else label.astype(np.int64))
    batch = _adapter.TensorBatch(
        images,
        labels,
        index=torch.from_numpy(host.index.astype(np.int64)),
        valid=valid,
        epoch=host.epoch,
        position=host.position,
        source=None if host.sources is None else torch.from_numpy(host.sources[0]),
        repeat=None if host.repeats is None else torch.from_numpy(host.repeats[0]),
        fields={**{n: torch.from_numpy(np.ascontiguousarray(a[0])) for n, a in host.fields.items()}, **host.texts},
    )
    return batch, list(images.values()) if host.views else [images]


class TorchLoader(_adapter.EpochLoader):
    """Yields `TensorBatch` ``(images, labels)`` of torch tensors; one epoch per pass. Create it
    with `tbljax.torch.loader`.

    Drop-in for a ``torch.utils.data.DataLoader``: iterable, ``len()`` (steps per epoch),
    ``batch_size`` (per rank), ``drop_last``, ``set_epoch``, ``state_dict`` /
    ``load_state_dict``.

    Lifetime: ``images`` shares memory with the loader's ring. A slot is never rewritten
    while any tensor viewing it is alive; keep batches as long as you like (kept ones are
    replaced by fresh memory, dropped ones are recycled). With CUDA, a dropped tensor may
    still be the source of a ``non_blocking`` copy in flight, so before a slot is written
    again the producer waits for the device (``torch.cuda.synchronize``).
    """

    def __init__(self, dataset, opts, rank, world_size, pin_memory: bool, parts=None, mixup=None):
        ring = {}
        if pin_memory:
            torch = _torch()
            device = torch.cuda.current_device()
            ring = dict(alloc=_pinned_empty, before_reuse=functools.partial(torch.cuda.synchronize, device))
        self.pin_memory = pin_memory
        super().__init__(dataset, opts, rank, world_size, parts=parts, mixup=mixup, **ring)

    def to_arrays(self):
        return _to_torch


def _allgather(torch, rank: int, world_size: int):
    """What partition='host' exchanges each rank's part size with: torch.distributed's
    default group, which must be the ranks the loader splits the data over."""
    if world_size == 1:
        return lambda row: np.asarray(row)[None]
    dist = torch.distributed
    ready = dist.is_available() and dist.is_initialized()
    if not ready or (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        group = f"rank {dist.get_rank()} of {dist.get_world_size()}" if ready else "not initialized"
        raise ValueError(
            f"partition='host' on rank {rank} of {world_size}: the ranks exchange their "
            "parts' sizes over torch.distributed, so its default group must be those "
            f"ranks (it is {group}); call torch.distributed.init_process_group first"
        )
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"

    def allgather(row):
        mine = torch.from_numpy(np.asarray(row, np.int64)).to(device)
        rows = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(rows, mine)
        return torch.stack(rows).cpu().numpy()

    return allgather


@front_end("tbljax.torch.loader", layout="NCHW", without=("num_epochs",))  # one epoch per pass
def loader(
    path_or_paths,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    pin_memory: bool | None = None,
    partition: str | None = None,
    mixup: Mixup | None = None,
    **options,
) -> TorchLoader:
    """Serves a TBL dataset to PyTorch: ``(images, labels)`` tensors, one epoch per pass.

    Args:
      path_or_paths: a TBL file, a list of shard files read as one, or a `tbljax.Dataset`.
      batch_size, seed, ...: the loader options: see `tbljax.LoaderOptions` (all but
        num_epochs: one epoch per pass; use the same seed on every rank; the served fields are
        on each batch's `.fields`). Read here: batch_size is rows per batch on this rank (as
        for a DataLoader): the global batch is batch_size * world_size and rank r takes rows
        [r*batch_size, (r+1)*batch_size) of each; dtype may be the torch dtype; layout
        defaults to "NCHW" (``x.permute(0, 3, 1, 2)`` of an NHWC batch is an NCHW tensor in
        ``torch.channels_last`` memory format, without a copy); without drop_remainder every
        sample is served exactly once over all ranks, every rank taking the same steps.
      rank, world_size: this process's place in a data-parallel job. None (both): read from
        ``torch.distributed`` when it is initialized, else 0 and 1. Given explicitly they win
        (e.g. the data-parallel rank when tensor parallelism shares batches).
      pin_memory: page-locked ring buffers; None means ``torch.cuda.is_available()``.
      partition: None (rows drawn from the whole dataset) or "host": rank r of world_size
        opens and reads only its part (its block of the shard files by
        `tbljax.host_part`, or of the records of a single file), as
        `tbljax.loader(partition="host")` does for JAX process r. `path_or_paths` is then the
        list of all shard paths (other ranks' files may be absent); every rank must create the
        loader, and the ranks exchange their parts' sizes once over torch.distributed (its
        default group must be these ranks). Every rank runs the same steps; without
        drop_remainder every record is served once an epoch over all ranks.
      mixup: None, or a `tbljax.ops.Mixup`: each batch is mixed in the producer thread as
        `tbljax.ops.mixup_cutmix` mixes it in jit (this rank's rows are one block: row i with
        row b-1-i), keyed by (seed, the step counted across epochs), so a resumed run mixes
        the same pairs. Labels are then float32 (b, num_classes) soft targets (padding rows'
        own part all zeros), and images are new tensors, not views of the ring.

    Returns:
      A `TorchLoader`. Labels and index are int64 tensors (labels float32 soft targets with
      mixup); ``valid`` is a bool tensor or None.

    >>> ld = tbljax.torch.loader("val.tbl", 250, shuffle=False, drop_remainder=False)
    >>> correct = 0
    >>> for batch in ld:                      # a TensorBatch: (images, labels) + index, valid
    ...     x, y = batch
    ...     correct += int(((model(x).argmax(1) == y) & batch.valid).sum())
    """
    torch = _torch()
    if rank is None and world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
    rank, world_size = _adapter.check_rank(rank, world_size)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    options["dtype"] = contract.dtype_name(options["dtype"], torch, "torch")
    opts = _adapter.options(world_size=world_size, **options)
    if partition is None:
        return TorchLoader(reader.as_dataset(path_or_paths), opts, rank, world_size, bool(pin_memory), mixup=mixup)
    if partition != "host":
        raise ValueError(
            f"partition must be None (rows from the whole dataset) or 'host' (each "
            f"rank reads only its own part), got {partition!r}"
        )
    dataset, parts = opening.open_host_part(
        path_or_paths, opts.batch_size, rank, world_size, _allgather(torch, rank, world_size)
    )
    return TorchLoader(dataset, opts, rank, world_size, bool(pin_memory), parts=parts, mixup=mixup)
