"""`tbljax.mix`: several datasets served as one stream by weight (`Mixture`). The records of
the sources are numbered one after another (source k's record r is record ``offsets[k] + r``
of the mixture), so a mixture implements the whole dataset contract over that numbering and
serves on every path that takes a dataset; how rows are drawn from the sources is
`rules/mixing.py`.

>>> mixed = tbljax.mix({"in1k": "in1k.tbl", "extra": ["x-0.tbl", "x-1.tbl"]},
...                    weights={"in1k": 0.7, "extra": 0.3}, steps_per_epoch=1000)
>>> for batch in tbljax.loader(mixed, 256, augment=tbljax.Augment(size=(224, 224))):
...     batch["source"]      # which source each row came from (names: mixed.sources)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cached_property

import numpy as np

from tbljax import _core
from tbljax._src.datasets import host_part, reader
from tbljax._src.rules.contract import is_integer, is_real, record_numbers
from tbljax._src.rules.dataset import RecordDataset, Records, WeightedDataset, paths_or_dataset, record_number
from tbljax._src.rules.mixing import MixSpec
from tbljax._src.rules.parts import Parts
from tbljax._src.rules.record_geometry import RecordGeometry

__all__ = ["MAX_STEPS_PER_EPOCH", "Mixture", "mix"]

MAX_STEPS_PER_EPOCH = 1 << 32  # as epochs: the step is a 32-bit word of the mixing keys


class Mixture(WeightedDataset):
    """Named datasets, their weights and the length of an epoch. Made by `tbljax.mix`.

    The sources are kept as given (``given``) and opened when first used, so that under
    ``partition="host"`` the loader opens only each process's part of every source
    (`open_part`); other parts' files need not exist on this host. A mixture of host parts
    (``host_parts``: per source, every process's record count of it) numbers ``"index"`` in
    the whole mixture's numbering (`global_offsets`), as one process would."""

    def __init__(
        self,
        sources: Mapping,
        weights: Mapping,
        *,
        steps_per_epoch: int | None = None,
        epoch_of: str | None = None,
        label_offset: Mapping | None = None,
        host_parts: tuple[Parts, ...] | None = None,
    ):
        if not isinstance(sources, Mapping) or not sources:
            raise TypeError(
                "tbljax.mix takes a dict {name: TBL path, list of shard paths or "
                f"dataset}}, got {type(sources).__name__}"
            )
        named = _by_name("sources", sources)
        self.sources = list(named)
        if not isinstance(weights, Mapping) or set(_by_name("weights", weights)) != set(self.sources):
            given = sorted(map(str, weights)) if isinstance(weights, Mapping) else weights
            raise ValueError(
                f"tbljax.mix: weights must name every source once: sources {self.sources}, weights for {given}"
            )
        self.given = {n: _checked_source(n, v) for n, v in named.items()}
        weights = _by_name("weights", weights)
        self.weights = tuple(_weight(n, weights[n]) for n in self.sources)
        MixSpec(self.weights, (1,) * len(self.weights))  # the weights' checks, before opening
        offsets = _by_name("label_offset", label_offset or {})
        unknown = sorted(set(offsets) - set(self.sources))
        if unknown:
            raise ValueError(f"tbljax.mix: label_offset names {unknown}, which are not sources {self.sources}")
        for n, off in offsets.items():
            if not is_integer(off) or not -(1 << 31) <= off < 1 << 31:
                raise ValueError(
                    f"tbljax.mix: label_offset[{n!r}] must be an integer in [-2**31, 2**31) "
                    f"(labels are served as int32), got {off!r}"
                )
        self.label_offsets = tuple(int(offsets.get(n, 0)) for n in self.sources)
        if (steps_per_epoch is None) == (epoch_of is None):
            raise ValueError(
                "tbljax.mix needs the length of an epoch: steps_per_epoch=N, or "
                "epoch_of='name' (an epoch is one pass over that source); give one"
            )
        if epoch_of is not None and epoch_of not in self.sources:
            raise ValueError(f"epoch_of={epoch_of!r} is not a source ({self.sources})")
        if steps_per_epoch is not None and (
            not is_integer(steps_per_epoch) or not 1 <= steps_per_epoch < MAX_STEPS_PER_EPOCH
        ):
            raise ValueError(f"tbljax.mix: steps_per_epoch must be an integer in [1, 2**32), got {steps_per_epoch!r}")
        self._steps_per_epoch, self.epoch_of = steps_per_epoch, epoch_of
        if host_parts is not None and len(host_parts) != len(self.sources):
            raise ValueError(f"host_parts needs one Parts per source, got {len(host_parts)}")
        self.host_parts = tuple(host_parts) if host_parts is not None else None

    @cached_property
    def datasets(self) -> list[RecordDataset]:
        """The sources, opened (in the order of `sources`)."""
        return [reader.as_dataset(v, "tbljax.mix") for v in self.given.values()]

    @cached_property
    def spec(self) -> MixSpec:
        """Weights and this process's record count of each source (`rules/mixing.py`)."""
        return MixSpec(self.weights, tuple(len(d) for d in self.datasets))

    @cached_property
    def offsets(self) -> np.ndarray:
        """Source k's record r is record ``offsets[k] + r`` of this mixture (of this process's
        parts, under host parts)."""
        return np.concatenate([[0], np.cumsum([len(d) for d in self.datasets])]).astype(np.int64)

    # ---- host parts (partition="host") ----
    @property
    def source_counts(self) -> tuple[int, ...]:
        """Records of each whole source (all host parts together)."""
        if self.host_parts is None:
            return tuple(len(d) for d in self.datasets)
        return tuple(sum(p.counts) for p in self.host_parts)

    @cached_property
    def global_offsets(self) -> np.ndarray:
        """Where each source starts in the whole mixture's numbering (``"index"``)."""
        return np.concatenate([[0], np.cumsum(self.source_counts)]).astype(np.int64)

    def _part_starts(self) -> np.ndarray:
        if self.host_parts is None:
            return np.zeros(len(self.sources), np.int64)
        return np.array([p.start for p in self.host_parts], np.int64)

    def global_index(self, source, record) -> np.ndarray:
        """The whole mixture's numbering of record `record` of this mixture's source `source`
        (under host parts: of this process's part of it)."""
        source = np.asarray(source, np.int64)
        return self.global_offsets[source] + self._part_starts()[source] + record

    def local_index(self, indices) -> np.ndarray:
        """`global_index`'s inverse: this mixture's records of whole-mixture `indices`."""
        idx = np.asarray(indices, np.int64)
        k = np.searchsorted(self.global_offsets, idx, side="right") - 1
        return self.offsets[k] + idx - self.global_offsets[k] - self._part_starts()[k]

    def source_geometry(self, k: int) -> RecordGeometry:
        """Source k's geometry for the whole mixture's numbering (`global_index`)."""
        return self.datasets[k].geometry.shifted(int(self.global_index(k, 0)))

    @property
    def processes(self) -> tuple[int, int]:
        """(this process's index, the number of processes): (0, 1) without host parts."""
        if self.host_parts is None:
            return 0, 1
        return self.host_parts[0].index, len(self.host_parts[0].counts)

    def open_part(self, rank: int, world_size: int, allgather) -> "Mixture":
        """This process's mixture for ``partition="host"``: each source's part opened by
        `tbljax._src.datasets.host_part.open_part` (its shard files split by files, a single file
        by records; one exchange per source, through `allgather`), under the same names,
        weights and epoch.
        Every process must call it. The sources must be paths: an open dataset has no parts
        to open."""
        if self.host_parts is not None:
            raise TypeError(f"{self!r} is already a mixture of host parts")
        opened = [n for n, v in self.given.items() if isinstance(v, RecordDataset)]
        if opened:
            raise TypeError(
                f"partition='host' opens each process's part of every source of "
                f"a tbljax.mix from its paths, but sources {opened} are open "
                "datasets: give tbljax.mix their TBL path or list of shard paths"
            )
        local = [host_part.open_part(v, rank, world_size, allgather) for v in self.given.values()]
        return Mixture(
            {n: p.dataset for n, p in zip(self.sources, local)},
            dict(zip(self.sources, self.weights)),
            steps_per_epoch=self._steps_per_epoch,
            epoch_of=self.epoch_of,
            label_offset=dict(zip(self.sources, self.label_offsets)),
            host_parts=tuple(p.parts for p in local),
        )

    def step_parts(self, global_batch: int) -> Parts:
        """What a host loader counts the steps and the state over (`tbljax.order.Parts`):
        every process serves steps_per_epoch × G/P positions an epoch."""
        index, processes = self.processes
        if global_batch % processes:
            raise ValueError(
                f"global batch {global_batch} does not split evenly over "
                f"{processes} processes: with partition='host' use a multiple "
                f"of {processes}"
            )
        n = self.steps_per_epoch(global_batch) * (global_batch // processes)
        return Parts((n,) * processes, index)

    def __repr__(self) -> str:
        # Never opens a source: repr must work on a mixture whose files are elsewhere (another
        # host's part) or missing; the record count is said once the sources are open.
        parts = ", ".join(f"{n}: {w:g}" for n, w in zip(self.sources, self.weights))
        opened = "datasets" in self.__dict__  # the cached_property has run
        return f"Mixture({parts}; {len(self)} records)" if opened else f"Mixture({parts})"

    def steps_per_epoch(self, batch: int) -> int:
        """Steps of an epoch at global batch `batch`: steps_per_epoch as given, or one pass over
        the `epoch_of` source (its records ÷ the rows it gets a step, rounded down, at least 1;
        under host parts the whole source's records, so every process runs the same steps)."""
        if self._steps_per_epoch is not None:
            return int(self._steps_per_epoch)
        k = self.sources.index(self.epoch_of)
        share = float(MixSpec(self.weights, (1,) * len(self.weights)).shares[k])
        return max(1, int(self.source_counts[k] // (batch * share)))

    def split(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(source, record in that source) of mixture records `indices` (negative ones count
        from the end, as for every dataset)."""
        idx = np.asarray(indices, np.int64)
        idx = np.where(idx < 0, idx + len(self), idx)
        k = np.searchsorted(self.offsets, idx, side="right") - 1
        return k, idx - self.offsets[k]

    # ---- the dataset contract, over the records numbered one source after another ----
    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def paths(self) -> list[str]:
        return [p for d in self.datasets for p in d.paths]

    @cached_property
    def description(self) -> dict:
        """What the fingerprint hashes, as plain lists (a loader's state keeps it, so that a
        resume refused for another mixture says what differs)."""
        return {
            "sources": list(self.sources),
            "weights": list(self.weights),
            "fingerprints": [d.fingerprint for d in self.datasets],
            "label_offsets": list(self.label_offsets),
            "steps_per_epoch": self._steps_per_epoch,
            "epoch_of": self.epoch_of,
        }

    @cached_property
    def fingerprint(self) -> str:
        d = self.description  # hashed in the shape it has always had: saved states stay valid
        described = json.dumps(
            {
                "sources": d["sources"],
                "weights": d["weights"],
                "fingerprints": d["fingerprints"],
                "label_offsets": d["label_offsets"],
                "epoch": [d["steps_per_epoch"], d["epoch_of"]],
            }
        )
        crc = _core.crc32(np.frombuffer(described.encode(), np.uint8), 0)
        return f"mix{sum(self.source_counts)}-{crc:08x}"  # the same on every process

    @cached_property
    def labels(self) -> np.ndarray:
        """Each source's own ids, plus its `label_offset` (-1 stays -1: no label)."""
        out = []
        for d, off in zip(self.datasets, self.label_offsets):
            lab = np.asarray(d.labels, np.int64)
            out.append(np.where(lab >= 0, lab + off, -1))
        return np.concatenate(out)

    @cached_property
    def keys(self) -> list[str]:
        return [k for d in self.datasets for k in d.keys]

    @property
    def classes(self):
        return None  # each source keeps its own: `mixture.datasets[k].classes`

    @property
    def record_format(self) -> str:
        kinds = {d.record_format for d in self.datasets}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def compact(self) -> bool:
        return all(d.compact for d in self.datasets)

    @cached_property
    def geometry(self) -> RecordGeometry:
        shapes = {d.image_shape for d in self.datasets}
        if len(shapes) == 1 and None not in shapes:
            return RecordGeometry(*shapes.pop())
        hs, ws = [], []
        for d in self.datasets:
            g = d.geometry
            hs.append(np.broadcast_to(g.heights, (len(d),)))
            ws.append(np.broadcast_to(g.widths, (len(d),)))
        return RecordGeometry(np.concatenate(hs), np.concatenate(ws))

    @property
    def image_shape(self):
        return self.geometry.shape

    @cached_property
    def fields(self) -> dict:
        """The record fields every source has, with one kind, dtype and shape in all of them."""
        first, *rest = [d.fields for d in self.datasets]
        return {n: f for n, f in first.items() if all(r.get(n) == f for r in rest)}

    def field_rows(self, name: str, indices, out: np.ndarray | None = None):
        if name not in self.fields:
            raise KeyError(f"{self!r} has no field {name!r} common to its sources (fields: {sorted(self.fields)})")
        k, r = self.split(record_numbers(indices, len(self), "a mixture"))
        parts = {s: self.datasets[s].field_rows(name, r[k == s]) for s in np.unique(k).tolist()}
        if self.fields[name].fixed:
            first = next(iter(parts.values()))
            res = out if out is not None else np.empty((len(k), *first.shape[1:]), first.dtype)
            for s, v in parts.items():
                res[k == s] = v
            return res
        taken = {s: iter(v) for s, v in parts.items()}
        return [next(taken[s]) for s in k.tolist()]

    def records(self) -> Records:
        return self._records

    @cached_property
    def _records(self) -> Records:
        return Records.concat([d.records() for d in self.datasets])

    def _file_base(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(d.paths) for d in self.datasets])])

    def _one(self, i: int) -> tuple[int, int]:
        k, r = self.split([record_number(i, len(self), "a mixture")])
        return int(k[0]), int(r[0])

    def read(self, i: int) -> np.ndarray:
        k, r = self._one(i)
        return self.datasets[k].read(r)

    def read_into(self, indices, out, threads: int = 0):
        k, r = self.split(indices)
        for s in np.unique(k).tolist():
            m = np.flatnonzero(k == s)
            out[m] = self.datasets[s].read_into(r[m], np.empty((len(m), *out.shape[1:]), np.uint8), threads)
        return out

    def locate(self, i: int) -> tuple[str, int]:
        k, r = self._one(i)
        return self.datasets[k].locate(r)

    def check_unchanged(self, files=None) -> None:
        if files is None:
            for d in self.datasets:
                d.check_unchanged()
            return
        base = self._file_base()
        files = np.asarray(files, np.int64)
        for s, d in enumerate(self.datasets):
            mine = files[(files >= base[s]) & (files < base[s + 1])] - base[s]
            if len(mine):
                d.check_unchanged(mine)


def _checked_source(name, source):
    """A source as given, checked for its type (it is opened when first used). A mixture is
    refused: its own weights would not carry through (give its sources to one tbljax.mix)."""
    if isinstance(source, Mixture):
        raise TypeError(
            f"tbljax.mix: source {name!r} is itself a mixture, which tbljax.mix does not "
            "take: give its sources to one tbljax.mix, with weights multiplied through"
        )
    given = paths_or_dataset(source, f"tbljax.mix: source {name!r}")
    return given if isinstance(source, (list, tuple)) else source


def _by_name(what: str, mapping: Mapping) -> dict:
    """{str(key): value} of a mix() argument keyed by source name (the names are the keys as
    str); ValueError when two keys are one name (1 and "1")."""
    out, keys = {}, {}
    for k, v in mapping.items():
        name = str(k)
        if name in out:
            raise ValueError(
                f"tbljax.mix: {what} has keys {keys[name]!r} and {k!r}, which are one source name {name!r}"
            )
        out[name], keys[name] = v, k
    return out


def _weight(name: str, w) -> float:
    """A source's weight as a float: a finite real number > 0 (MixSpec checks the set)."""
    if not is_real(w) or not (np.isfinite(w) and w > 0):
        raise ValueError(f"tbljax.mix: weights[{name!r}] must be a finite number > 0, got {w!r}")
    return float(w)


def mix(
    sources: Mapping,
    weights: Mapping,
    *,
    steps_per_epoch: int | None = None,
    epoch_of: str | None = None,
    label_offset: Mapping | None = None,
) -> Mixture:
    """Several datasets served as one stream by weight.

    Args:
      sources: ``{name: TBL path, list of shard paths, or dataset}``, opened when first used.
        Sources may differ in record kind (RAW, compact, ...) and geometry (serve them with
        one output size, ``augment=Augment(size=...)``) and in classes. With paths, a loader's
        ``partition="host"`` reads each process's part of every source (`Mixture.open_part`).
      weights: ``{name: weight}`` for every source (normalized; any positive numbers).
      steps_per_epoch: the length of an epoch in steps; or
      epoch_of: the name of the source one pass over which is an epoch.
      label_offset: ``{name: int}`` added to that source's labels (a joint label space);
        without it each row's label is its source's own id.

    Each step's rows are drawn from the sources by weight as a pure function of (seed, epoch,
    step, row) (`tbljax._src.rules.mixing`): every step holds each source's share of rows to
    within one, records of a source are taken without replacement and reshuffled at each pass
    over it (a small source repeats, a large one is not exhausted), and a loader's state
    resumes the stream exactly. Batches carry ``"source"``: the source of each row, an index
    into ``mixture.sources``; ``"index"`` is the row's record in the mixture's numbering
    (source k's record r is ``mixture.offsets[k] + r``).
    """
    return Mixture(sources, weights, steps_per_epoch=steps_per_epoch, epoch_of=epoch_of, label_offset=label_offset)
