"""The loader JAX users hold. `tbljax.loader(...)` yields dicts of global
`jax.Array`s sharded as the user asks; `Loader` is a thin layer over `tbljax.HostLoader` whose
finisher assembles each host batch into global arrays (no copy on CPU).

Example:
    >>> import tbljax
    >>> loader = tbljax.loader("train.tbl", batch_size=256, seed=0, augment="rrc_flip")
    >>> for step, batch in enumerate(loader):
    ...     state, loss = train_step(state, batch["image"], batch["label"])
    ...     if step % 1000 == 0:
    ...         save(state, loader.state_dict())   # {version, seed, epoch, position, fingerprint}
"""

from __future__ import annotations

import functools

from tbljax._src.datasets import opening, reader
from tbljax._src.engine.host_loader import HostLoader
from tbljax._src.engine.plan import HostBatch
from tbljax._src.engine.rows import RowLayout
from tbljax._src.jax import collectives
from tbljax._src.jax import sharding as _sharding
from tbljax._src.jax.arrays import check_fields_fit, check_fits, to_global
from tbljax._src.rules.options import LoaderOptions, front_end
from tbljax._src.rules.parts import Parts

__all__ = ["Loader", "loader", "to_jax"]


def to_jax(rows: RowLayout, host: HostBatch, step_rows=None) -> tuple[dict, list]:
    """The JAX layer: a HostBatch → (a dict of global jax.Arrays, no copy on CPU; the arrays
    in it that view the ring slot). `step_rows(epoch, position)`: the step's own rows, when
    steps change batch size (a length schedule, `LengthServing.layout`)."""
    if step_rows is not None:
        rows = step_rows(host.epoch, host.position)
    row_shape = host.images[0].shape[1:]  # the batch's own: a size schedule changes it
    if host.views:  # views=: one array per view group, (B, count, *row), instead of "image"
        result = {name: to_global(rows, pieces, pieces[0].shape[1:]) for name, pieces in host.views.items()}
    else:
        result = {"image": to_global(rows, host.images, row_shape)}
    result["label"] = to_global(rows, host.labels)
    result["index"] = to_global(rows, host.indices)
    if host.valids is not None:
        result["valid"] = to_global(rows, host.valids)
    if host.sources is not None:  # a mixture: which source each row came from
        result["source"] = to_global(rows, host.sources)
    if host.repeats is not None:  # repeats > 1: which repeat of its record each row is
        result["repeat"] = to_global(rows, host.repeats)
    for name, pieces in host.fields.items():  # placed and sharded like label
        check_fits(name, pieces, f"at epoch {host.epoch}, position {host.position}")  # a field_fn's
        result[name] = to_global(rows, pieces, pieces[0].shape[1:])
    result.update(host.texts)  # str/json fields: this process's rows, as Python lists
    return result, [result[name] for name in host.views] if host.views else [result["image"]]


class Loader(HostLoader):
    """Serves a dataset to JAX as sharded global batches. Create it with `tbljax.loader`.

    Iterating yields ``{"image", "label", "index"}`` (+ ``"valid"`` without drop_remainder,
    ``"repeat"`` with repeats > 1),
    each a global `jax.Array` whose leading axis is the global batch. Iteration starts at the
    loader's cursor (epoch, position) and runs to the end of epoch ``num_epochs - 1`` (or
    forever). Iterating again after a pass that ran to its end starts over at epoch 0 (an
    evaluation loader serves the whole set each time); a restored state that is at the end
    yields nothing, as the original run would have.

    Lifetime: a batch's image may share memory with the loader's host ring (on CPU it does).
    The loader never rewrites memory that a live jax.Array (or anything derived from it) still
    reads: hold batches as long as you like; batches you drop are recycled.
    """

    def __init__(self, dataset, opts: LoaderOptions, sharding=None, parts: Parts | None = None):
        self.sharding = _sharding.batch_sharding(sharding)
        # Which rows of each global batch this process's devices hold; with host parts the
        # host loader fills them as a batch of their own, from this process's part.
        self._global_rows = _sharding.row_layout(self.sharding, opts.batch_size)
        rows = self._global_rows
        if parts is not None:
            rows = rows.process_local(len(parts.counts))
        super().__init__(dataset, opts, rows, parts=parts)

    def check_fields(self, dataset, names):
        check_fields_fit(dataset, names, "tbljax.loader")

    def finisher(self):
        # A length schedule: each step's global arrays at its own batch size (the same on every process).
        lengths = self.lengths
        return functools.partial(to_jax, self._global_rows, step_rows=lengths and lengths.layout)


@front_end("tbljax.loader")
def loader(path_or_paths, *, sharding=None, partition: str | None = None, **options) -> Loader:
    """Serves a TBL dataset to JAX as sharded global batches.

    Args:
      path_or_paths: a TBL file, a list of shard files read as one dataset, or an open
        `tbljax.Dataset`.
      batch_size, seed, ...: the loader options: see `tbljax.LoaderOptions`. batch_size is the
        global batch G over all processes; it must split evenly over the batch shards of
        `sharding`.
      sharding: None (batch axis over all devices), a `Mesh` or a `NamedSharding` that
        partitions only the leading axis. Each process builds only its devices' rows.
      partition: None (every process serves rows drawn from the whole dataset, the global
        order) or "host": each process opens and reads only its own part (its block of the
        shard files by `tbljax.host_part`, or of the records of a single file),
        reshuffled every epoch, and fills its G/P rows of each global batch from it (process
        p's rows are rows [p*G/P, (p+1)*G/P) under the default sharding). Every process runs
        the same steps; without drop_remainder every record is served exactly once an epoch
        (the parts that run out first pad). `path_or_paths` is then the list of all shard
        paths (other parts' files may be absent), or a `tbljax.mix` of such lists (each
        process reads its part of every source). Every process must create the loader: the
        processes exchange their parts' sizes once. See docs/pods.md.

    >>> loader = tbljax.loader("val.tbl", batch_size=500, shuffle=False, num_epochs=1,
    ...                        drop_remainder=False)
    >>> correct = sum(int(((predict(b["image"]) == b["label"]) & b["valid"]).sum())
    ...               for b in loader)
    """
    opts = LoaderOptions(**options)
    if partition is None:
        return Loader(reader.as_dataset(path_or_paths), opts, sharding)
    if partition != "host":
        raise ValueError(
            f"partition must be None (rows from the whole dataset) or 'host' (each "
            f"process reads only its own part), got {partition!r}"
        )
    rank, world_size = collectives.process()
    dataset, parts = opening.open_host_part(
        path_or_paths, opts.batch_size, rank, world_size, collectives.process_allgather
    )
    return Loader(dataset, opts, sharding, parts=parts)
