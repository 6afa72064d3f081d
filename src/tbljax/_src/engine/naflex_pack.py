"""Packed NaFlex sequences as the loaders serve them (``Patches(pack=True)``, issue 49): each
record resized to its sequence size at ``image_tokens`` (`naflex.sequence_size`), the epoch's
records packed first-fit-decreasing into sequences of ``max_tokens`` (`naflex.pack`, windows
of ``pack_window`` records of the epoch's order), G sequences a step. A row of a batch is a
sequence; positions count sequences, so a step starts at a multiple of G. Each image's patches
are `native_res.PatchServing`'s at ``image_tokens``, copied to the sequence at its offset;
record fields come per segment (B, S, ...).

>>> ps = PackServing(ds.geometry, len(ds), opts, 8)
>>> ps.steps(0), ps.segments   # steps of epoch 0; the most images a sequence holds
"""

from __future__ import annotations

import dataclasses
import functools
import typing

import numpy as np

from tbljax._src.engine import native_res
from tbljax._src.rules import naflex, order
from tbljax._src.rules.options import LoaderOptions

__all__ = ["PACK_KEYS", "PackServing", "Placed"]

PACK_KEYS = ("patch_yx", "patch_valid", "segment_ids", "segment_index", "segment_label")


class _Epoch(typing.NamedTuple):
    packing: naflex.Packing
    by_seq: np.ndarray  # positions of the epoch's order, sorted by (sequence, offset)
    seq_start: np.ndarray  # by_seq[seq_start[q]:seq_start[q + 1]]: sequence q's positions
    steps: int


class Placed(typing.NamedTuple):
    """Where the drawn records of a row range go: row (in the range) and first token, sorted
    by (row, offset)."""

    row: np.ndarray  # int64
    offset: np.ndarray  # int64

    @property
    def segment(self) -> np.ndarray:
        """Each record's segment in its row: 0, 1, … by offset."""
        return np.arange(len(self.row)) - np.searchsorted(self.row, self.row, side="left")


class PackServing:
    """The packing of a loader over n records (their stored sizes: the boxes are whole
    records) with G sequences a step."""

    def __init__(self, geometry, n: int, opts: LoaderOptions, global_batch: int):
        p = opts.patches
        self.opts, self.n, self.g = opts, int(n), int(global_batch)
        self.t, self.size = p.max_tokens, p.size
        # Each image's rows: what a loader at max_tokens=image_tokens serves for it.
        self.image = native_res.PatchServing(
            geometry, n, dataclasses.replace(opts, patches=naflex.Patches(p.size, p.image_tokens))
        )
        h, w = self.image.heights, self.image.widths
        th, tw = naflex.sequence_size(h, w, p.size, p.image_tokens)
        self.tokens = (th.astype(np.int64) // p.size) * (tw // p.size)  # every record's, fixed
        self.segments = int(self.t // self.tokens.min())  # the most images one sequence can hold
        self.row_shape = (self.t, p.size * p.size * 3)
        self._scratch = native_res.Scratch()  # each image's rows before they are packed
        self._epoch = functools.lru_cache(maxsize=2)(self._pack)

    def _pack(self, epoch: int) -> _Epoch:
        o = self.opts
        rec = order.permute(np.arange(self.n), self.n, o.seed, epoch, shuffle=o.shuffle)
        pk = naflex.pack(self.tokens[rec], self.t, o.patches.pack_window)
        by_seq = np.lexsort((pk.offset, pk.seq))
        seq_start = np.searchsorted(pk.seq[by_seq], np.arange(pk.sequences + 1))
        steps = pk.sequences // self.g if o.drop_remainder else -(-pk.sequences // self.g)
        return _Epoch(pk, by_seq, seq_start, steps)

    def packing(self, epoch: int) -> naflex.Packing:
        """Where each position of epoch `epoch`'s order is packed (sequence, first token)."""
        return self._epoch(int(epoch)).packing

    def steps(self, epoch: int = 0) -> int:
        """Steps of epoch `epoch` (the sequence count, so the steps, varies a little by epoch)."""
        return self._epoch(int(epoch)).steps

    def starts(self, epoch: int, position: int = 0):
        """The first positions of the steps of `epoch` from `position` (a multiple of G)."""
        if position % self.g:
            raise ValueError(
                f"position {position} of epoch {epoch} is not the start of a step of {self.g} packed sequences "
                "(a state saved at another batch size resumes at an epoch boundary)"
            )
        return list(range(position, self.steps(epoch) * self.g, self.g))

    def next_cursor(self, epoch: int, first: int) -> tuple[int, int]:
        nxt = first + self.g
        return (epoch, nxt) if nxt < self.steps(epoch) * self.g else (epoch + 1, 0)

    def positions(self, epoch: int, first: int, a: int, b: int) -> tuple[np.ndarray, Placed]:
        """The epoch's record positions in sequences [first + a, first + b) and where each goes."""
        e = self._epoch(int(epoch))
        q0, q1 = (min(first + k, e.packing.sequences) for k in (a, b))
        pos = e.by_seq[e.seq_start[q0] : e.seq_start[q1]]
        return pos, Placed(e.packing.seq[pos] - (first + a), e.packing.offset[pos].astype(np.int64))

    def fill(self, src, records, out, placed: Placed, *, boxes, flip, **kw):
        """Writes records `records` into the sequences `out` (rows, T, p·p·3) at `placed`,
        zeros elsewhere; returns each record's (h, w) as resized."""
        shape = (len(records), *self.image.row_shape)
        rows = self._scratch(int(np.prod(shape)), out.dtype).reshape(shape)  # every row written by fill
        hw = self.image.fill(src, records, rows, boxes=boxes, flip=flip, **kw)
        out[...] = 0
        tok = (hw[:, 0] // self.size) * (hw[:, 1] // self.size)
        for k, (r, o, t) in enumerate(zip(placed.row.tolist(), placed.offset.tolist(), tok.tolist())):
            out[r, o : o + t] = rows[k, :t]
        return hw

    def arrays(self, drawn, hws, labels, rows) -> dict:
        """Per row range: ``patch_yx`` (B, T, 2) int32 (each token's place in its own image's
        grid), ``patch_valid`` (B, T) bool, ``segment_ids`` (B, T) int32 (1, 2, … by offset, 0
        for padding), ``segment_index`` and ``segment_label`` (B, S) int32 (each segment's
        record and label, -1 past the sequence's images)."""
        out = {name: [] for name in PACK_KEYS}
        p, t, s = self.size, self.t, self.segments
        for d, hw, lab, r in zip(drawn, hws, labels, rows):
            yx = np.zeros((r, t, 2), np.int32)
            seg = np.zeros((r, t), np.int32)
            index = np.full((r, s), -1, np.int32)
            label = np.full((r, s), -1, np.int32)
            row, off = d.placed
            number = d.placed.segment
            for k in range(len(row)):
                gh, gw = int(hw[k, 0]) // p, int(hw[k, 1]) // p
                cells = slice(off[k], off[k] + gh * gw)
                yx[row[k], cells] = np.stack(np.divmod(np.arange(gh * gw), gw), -1)
                seg[row[k], cells] = number[k] + 1
            index[row, number] = d.indices
            label[row, number] = lab
            out["patch_yx"].append(yx)
            out["patch_valid"].append(seg > 0)
            out["segment_ids"].append(seg)
            out["segment_index"].append(index)
            out["segment_label"].append(label)
        return out

    def fields(self, serving, drawn, rows, epoch: int, first: int) -> tuple[dict, dict]:
        """The record fields per segment (`FieldServing.build` over the step's records, field_fn
        included): arrays (B, S, ...) per row range, zeros past a sequence's images; lists
        (this process's rows, each a list of S values, "" / None past its images)."""
        flat, texts = serving.build([d.records for d in drawn], [len(d.records) for d in drawn], epoch, first)
        arrays = {}
        for name, pieces in flat.items():
            out = []
            for d, piece, r in zip(drawn, pieces, rows):
                a = np.zeros((r, self.segments, *piece.shape[1:]), piece.dtype)
                a[d.placed.row, d.placed.segment] = piece
                out.append(a)
            arrays[name] = tuple(out)
        lists = {}
        for name, values in texts.items():
            empty = "" if serving.infos[name].kind == "str" else None
            grouped, k = [], 0
            for d, r in zip(drawn, rows):
                block = [[empty] * self.segments for _ in range(r)]
                for row, seg in zip(d.placed.row.tolist(), d.placed.segment.tolist()):
                    block[row][seg] = values[k]
                    k += 1
                grouped += block
            lists[name] = grouped
        return arrays, lists
