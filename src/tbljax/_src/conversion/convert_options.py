"""The arguments of `tbljax.convert`, checked once: `ConvertOptions`, a frozen dataclass that
validates itself when made (as `LoaderOptions` does for the loaders), so the conversion reads
settled values. The recipe rules (sizes, resize modes, record formats, JPEG quality and chroma)
and the names they accept are here, with `ConversionError`, the error of a conversion that
cannot give a sound file, and `ConvertSummary`, what a conversion returns; `conversion.py` does
the work."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tbljax import _core
from tbljax._src.file.fields import GEOMETRIC_ROLES, check_name, kind_for_extension
from tbljax._src.file.format import stored_entry
from tbljax._src.rules import contract
from tbljax._src.rules.contract import Arg, ArgumentError, is_real
from tbljax._src.rules.errors import ConversionError, OutputExistsError  # their home; imported here too
from tbljax._src.rules.partition import parse_part
from tbljax._src.sources.items import IMAGE_EXTENSIONS

__all__ = [
    "CHROMA",
    "CHUNK",
    "FIXED_SIZE_MODES",
    "RECORD_FORMATS",
    "RESIZE_MODES",
    "ConversionError",
    "ConvertOptions",
    "ConvertSummary",
    "OutputExistsError",
    "num_classes",
]

RESIZE_MODES = contract.RESIZE_MODES  # the C++ resize's names
FIXED_SIZE_MODES = contract.SQUARE_RESIZE_MODES  # every record S x S
RECORD_FORMATS = ("raw", "jpeg", "lz4")
CHROMA = ("420", "444")
# The arguments that shape records decoded from images; a TBL source keeps its own geometry.
_IMAGE_ONLY = (
    "image_size",
    "max_long_side",
    "quality",
    "chroma",
    "raw_budget",
    "labels",
    "classes",
    "label_ext",
    "shard",
    "image_column",
    "label_column",
    "image_key",
    "label_key",
)
# Which record of a table (Hugging Face, Parquet) or of a tf.train.Example (TFDS) holds what.
_NAMES = ("image_column", "label_column", "image_key", "label_key")


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """`tbljax.convert`'s keyword arguments (documented there), validated in `__post_init__`
    in the order `convert` has always checked them, so the first bad one is the one named.
    ``from_tbl``: the source is a TBL dataset (decoded record for record: the recipe
    arguments do not apply). After validation ``shard`` is an ``(i, n)`` pair or None and
    ``chroma`` the subsampling compact records get (None unless ``quality`` is given).

    >>> ConvertOptions(image_size=160, format="jpeg", quality=90).chroma
    '420'
    """

    image_size: int | None = None
    resize: str = "center_crop"
    max_long_side: int | None = None
    format: str = "raw"
    quality: int | None = None
    chroma: str | None = None
    raw_budget: float | None = None
    threads: int | None = None
    strict: bool = False
    overwrite: bool = False
    labels: Sequence[int | str] | None = None
    classes: Sequence[str] | str | os.PathLike | None = None
    label_ext: str | None = None
    shard: tuple[int, int] | str | None = None
    progress: bool | None = None
    progress_interval: float | None = None
    retries: int = 5
    retry_backoff: float = 0.5
    image_column: str | None = None
    label_column: str | None = None
    image_key: str | None = None
    label_key: str | None = None
    fields: Mapping[str, Any] | Sequence[str] | None = None
    from_tbl: bool = False
    # The geometric fields a source declares itself (a COCO source's boxes and masks), by name.
    declared: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Set from fields= and `declared`: the geometric fields' declarations (tbljax.Mask, ...), by name.
    geometric: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.format not in RECORD_FORMATS:
            raise ArgumentError(Arg("format"), f" must be one of {RECORD_FORMATS}, got {self.format!r}")
        if self.from_tbl:
            self._check_tbl_source()
        if self.shard is not None:
            object.__setattr__(self, "shard", parse_part(self.shard, "shard"))
        if not self.from_tbl:
            object.__setattr__(self, "chroma", self._checked_recipe())
        contract.check_threads(self.threads)
        if self.progress not in (None, True, False):
            raise ValueError(f"progress must be None, True or False, got {self.progress!r}")
        interval = self.progress_interval
        if interval is not None and (not is_real(interval) or not interval > 0):
            raise ArgumentError(Arg("progress_interval"), f" must be a positive number of seconds, got {interval!r}")
        if self.declared and self.fields is not None:
            raise ArgumentError(
                Arg("fields", ...),
                " does not apply to a COCO source: its fields are its boxes and masks (coco(boxes=, masks=))",
            )
        if self.fields is not None:
            object.__setattr__(self, "fields", self._checked_fields())
        object.__setattr__(self, "geometric", {**self.geometric, **self.declared})
        if self.geometric and self.format == "jpeg" and self.quality is None:
            raise ArgumentError(
                "geometric fields (",
                ", ".join(sorted(self.geometric)),
                ") are stored at the record's geometry: ",
                Arg("format", "jpeg"),
                " without ",
                Arg("quality", 90),
                " keeps the photo's own; convert to RAW or re-encode",
            )
        ext = self.label_ext
        if ext is not None and (not isinstance(ext, str) or not ext or "/" in ext):
            raise ArgumentError(Arg("label_ext"), f" must be a member extension such as 'txt' or 'cls', got {ext!r}")
        for name in _NAMES:
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ArgumentError(Arg(name), f" must be a column or feature name (a non-empty str), got {v!r}")

    def _checked_fields(self) -> dict[str, str] | tuple[str, ...]:
        """fields= as {name: extension} (lower case, no leading dot; TAR members and sidecar
        files), or as a tuple of column / feature names (Hugging Face, Parquet, TFRecord and
        ArrayRecord sources); each name and kind checked."""
        if self.from_tbl:
            raise ArgumentError(
                Arg("fields", ...), " names TAR members or sidecar files; a TBL source keeps its own fields"
            )
        if isinstance(self.fields, (list, tuple)):
            for name in self.fields:
                check_name(name)
            twice = sorted({n for n in self.fields if list(self.fields).count(n) > 1})
            if twice:
                raise ArgumentError(Arg("fields", ...), f" names {twice} more than once")
            return tuple(self.fields)
        if not isinstance(self.fields, Mapping):
            raise TypeError(
                f"fields must be a dict {{name: extension}} such as {{'caption': 'txt'}} "
                "(TAR members, sidecar files) or a list of column names (Hugging Face, "
                f"Parquet, TFRecord, ArrayRecord), got {type(self.fields).__name__}"
            )
        out = {}
        geometric = {n: v for n, v in self.fields.items() if isinstance(v, tuple(GEOMETRIC_ROLES.values()))}
        labels = [g.labels for g in geometric.values() if getattr(g, "labels", None)]
        clash = sorted(set(labels) & set(self.fields)) or sorted({x for x in labels if labels.count(x) > 1})
        if clash:
            raise ArgumentError(Arg("fields", ...), f" names {clash[0]!r} both as a field and as Boxes(labels=)")
        object.__setattr__(self, "geometric", geometric)
        for name, ext in self.fields.items():
            check_name(name)
            if name in geometric and ext.ext is None:
                continue  # read by key (a dict source, a column, a feature): no extension
            ext = getattr(ext, "ext", ext)
            if not isinstance(ext, str) or not ext.strip(".") or "/" in ext:
                raise ValueError(
                    f"field {name!r}: the extension must be a member extension such as "
                    f"'txt', 'json' or 'emb.npy', got {ext!r}"
                )
            ext = ext.lower().lstrip(".")
            kind_for_extension(ext)
            out[name] = ext
        return out

    def _check_tbl_source(self) -> None:
        given = {k: getattr(self, k) for k in _IMAGE_ONLY}
        given["resize"] = None if self.resize == "center_crop" else self.resize
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            names = [p for k in extra for p in (", ", Arg(k))][1:]
            raise ArgumentError(
                "a TBL source is decoded record for record at its stored geometry: ",
                *names,
                f" {'does' if len(extra) == 1 else 'do'} not apply to it",
            )
        if self.format == "jpeg":
            raise ArgumentError(
                "a TBL source converts to ",
                Arg("format", "raw"),
                " or ",
                Arg("format", "lz4"),
                "; to make JPEG records, convert the original images",
            )

    def _checked_recipe(self) -> str | None:
        """Checks the recipe of a conversion from images; returns the chroma to use."""
        size, resize, cap, quality, chroma = (
            self.image_size,
            self.resize,
            self.max_long_side,
            self.quality,
            self.chroma,
        )
        if size is None:
            raise ArgumentError(Arg("image_size"), f" is required (an int in [1, {contract.MAX_SIDE}])")
        if not contract.is_integer(size) or not 1 <= size <= contract.MAX_SIDE:
            raise ArgumentError(Arg("image_size"), f" must be an int in [1, {contract.MAX_SIDE}], got {size!r}")
        if resize not in RESIZE_MODES:
            raise ArgumentError(Arg("resize"), f" must be one of {RESIZE_MODES}, got {resize!r}")
        if cap is not None:
            if resize != "shorter_side":
                raise ArgumentError(
                    Arg("max_long_side"), " caps ", Arg("resize", "shorter_side"), f" only; resize is {resize!r}"
                )
            if not contract.is_integer(cap) or not size <= cap <= contract.MAX_SIDE:
                raise ArgumentError(
                    Arg("max_long_side"),
                    " must be an int in [",
                    Arg("image_size"),
                    f", {contract.MAX_SIDE}] = [{size}, {contract.MAX_SIDE}], got {cap!r}",
                )
        if quality is not None:
            if self.format != "jpeg":
                raise ArgumentError(
                    Arg("quality", ...),
                    " re-encodes JPEG records: it needs ",
                    Arg("format", "jpeg"),
                    f", not {self.format!r}",
                )
            if not contract.is_integer(quality) or not 1 <= quality <= 100:
                raise ArgumentError(
                    Arg("quality"), f" must be an int in [1, 100] or None (the original bytes), got {quality!r}"
                )
        elif chroma is not None or self.raw_budget is not None:
            raise ArgumentError(
                Arg("chroma" if chroma is not None else "raw_budget", ...),
                " applies to re-encoded JPEG records: pass ",
                Arg("quality", ...),
                " (e.g. 90) with ",
                Arg("format", "jpeg"),
            )
        elif self.format == "jpeg" and resize not in FIXED_SIZE_MODES:
            raise ArgumentError(
                Arg("format", "jpeg"),
                " with the original bytes serves square batches: use ",
                Arg("resize", "center_crop"),
                f" or 'squash', or re-encode at the {resize!r} geometry with ",
                Arg("quality", 90),
            )
        if chroma is not None and chroma not in CHROMA:
            raise ArgumentError(Arg("chroma"), f" must be one of {CHROMA}, got {chroma!r}")
        budget = self.raw_budget
        if budget is not None and (not is_real(budget) or not 0 < budget <= 1):
            raise ArgumentError(
                Arg("raw_budget"),
                f" must be the records' bytes as a fraction of their RAW pixels', in (0, 1] (e.g. 0.2), got {budget!r}",
            )
        return (chroma or "420") if quality is not None else None

    @property
    def pool_threads(self) -> int:
        """The threads of the conversion's own pools: `threads`, or the core's default."""
        return self.threads or _core.native_info()["default_threads"]

    def recipe(self) -> dict[str, Any]:
        """The recipe a conversion from images records: size, resize, format (and the cap of
        shorter_side, and what compact JPEG records hold)."""
        recipe: dict[str, Any] = {"image_size": self.image_size, "resize": self.resize, "format": self.format}
        if self.resize == "shorter_side":
            recipe["max_long_side"] = self.max_long_side
        if self.format == "jpeg":  # compact records hold the converted geometry: a plain decode
            recipe.update(quality=self.quality, chroma=self.chroma, **stored_entry(compact=bool(self.quality)))
            if self.raw_budget is not None:
                recipe["raw_budget"] = float(self.raw_budget)
        return recipe


CHUNK = 32  # items decoded per call into the C++ pool: peak RSS flat in N (256 grew it 2.3x at 4x N)


@dataclasses.dataclass
class ConvertSummary:
    """What a conversion did. `label_errors` lists the written records whose label could not
    be read (their label is -1), each {'key', 'source', 'reason'}."""

    dst: str
    written: int
    skipped: list[dict[str, str]]
    seconds: float
    bytes: int
    label_errors: list[dict[str, str]] = dataclasses.field(default_factory=list)
    classes: list[str] | None = None
    num_classes: int = 0  # class names, or distinct label ids; 0: no record has a label
    labels_from: tuple[str | Arg, ...] = ()  # where the sources' labels come from (said when there are none)
    left_out: list[str] = dataclasses.field(default_factory=list)  # a folder's files not named as images

    @property
    def images_per_second(self) -> float:
        return (self.written + len(self.skipped)) / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        return self.words()

    def words(self, flags: Mapping[str, tuple[str, bool]] | None = None) -> str:
        """The report, naming arguments in the API's words or (given `flags`) the command line's."""
        head = (
            f"wrote {self.written} records to {self.dst} ({self.bytes / 2**20:.1f} MiB) in "
            f"{self.seconds:.1f} s ({self.images_per_second:.0f} img/s); skipped {len(self.skipped)}"
        )
        if self.label_errors:
            head += f"; labels unreadable {len(self.label_errors)}"
        head += f"; classes {self.num_classes}" if self.num_classes else "; unlabelled"
        if self.left_out:
            head += f"; left out {len(self.left_out)} (extension)"
        lines = [head]
        if self.left_out:
            more = f" and {len(self.left_out) - 5} more" if len(self.left_out) > 5 else ""
            lines.append(
                f"  left out for their extension (images are {', '.join(sorted(IMAGE_EXTENSIONS))}): "
                f"{', '.join(self.left_out[:5])}{more}"
            )
        if not self.num_classes and self.written:
            lines.append(f"  unlabelled: every record's label is -1; {contract.worded(self.labels_from, flags)}")
        for title, items in (("skipped", self.skipped), ("label unreadable", self.label_errors)):
            for s in items[:20]:
                lines.append(f"  {title} {s['key']} ({s['source']}): {s['reason']}")
            if len(items) > 20:
                where = "Dataset.skipped lists all" if title == "skipped" else "summary.label_errors lists all"
                lines.append(f"  ... and {len(items) - 20} more ({where})")
        return "\n".join(lines)


def num_classes(labels: np.ndarray, classes: list[str] | None) -> int:
    """The class count a summary shows: the names, else the distinct ids; 0 when unlabelled."""
    known = labels[labels >= 0]
    return 0 if not known.size else len(classes) if classes else int(np.unique(known).size)
