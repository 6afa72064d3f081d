"""Records of different sizes for the in-jit gather: `PackedRecords` (pages of bytes and a table
of where each record starts) and `pack_layout`, the arithmetic that places them."""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["PAGE_BYTES", "PackedRecords", "check_packed", "pack_layout"]

# Packed records start at multiples of this many bytes (so a record's place is an int32 page
# number whatever the total size; padding averages half a page a record).
PAGE_BYTES = 4096


@jax.tree_util.register_pytree_node_class
class PackedRecords:
    """RAW records of different sizes for `gather_normalize`, in two arrays: ``pages``, uint8
    ``(P, PAGE_BYTES)``, and ``table``, int32 ``(N, 3)``: record i is ``table[i, 1] x
    table[i, 2] x 3`` bytes (HWC) starting at ``pages[table[i, 0], 0]``. ``max_side`` (the
    longest side of any record) is static: it bounds how many filter taps a crop can need.
    `pack_layout` computes the table; `tbljax.ResidentDataset` of a file of records of
    different sizes holds one."""

    def __init__(self, pages, table, max_side: int):
        self.pages, self.table, self.max_side = pages, table, int(max_side)

    def tree_flatten(self):
        return (self.pages, self.table), self.max_side

    @classmethod
    def tree_unflatten(cls, max_side, children):
        return cls(*children, max_side)

    def __len__(self) -> int:
        return int(self.table.shape[0])

    def __repr__(self) -> str:
        return (
            f"PackedRecords({len(self)} records, {self.pages.shape[0]} pages of "
            f"{PAGE_BYTES} bytes, max_side={self.max_side})"
        )


def check_packed(data: PackedRecords) -> None:
    """The arrays of `data` are what the gather reads: uint8 pages of PAGE_BYTES and an int32
    (N, 3) table of at least one record."""
    if data.pages.dtype != np.uint8 or data.pages.ndim != 2 or data.pages.shape[1] != PAGE_BYTES:
        raise ValueError(
            f"PackedRecords.pages must be uint8 (P, {PAGE_BYTES}), got "
            f"{data.pages.dtype} of shape {tuple(data.pages.shape)}"
        )
    if data.table.dtype != np.int32 or data.table.ndim != 2 or data.table.shape[1] != 3 or len(data) < 1:
        raise ValueError(
            f"PackedRecords.table must be int32 (N, 3) with N >= 1, got "
            f"{data.table.dtype} of shape {tuple(data.table.shape)}"
        )


def pack_layout(heights, widths) -> tuple[np.ndarray, int]:
    """(int32 (N, 3) table of (first page, height, width), number of pages) for records of
    these sizes packed one after another, each from a page start."""
    h = np.asarray(heights, np.int64)
    w = np.asarray(widths, np.int64)
    pages = -(-(h * w * 3) // PAGE_BYTES)
    first = np.concatenate([[0], np.cumsum(pages)[:-1]]) if len(pages) else pages
    total = int(pages.sum())
    if total > np.iinfo(np.int32).max or (len(h) and (h * w * 3).max() > np.iinfo(np.int32).max):
        raise ValueError(
            f"{len(h)} records of {total * PAGE_BYTES} bytes do not fit the packed "
            "layout (int32 page numbers, records under 2 GiB)"
        )
    return np.stack([first, h, w], axis=1).astype(np.int32), total
