"""A dataset that lives in device memory. `ResidentDataset` uploads the uint8
records once (in chunks, straight from the file's memory map) and draws each batch *inside* the
jitted step: the order (`tbljax.order`), the augmentation (`tbljax.augment`) and the fused
gather-normalize (`tbljax.ops`) all run in the compiled program, and give exactly the batches
`tbljax.loader` yields for the same (seed, epoch, step).

Example:
    >>> ds = tbljax.ResidentDataset("train.tbl")                  # replicated on every device
    >>> @jax.jit
    ... def train_step(state, ds, step):                          # pass ds as an argument
    ...     b = ds.batch(step, batch_size=256, seed=0, augment="rrc_flip")
    ...     return update(state, b["image"], b["label"])
    >>> for step in range(num_steps):
    ...     state = train_step(state, ds, step)

Record fields ride along as device arrays drawn by the same indices: fixed ndarray fields,
ragged ones cut or zero-padded to `pad[name]` rows (with ``name_length``), geometric ones
through each step's crop and flip (`resident_fields.py`); ``left_out`` says what was not held
(str/json fields, ragged ones without a `pad`), and naming one in `fields=` is an error.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tbljax._src.datasets import reader
from tbljax._src.engine import step as _step
from tbljax._src.engine.record_source import RecordSource
from tbljax._src.jax import ops as _ops
from tbljax._src.jax import packed as _packed
from tbljax._src.jax import program as _program
from tbljax._src.jax import resident_buckets as _buckets
from tbljax._src.jax import resident_fields as _geo
from tbljax._src.jax import resident_lengths as _lengths
from tbljax._src.jax import resident_pack as _pack
from tbljax._src.jax import resident_patches as _patches
from tbljax._src.jax import sharding as _sharding
from tbljax._src.jax import twin as _twin
from tbljax._src.jax.resident_host import check_device_memory, field_columns, host_rows, upload_packed
from tbljax._src.rules.contract import IMAGENET_MEAN, IMAGENET_STD
from tbljax._src.rules.options import LoaderOptions
from tbljax._src.rules.parts import steps_in_epoch

__all__ = ["ResidentDataset"]

_CHUNK_BYTES = 64 << 20  # host staging per upload step: bounded, whatever the dataset size


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(buf, rows, start):
    # Donated: the device buffer is updated in place, chunk after chunk. The zeros take the
    # start's dtype: a literal 0 is int64 under jax_enable_x64, and the indices must agree.
    zero = jnp.zeros_like(start)
    return jax.lax.dynamic_update_slice(buf, rows, (start, zero, zero, zero))


@jax.tree_util.register_pytree_node_class
class ResidentDataset:
    """A TBL dataset held in device memory as one uint8 ``(N, H, W, 3)`` `jax.Array`, from
    which `batch` draws training batches inside `jax.jit`.

    Args:
      path_or_dataset: a TBL file, a list of shard files, or an open `tbljax.Dataset` (any
        record format; non-RAW records are decoded once, chunk by chunk, on the way up).
      sharding: where the records live. None: a full copy on every device. A `Mesh`: a copy
        on every device of it. A `NamedSharding`: as given; it may partition the record axis
        N over some mesh axes (for datasets larger than one device), and each batch then
        gathers locally and sums the uint8 rows over those axes (an all-reduce of the batch).
      max_bytes: the most device memory (bytes per device) the records may take; default:
        what the device reports free (``memory_stats``), or on CPU the available RAM shared
        by the local devices. A dataset that does not fit raises MemoryError before anything
        is uploaded.
      chunk_bytes: host memory staged per upload step (the file is never copied whole).
      fields: the record fields held beside the images, each a device array sharded like the
        labels and served by `batch` under its name: "all" (default: every field a device
        array can hold: the fixed ndarray fields, and the ragged ones given a length in `pad`;
        the others are listed in ``left_out``), None, or a list of names (a ragged field named
        here needs a length in `pad`; a str/json field named here is an error).
      pad: {name: length} for ragged fields: cut or zero-padded to length rows, with
        ``batch[name + "_length"]`` the record's true length (as `tbljax.loader` serves them).

    ``left_out``: {field name: why it is not held} for the fields ``fields="all"`` left out
    (empty when every field is held or `fields` names them).

    Pass the dataset *as an argument* of the jitted function (it is a pytree of its arrays):
    a dataset closed over by a jitted function would be embedded in the compiled program as a
    constant, so `batch` refuses that.
    """

    def __init__(
        self,
        path_or_dataset,
        sharding=None,
        *,
        max_bytes: int | None = None,
        chunk_bytes: int = _CHUNK_BYTES,
        fields="all",
        pad: dict | None = None,
    ):
        self.sharding = _sharding.data_sharding(sharding)
        ds = reader.as_dataset(path_or_dataset, "tbljax.ResidentDataset")
        if ds.draws_by_weight:
            raise ValueError(
                f"ResidentDataset serves one dataset in its own order; {ds!r} draws "
                "rows by weight, which tbljax.loader does (a resident mixture is "
                "not supported)"
            )
        src = RecordSource(ds, threads=None)
        self.num_records = src.n
        self.fingerprint = src.fingerprint
        self.geometry = src.geometry
        chunk_bytes = max(1, int(chunk_bytes))
        if src.shape is None:
            # Records of different sizes: packed from page starts in one (P, PAGE_BYTES) array
            # with a table of where each is (tbljax.ops.PackedRecords), on every device.
            if self._data_parts() != 1:
                raise ValueError(
                    "records of different sizes are held whole on every device: "
                    f"sharding {self.sharding} partitions them"
                )
            self.image_shape = None
            table, pages = _packed.pack_layout(self.geometry.heights, self.geometry.widths)
            self._check_fits((pages, _packed.PAGE_BYTES), max_bytes)
            self.data = _packed.PackedRecords(
                upload_packed(ds, table, pages, chunk_bytes, self.sharding),
                jax.device_put(table, NamedSharding(self.sharding.mesh, PartitionSpec())),
                int(max(self.geometry.heights.max(), self.geometry.widths.max())),
            )
        else:
            self.image_shape = tuple(int(v) for v in src.shape)
            shape = (self.num_records, *self.image_shape, 3)
            parts = self._data_parts()
            if self.num_records % parts:
                raise ValueError(
                    f"the dataset's {self.num_records} records do not split evenly "
                    f"over the {parts} record shards of {self.sharding}"
                )
            self._check_fits(shape, max_bytes)
            self.data = self._upload(ds, shape, chunk_bytes)
        by_record = NamedSharding(self.sharding.mesh, PartitionSpec(*self.sharding.spec[:1]))
        self.labels = jax.device_put(src.labels.astype(np.int32), by_record)
        columns, self.left_out, geometric = field_columns(ds, fields, pad)
        self.fields = {n: jax.device_put(v, by_record) for n, v in columns.items()}
        self.geometric = _geo.hold(ds, geometric, self.sharding)  # masks, boxes, ...: through the crop

    # ---- pytree: the arrays are leaves, so a jitted step takes the dataset as an argument ----
    def tree_flatten(self):
        aux = (
            self.num_records,
            self.image_shape,
            self.fingerprint,
            self.sharding,
            self.geometry,
            tuple(self.left_out.items()),
        )
        return (self.data, self.labels, self.fields, self.geometric), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        self = object.__new__(cls)
        self.num_records, self.image_shape, self.fingerprint, self.sharding, self.geometry, left = aux
        self.left_out = dict(left)
        self.data, self.labels, self.fields, self.geometric = children
        return self

    def __len__(self) -> int:
        return self.num_records

    def __repr__(self) -> str:
        size = self.image_shape or "different sizes"
        return f"ResidentDataset({self.num_records} records of {size}, sharding={self.sharding})"

    @property
    def nbytes(self) -> int:
        """Bytes of pixels per full copy (N * H * W * 3; records of different sizes: their
        pages)."""
        if self.image_shape is None:
            return int(self.data.pages.shape[0]) * _packed.PAGE_BYTES
        return self.num_records * self.image_shape[0] * self.image_shape[1] * 3

    # ---- placement ----
    def _data_axes(self) -> tuple[str, ...]:
        return _sharding.mesh_axes(self.sharding)

    def _data_parts(self) -> int:
        return _sharding.parts(self.sharding)

    def _check_fits(self, shape, max_bytes):
        check_device_memory(shape, self.sharding, max_bytes, num_records=self.num_records)

    def _host_rows(self, ds, views, starts, a: int, b: int) -> np.ndarray:
        return host_rows(ds, views, starts, a, b, self.image_shape)

    def _upload(self, ds, shape, chunk_bytes):
        raw = ds.record_format == "raw"
        views = ds.shard_views() if raw else None
        starts = np.concatenate([[0], np.cumsum([len(v) for v in views])]) if raw else None
        rows_per_chunk = max(1, chunk_bytes // (shape[1] * shape[2] * 3))
        index_map = self.sharding.addressable_devices_indices_map(shape)
        pieces = []
        for device, index in index_map.items():
            a, b, _ = index[0].indices(shape[0])
            local = (b - a, *shape[1:])
            buf = jnp.zeros(local, jnp.uint8, device=device)  # allocated on the device
            for r in range(a, b, rows_per_chunk):
                rows = self._host_rows(ds, views, starts, r, min(b, r + rows_per_chunk))
                buf = _write_rows(buf, jax.device_put(rows, device), np.int32(r - a))
            pieces.append(buf)
        return jax.make_array_from_single_device_arrays(shape, self.sharding, pieces)

    # ---- batches ----
    def steps_per_epoch(self, batch_size: int, repeats: int = 1) -> int:
        """Steps in one epoch of ``repeats`` × the records (the last partial batch is dropped,
        as the loader does)."""
        return steps_in_epoch(self.num_records * repeats, batch_size, drop_remainder=True)

    def bucket_plan(self, batch_size: int, buckets, *, seed=0, epoch=0, shuffle=True, drop_remainder=False):
        """Epoch `epoch` under `buckets` (a `tbljax.Buckets`) as `tbljax.loader(..., buckets=)`
        schedules it: a pytree for `batch(plan=, bucket=)`, the same static part every epoch."""
        kw = dict(seed=seed, epoch=epoch, shuffle=shuffle, drop_remainder=drop_remainder)
        return _buckets.plan(self, batch_size, buckets, **kw)

    def pack_plan(self, batch_size: int, patches, *, seed=0, epoch=0, shuffle=True, drop_remainder=False):
        """Epoch `epoch` packed as `tbljax.loader(patches=patches)` packs it (`Patches(pack=True)`):
        a pytree for `batch(plan=)`, the same shapes every epoch (`resident_pack.py`)."""
        kw = dict(seed=seed, epoch=epoch, shuffle=shuffle, drop_remainder=drop_remainder)
        return _pack.plan(self, batch_size, patches, **kw)

    def length_plan(self, patches, *, seed=0, epoch=0, shuffle=True, drop_remainder=False):
        """Epoch `epoch` under a NaFlex length schedule (a `tbljax.Patches` with a list of max_tokens)
        as `tbljax.loader(patches=)` schedules it: a pytree for `batch(plan=, max_tokens=)`."""
        kw = dict(seed=seed, epoch=epoch, shuffle=shuffle, drop_remainder=drop_remainder)
        return _lengths.plan(self, patches, **kw)

    def batch(
        self,
        step,
        *,
        batch_size: int,
        seed: int = 0,
        epoch=None,
        shuffle: bool = True,
        augment=None,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        dtype="float32",
        layout: str = "NHWC",
        sharding=None,
        backend: str = "auto",
        repeats: int = 1,
        max_boxes: int = 100,
        min_size: float = 1.0,
        min_area: float = 1.0,
        min_visibility: float = 0.0,
        patches=None,
        plan=None,
        bucket=None,
        max_tokens=None,
    ):
        """The batch of `step`, computed in the graph: ``{"image", "label", "index"}`` (and
        ``"repeat"`` with repeats > 1) and the dataset's fields (`fields=` at construction) by
        name (geometric ones through the step's crop and flip), exactly what `tbljax.loader`
        yields at that step given the same arguments.

        Args:
          step: with ``epoch=None``, the global step since the start of training (epoch
            ``step // steps_per_epoch``, then the step within it); with an ``epoch``, the step
            within that epoch. A Python int or a traced int32 (one compiled step serves all).
          batch_size: the global batch G; the batch axes of `sharding` must divide it.
          seed, shuffle, augment, mean, std, dtype, layout, repeats, max_boxes, min_size,
            min_area, min_visibility, patches: as for `tbljax.loader` (patches: one max_tokens,
            resident_patches.py, with ops at each row's size too); per-image ops and
            erasing too: drawn here, run by the CPU FFI handler or the twin, whose affine ops
            need ``jax_enable_x64``).
          sharding: the batch's sharding: None (the batch axis over every mesh axis that does
            not partition the records), or a `NamedSharding` / `Mesh` on the dataset's mesh.
            Each device computes only its own rows.
          backend: passed to `tbljax.ops.gather_normalize` ("auto", "ffi", "twin").
          plan, bucket: aspect-ratio buckets: step `step` of a `bucket_plan`'s epoch at its bucket
            ``bucket`` (static: ``int(plan.bucket[step])``), one program per bucket (`resident_buckets.py`);
            or packed NaFlex sequences: step `step` of a `pack_plan`'s epoch (`resident_pack.py`).
          plan, max_tokens: a NaFlex length schedule: step `step` of a `length_plan`'s epoch at its
            length ``max_tokens`` (static: ``int(plan.length[step])``), one program per length
            (`resident_lengths.py`).

        Call it inside a jitted function that receives this dataset as an argument; outside
        jit it runs a cached jitted program.
        """
        opts = LoaderOptions(
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            dtype=dtype,
            layout=layout,
            mean=mean,
            std=std,
            augment=augment,
            repeats=repeats,
            **dict(max_boxes=max_boxes, min_size=min_size, min_area=min_area, min_visibility=min_visibility),
            patches=patches,
        )
        if max_tokens is not None or isinstance(plan, _lengths.LengthPlan):
            kw = dict(plan=plan, max_tokens=max_tokens, opts=opts, epoch=epoch, sharding=sharding, backend=backend)
            return _lengths.batch(self, step, bucket=bucket, **kw)
        kw = dict(plan=plan, bucket=bucket, opts=opts, epoch=epoch, sharding=sharding, backend=backend)
        if isinstance(plan, _pack.PackPlan) or (opts.patches is not None and opts.patches.pack):
            return _pack.batch(self, step, **kw)  # packed NaFlex sequences (resident_pack.py)
        if plan is not None or bucket is not None:
            return _buckets.batch(self, step, **kw)
        _patches.check(opts, self._data_axes(), list(self.fields), _geo.output_keys(self.geometric))
        if opts.augment is not None and len(opts.augment.schedule) > 1:
            # The output shape must be static: fix the size of the (concrete) epoch.
            opts = dataclasses.replace(
                opts, augment=opts.augment.at_epoch(self._concrete_epoch(step, epoch, batch_size, repeats))
            )
        mesh, batch_axes = _sharding.batch_axes(self.sharding, sharding)
        parts = _sharding.parts(self.sharding, batch_axes)
        if batch_size % parts:
            raise ValueError(
                f"batch_size {batch_size} does not split evenly over the {parts} "
                f"batch shards {batch_axes}: use a multiple of {parts}"
            )
        if self.steps_per_epoch(batch_size, opts.repeats) == 0:
            raise ValueError(
                f"batch_size {batch_size} is larger than the dataset ({self.num_records} records"
                f"{f' × repeats={opts.repeats}' if opts.repeats > 1 else ''}): no full step"
            )
        traced = [isinstance(v, jax.core.Tracer) for v in (step, epoch)]
        # The labels are a leaf whatever the records are (an array or a PackedRecords).
        if not isinstance(self.labels, jax.core.Tracer):
            if any(traced):
                raise ValueError(
                    "ResidentDataset.batch is being traced with the dataset closed over: it would "
                    "be embedded in the compiled program as a constant. Pass the dataset as an "
                    "argument of the jitted function instead: jax.jit(lambda ds, step: "
                    "ds.batch(step, ...))(ds, step)"
                )
            return _eager_batch(
                self,
                jnp.asarray(step, jnp.int32),
                None if epoch is None else jnp.asarray(epoch, jnp.int32),
                opts=opts,
                batch_axes=batch_axes,
                backend=backend,
            )
        return self._batch(step, epoch, opts=opts, batch_axes=batch_axes, backend=backend)

    def _concrete_epoch(self, step, epoch, batch_size, repeats) -> int:
        """The epoch of a batch whose augmentation has a size schedule, as a Python int."""
        try:
            if epoch is not None:
                return int(epoch)
            spe = self.steps_per_epoch(batch_size, repeats)
            return int(step) // spe if spe else 0
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
            raise ValueError(
                "the augmentation's size schedule makes the output size depend on the epoch, "
                "which is traced here, but a jitted step's output shape must be static: use one "
                "jitted step per size, passing augment=aug.at_epoch(epoch) (a static argument, "
                "fixed in Python) for the epoch being run"
            ) from None

    def _batch(self, step, epoch, *, opts, batch_axes, backend):
        n = self.num_records
        image_hw = self.image_shape or self.geometry  # one size, or each record's own
        g = opts.batch_size
        mesh = self.sharding.mesh
        data_axes = self._data_axes()
        out_size = None if opts.patches else opts.output_size(self.image_shape)
        local_b = g // _sharding.parts(self.sharding, batch_axes)
        spe = self.steps_per_epoch(g, opts.repeats)
        mean, std = opts.normalization
        out_dtype = opts.out_dtype

        def per_shard(data, labels, fields, geo, step, epoch):
            step = step.astype(jnp.int32)
            if epoch is None:
                epoch, step = step // spe, step % spe
            shard = jax.lax.axis_index(batch_axes) if batch_axes else 0
            first = step * g + shard * local_b
            positions = first + jnp.arange(local_b, dtype=jnp.int32)
            idx, boxes, flips, rep = _step.draw(
                positions, opts, num_records=n, image_hw=image_hw, epoch=epoch, step=(step * g, g), xp=jnp
            )
            rep = jnp.zeros_like(idx) if rep is None else rep
            if opts.patches is not None:  # NaFlex rows (resident_patches.py)
                image, got = _patches.serve(
                    data, idx, boxes, flips, opts, self.geometry, backend=backend, epoch=epoch, repeat=rep
                )
                return image, labels[idx], idx, rep, {**{n: f[idx] for n, f in fields.items()}, **got}
            kw = dict(crop=boxes, flip=flips, out_size=out_size, layout=opts.layout, backend=backend)
            row_ops = _step.draw_ops(idx, opts, epoch=epoch, out_hw=out_size, repeat=rep, xp=jnp)
            if row_ops is not None and data_axes:
                raise ValueError(_step.OPS_NOT_PARTITIONED)
            if not data_axes:
                ops = None if row_ops is None else row_ops.program(_program.pixel_program)
                image = _ops.gather_normalize(data, idx, dtype=out_dtype, mean=mean, std=std, ops=ops, **kw)
                got = _geo.serve(geo, idx, boxes, flips, out_size, opts, self.geometry)
                return image, labels[idx], idx, rep, {**{n: f[idx] for n, f in fields.items()}, **got}
            # Records partitioned over data_axes: each device gathers the rows it holds (the
            # others are zero) and a uint8 sum over those axes assembles the batch exactly.
            rows = data.shape[0]
            local = idx - jax.lax.axis_index(data_axes) * rows
            own = (local >= 0) & (local < rows)
            local = jnp.where(own, local, 0)
            pix = _ops.gather_normalize(data, local, dtype=jnp.uint8, **kw)
            pix = jax.lax.psum(jnp.where(own[:, None, None, None], pix, jnp.uint8(0)), data_axes)
            label = jax.lax.psum(jnp.where(own, labels[local], 0), data_axes)
            image = (
                pix if mean is None else _twin.normalize(pix, mean=mean, std=std, dtype=out_dtype, layout=opts.layout)
            )
            return image, label, idx, rep, {n: _geo.owned_rows(f, local, own, data_axes) for n, f in fields.items()}

        rep, spec = PartitionSpec(), PartitionSpec(batch_axes or None)
        data_spec = PartitionSpec(data_axes or None)
        field_specs = {n: data_spec for n in self.fields}
        args = [self.data, self.labels, self.fields, self.geometric, step]
        in_specs = [data_spec, data_spec, field_specs, jax.tree.map(lambda _: rep, self.geometric), rep]
        if epoch is not None:
            args.append(epoch)
            in_specs.append(rep)
        fn = jax.shard_map(
            lambda d, lab, f, g, s, *e: per_shard(d, lab, f, g, s, e[0] if e else None),
            mesh=mesh,
            in_specs=tuple(in_specs),
            out_specs=(
                spec,
                spec,
                spec,
                spec,
                {n: spec for n in [*self.fields, *_geo.output_keys(self.geometric), *_patches.keys(opts)]},
            ),
        )
        image, label, idx, rep, fields = fn(*args)
        repeat = {"repeat": rep.astype(jnp.int32)} if opts.repeats > 1 else {}
        return {"image": image, "label": label, "index": idx.astype(jnp.int32), **repeat, **fields}


@functools.partial(jax.jit, static_argnames=("opts", "batch_axes", "backend"))
def _eager_batch(ds, step, epoch, *, opts, batch_axes, backend):
    return ds._batch(step, epoch, opts=opts, batch_axes=batch_axes, backend=backend)
