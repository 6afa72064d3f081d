"""The record fields a loader serves beside the image (`FieldServing`): which ones (`fields=`),
how a ragged one is cut or padded (`pad=`), what a `field_fn` makes of a batch's values, and
one step's values built in the producer thread: arrays per row range (fixed fields, padded
ragged fields and their ``_length``, `field_fn` outputs), lists for str/json fields.
"""

from __future__ import annotations

import numpy as np

from tbljax._src.engine.geometric_serving import geometric_names
from tbljax._src.rules.contract import is_integer
from tbljax._src.rules.dataset import FieldInfo, RecordDataset

__all__ = ["MAX_PAD_BYTES", "FieldServing", "check_pad"]

MAX_PAD_BYTES = 1 << 34  # 16 GiB of one field's padded values: more is a mistyped length


def check_pad(name: str, length, info: FieldInfo, rows: int) -> int:
    """`pad[name]` as an int: an integer >= 1 (the lengths served are int32) whose padded
    values for `rows` records (rows x length x a row's bytes) fit `MAX_PAD_BYTES`; ValueError
    naming pad otherwise, before anything is allocated."""
    if not is_integer(length) or not 1 <= length <= np.iinfo(np.int32).max:
        raise ValueError(f"pad[{name!r}] must be an integer in [1, 2**31 - 1], got {length!r}")
    row = int(np.prod(info.shape[1:], dtype=np.int64)) * info.dtype.itemsize
    need = int(rows) * int(length) * max(row, 1)
    if need > MAX_PAD_BYTES:
        raise ValueError(
            f"pad[{name!r}] = {length} rows of {row} bytes for {rows} records is {need} bytes "
            f"of padded values (at most {MAX_PAD_BYTES}): give the length a record "
            "needs"
        )
    return int(length)


class FieldServing:
    """The fields one loader serves from `dataset`, `rows` rows a step, checked at construction:
    an unknown name, a ragged field without `pad`, a `pad`/`field_fn` for a field not served, a
    `pad` too long to allocate are errors naming it."""

    def __init__(self, dataset: RecordDataset, fields, field_fn, pad, rows: int):
        infos = dataset.fields
        if fields == "all":
            names = list(infos)
        elif fields is None:
            names = []
        else:
            names = list(fields)
            for n in names:
                if n not in infos:
                    raise KeyError(f"fields= names {n!r}, which {dataset!r} does not have; its fields: {list(infos)}")
        fns, pads = dict(field_fn or {}), dict(pad or {})
        # Masks, boxes, ...: served through the image's geometry (engine/geometric_serving.py),
        # unless a field_fn or pad asks for the stored values.
        self.geometric = geometric_names(infos, [n for n in names if n not in fns and n not in pads])
        names = [n for n in names if n not in self.geometric]
        for what, d in (("field_fn", fns), ("pad", pads)):
            for n in d:
                if n not in names:
                    raise KeyError(f"{what} names field {n!r}, which is not served (fields served: {names})")
        for n, length in pads.items():
            if not infos[n].ragged:
                raise ValueError(
                    f"pad[{n!r}]: field {n!r} is {infos[n].kind} of shape {infos[n].shape}, not a ragged ndarray field"
                )
            check_pad(n, length, infos[n], rows)
        for n, fn in fns.items():
            if not callable(fn):
                raise TypeError(f"field_fn[{n!r}] must be callable, got {type(fn).__name__}")
        for n in names:
            if infos[n].ragged and n not in pads and n not in fns:
                raise ValueError(
                    f"field {n!r} is ragged (shape {infos[n].shape}): pass pad={{{n!r}: length}} "
                    "to serve it cut or zero-padded to length rows (with "
                    f"{n + '_length'!r}), a field_fn for it, or leave it out with fields="
                )
        self.dataset, self.names, self.infos = dataset, names, {n: infos[n] for n in names}
        self.fns, self.pads = fns, {n: int(v) for n, v in pads.items()}

    def __bool__(self) -> bool:
        return bool(self.names)

    def build(
        self, records: list[np.ndarray], rows: list[int], epoch: int, position: int
    ) -> tuple[dict[str, tuple[np.ndarray, ...]], dict[str, list]]:
        """One step's fields: `records[r]` are the valid records of row range r (of `rows[r]`
        rows; the rest are padding). Returns (arrays per range by name, lists by name)."""
        arrays: dict[str, tuple[np.ndarray, ...]] = {}
        lists: dict[str, list] = {}
        ds = self.dataset
        total = int(sum(rows))
        allrec = np.concatenate(records) if len(records) > 1 else records[0]
        valid = np.concatenate([np.arange(r) < len(rec) for rec, r in zip(records, rows)])
        rowpos = np.flatnonzero(valid)  # where the valid records sit among this process's rows
        for n in self.names:
            info = self.infos[n]
            if info.fixed:
                out = np.zeros((total, *info.shape), info.dtype)
                out[rowpos] = ds.field_rows(n, allrec)
                value = out
            elif info.ragged and n not in self.fns:
                length = self.pads[n]
                out = np.zeros((total, length, *info.shape[1:]), info.dtype)
                lengths = np.zeros(total, np.int32)
                sub = np.zeros((len(allrec), length, *info.shape[1:]), info.dtype)
                sub_len = np.zeros(len(allrec), np.int32)
                ds.field_padded(n, allrec, length, sub, sub_len)
                out[rowpos], lengths[rowpos] = sub, sub_len
                arrays[n], arrays[n + "_length"] = _split(out, rows), _split(lengths, rows)
                continue
            else:
                empty = (
                    ""
                    if info.kind == "str"
                    else (np.zeros((0, *info.shape[1:]), info.dtype) if info.kind == "ndarray" else None)
                )
                value = [empty] * total
                for p, v in zip(rowpos.tolist(), ds.field_rows(n, allrec)):
                    value[p] = v
            if n in self.fns:
                try:
                    made = np.asarray(self.fns[n](value))
                except Exception as e:
                    raise RuntimeError(
                        f"field_fn[{n!r}] failed at the step of epoch {epoch}, position "
                        f"{position}: {type(e).__name__}: {e}"
                    ) from e
                if made.ndim < 1 or made.shape[0] != total or made.dtype.kind not in "biuf":
                    raise ValueError(
                        f"field_fn[{n!r}] must return a numeric array of {total} rows (this "
                        f"process's rows), got {made.dtype} {made.shape} at epoch {epoch}, "
                        f"position {position}"
                    )
                made = np.array(made)  # owned: the consumer may keep it
                made[~valid] = 0
                arrays[n] = _split(made, rows)
            elif info.fixed:
                arrays[n] = _split(value, rows)
            else:
                lists[n] = value
        return arrays, lists


def _split(a: np.ndarray, rows: list[int]) -> tuple[np.ndarray, ...]:
    cuts = np.cumsum(rows)[:-1]
    return tuple(np.split(a, cuts)) if len(rows) > 1 else (a,)
