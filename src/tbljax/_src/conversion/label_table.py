"""Labels of a conversion: they arrive as integer ids or class names and leave as ids against
one classes table (`LabelTable`), refusing a mix of the two and, in a sharded conversion,
names without the full table."""

from __future__ import annotations

import numpy as np

from tbljax._src.conversion.convert_options import ConversionError

__all__ = ["LabelTable"]


class LabelTable:
    """Labels as int ids against one classes table.

    With a table (given, or known before reading: an image folder's subfolders, the labels= of
    arrays and file lists) names map through it and ids must lie in [-1, len). Without one,
    ids pass through and names are collected; at the end they get ids in sorted order, so every
    conversion that sees the same names makes the same table. A sharded conversion of TAR
    shards sees only some names, so there a name without a table is an error."""

    def __init__(self, classes: list[str] | None, sharded: bool):
        self.classes = classes
        self.index = {c: i for i, c in enumerate(classes)} if classes is not None else None
        self.sharded = sharded
        self.values: list[int | str] = []
        self.first_id: tuple[str, int] | None = None
        self.first_name: tuple[str, str] | None = None

    def add(self, key: str, label: int | str) -> str | None:
        """Records one written record's label; returns why it is unusable (then it is -1)."""
        if self.index is not None:
            if isinstance(label, str):
                i = self.index.get(label, -1)
                self.values.append(i)
                return None if i >= 0 else f"class name {label!r} is not in classes"
            ok = -1 <= label < len(self.index)
            self.values.append(label if ok else -1)
            return None if ok else f"label id {label} is out of range for {len(self.index)} classes"
        if isinstance(label, str):
            if self.sharded:
                raise ConversionError(
                    f"record {key} is labelled by class name ({label!r}), and this is a sharded "
                    "conversion: each job sees only some names, so tables sorted per job would give "
                    "the same class different ids. Pass the full list of names as classes= (CLI: "
                    "--classes FILE, one name per line)"
                )
            self.first_name = self.first_name or (key, label)
        elif label != -1:
            self.first_id = self.first_id or (key, label)
        if self.first_name and self.first_id:
            raise ConversionError(
                f"labels mix integer ids (record {self.first_id[0]}: {self.first_id[1]}) and class "
                f"names (record {self.first_name[0]}: {self.first_name[1]!r}); pass classes= to say "
                "which id each name has"
            )
        self.values.append(label)
        return None

    def finish(self) -> tuple[np.ndarray, list[str] | None]:
        if self.index is None and self.first_name is not None:
            table = sorted({v for v in self.values if isinstance(v, str)})
            ids = {c: i for i, c in enumerate(table)}
            return np.array([ids[v] if isinstance(v, str) else v for v in self.values], np.int64), table
        return np.asarray(self.values, np.int64).reshape(-1), self.classes
