"""Which source a conversion reads: a Hugging Face or TFDS source when convert's argument names
one (each takes its own column or feature-key arguments), else a TAR, image-folder, file-list
or array source (`files.resolve`). Arguments that do not apply to the chosen kind are refused
here, by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tbljax._src.remote import remote
from tbljax._src.rules.contract import Arg, ArgumentError
from tbljax._src.rules.errors import shown
from tbljax._src.sources import coco, files, huggingface, tfds
from tbljax._src.sources.items import Label, check_declared


def resolve(
    sources: Any,
    *,
    labels: Sequence[Label] | None,
    classes: list[str] | None,
    label_ext: str | None,
    fields: dict[str, str] | tuple[str, ...] | None,
    image_column: str | None,
    label_column: str | None,
    image_key: str | None,
    label_key: str | None,
    retry: remote.Retry,
    geometric: dict[str, Any] | None = None,
) -> Any:
    """The source object for convert's `sources` argument (see `convert`'s docstring);
    `geometric`: the geometric declarations of fields=, by name (read by key= from a
    dict, Hugging Face or TFDS source; by ext= and folder= from TAR shards and folders)."""
    geometric = dict(geometric or {})
    if isinstance(sources, coco.CocoSource):
        given = {
            "labels": labels,
            "label_ext": label_ext,
            "image_column": image_column,
            "label_column": label_column,
            "image_key": image_key,
            "label_key": label_key,
        }
        wrong = [k for k, v in given.items() if v]
        if wrong:
            raise ArgumentError(
                Arg(wrong[0], ...),
                " does not apply to a COCO source: its fields are its "
                "boxes and masks (coco(boxes=, masks=)), and it has no image labels",
            )
        return sources
    # Columns and features read: fields= names, and the geometric fields' keys.
    columns = {
        **{n: n for n in (fields if isinstance(fields, tuple) else ())},
        **{n: g.key or n for n, g in geometric.items()},
    }
    src = huggingface.resolve(sources, classes, image_column, label_column, columns, retry) or tfds.resolve(
        sources, classes, image_key, label_key, columns, retry
    )
    given = {"image_column": image_column, "label_column": label_column, "image_key": image_key, "label_key": label_key}
    is_hf = isinstance(src, (huggingface.ParquetSource, huggingface.HFDatasetSource))
    wrong = [k for k, v in given.items() if v and (src is None or k.endswith("_column") != is_hf)]
    if wrong:
        raise ArgumentError(
            Arg(wrong[0]),
            " names a column of a Hugging Face dataset or Parquet file (",
            Arg("image_column"),
            ", ",
            Arg("label_column"),
            ") or a feature of TFRecord/ArrayRecord tf.train.Examples (",
            Arg("image_key"),
            ", ",
            Arg("label_key"),
            f"); it does not apply to {_describe(sources)}",
        )
    if src is None:
        if isinstance(fields, tuple):
            raise ArgumentError(
                Arg("fields", ...),
                f" as a list of names {list(fields)} is for the columns of "
                "Hugging Face / Parquet sources and the features of TFRecord / "
                f"ArrayRecord files; {_describe(sources)} takes "
                "{name: extension} (the TAR member or sidecar file with it)",
            )
        return files.resolve(sources, labels, classes, label_ext, retry, fields, geometric)
    check_declared(
        geometric,
        "TFRecord / ArrayRecord files"
        if isinstance(src, (tfds.TFRecordSource, tfds.ArrayRecordSource))
        else "a Hugging Face dataset or Parquet file",
    )
    if isinstance(fields, dict) and fields:
        raise ArgumentError(
            Arg("fields", ...),
            f" names columns or features of {_describe(sources)}: give "
            f"a list of their names ({sorted(fields)}), not {{name: extension}}",
        )
    if labels is not None or label_ext is not None:
        raise ArgumentError(
            Arg("labels", ...) if labels is not None else Arg("label_ext"),
            f" does not apply to {_describe(sources)}: its labels come from its own label column or feature",
        )
    return src


def _describe(sources: Any) -> str:
    return f"{type(sources).__name__} {shown(repr(sources), 100)}"
