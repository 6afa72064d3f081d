"""Which features of a `tf.train.Example` are the image, the label and the fields, and what a
TFDS data folder says of them (`features.json` or `dataset_info.json`, `<label>.labels.txt`);
an Example's bytes → an `Item`. The TFDS sources (`tfds.py`) read the files.

The image is the bytes feature `image_key` (default: TFDS's `image`, else the classic
`image/encoded`), the label the int64 or bytes feature `label_key` (default: `label`, else
`image/class/label`). A TFDS data folder describes the features beside the files:
`features.json` (or `dataset_info.json`) names the Image and ClassLabel features, and
`<label>.labels.txt` holds the ClassLabel's names, which become the classes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tbljax._src.remote import remote
from tbljax._src.sources.items import Item, Label
from tbljax._src.sources.tf_example import example_class

__all__ = ["IMAGE_KEYS", "LABEL_KEYS", "Features", "field_kinds"]

IMAGE_KEYS = ("image", "image/encoded")  # TFDS's, then the classic (TF-slim) one
LABEL_KEYS = ("label", "image/class/label")


class Features:
    """Which features of an Example are the image, the label and the fields; the classes."""

    def __init__(
        self,
        first: str,
        image_key: str | None,
        label_key: str | None,
        fields: Sequence[str] | Mapping[str, str],
        classes: list[str] | None,
    ):
        info = {} if remote.is_url(first) else _tfds_folder(os.path.dirname(first))
        self.image_keys = (image_key,) if image_key else tuple(info.get("image", ())) or IMAGE_KEYS
        self.label_keys = (label_key,) if label_key else tuple(info.get("label", ())) or LABEL_KEYS
        self.label_required = label_key is not None
        # Field name -> the feature holding it (a geometric field's key=, e.g. 'objects/bbox').
        self.feature = dict(fields) if isinstance(fields, Mapping) else {f: f for f in fields}
        self.fields = list(self.feature)
        self.kinds: dict[str, str] | None = None if self.fields else {}  # see `field_kinds`
        names = info.get("names")
        if classes is not None and names is not None and list(classes) != names:
            raise ValueError(
                f"classes= differs from the ClassLabel names in {os.path.dirname(first)} "
                "(the records' ids are kept as they are, so the names must match)"
            )
        self.classes = classes if classes is not None else names

    def item(self, data: bytes, key: str, source: str, where: str) -> Item:
        try:
            feats = example_class().FromString(data).features.feature
        except Exception as e:  # protobuf's DecodeError, whichever runtime is loaded
            return Item(key, source, None, error=f"{where} is not a tf.train.Example ({e})")
        image = next((k for k in self.image_keys if k in feats), None)
        if image is None:
            return Item(
                key,
                source,
                None,
                error=f"{where} has no image feature (looked for "
                f"{list(self.image_keys)}; it has {sorted(feats)[:12]}): name it with image_key=",
            )
        values = _values(feats[image])
        if len(values) != 1 or not isinstance(values[0], bytes):
            return Item(key, source, None, error=f"{where}: feature {image!r} is not one bytes value")
        label, problem = self._label(feats, where)
        fields = {f: _field_value(feats[k]) for f, k in self.feature.items() if k in feats}
        return Item(
            key,
            source,
            values[0] or None,
            label,
            label_error=problem,
            fields=fields,
            error=None if values[0] else f"{where}: feature {image!r} is empty",
        )

    def _label(self, feats: Any, where: str) -> tuple[Label, str | None]:
        k = next((k for k in self.label_keys if k in feats), None)
        if k is None:
            return -1, f"{where} has no feature {self.label_keys[0]!r}" if self.label_required else None
        values = _values(feats[k])
        if len(values) != 1:
            return -1, f"{where}: label feature {k!r} holds {len(values)} values, not one"
        v = values[0]
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8").strip()
            except UnicodeDecodeError:
                return -1, f"{where}: label feature {k!r} is not UTF-8 text"
            return (v, None) if v and "\n" not in v else (-1, f"{where}: label {v!r:.60} is not a class name")
        if isinstance(v, float):
            return -1, f"{where}: label feature {k!r} is a float ({v}), not an id or a name"
        return v, None


def _field_value(feature: Any) -> Any:
    """A feature as a field value: a bytes_list of one value as its bytes (a str field reads
    it as UTF-8), int64_list / float_list as a 1-D int64 / float32 array."""
    kind = feature.WhichOneof("kind")
    if kind in _ARRAY_DTYPES:
        return np.asarray(getattr(feature, kind).value, _ARRAY_DTYPES[kind])
    v = _values(feature)
    return v[0] if len(v) == 1 else v


_ARRAY_DTYPES = {"int64_list": np.int64, "float_list": np.float32}


def field_kinds(source: Any) -> dict[str, str]:
    """The kinds of `source`'s fields (fields=), from its first readable record: bytes → str,
    int64_list / float_list → ndarray. Cached on the source's `Features`, which its shares
    keep."""
    features = source.features
    if features.kinds is None:
        first = next((item for item in source if item.error is None), None)
        if first is None and features.fields:
            raise ValueError(
                f"fields= {features.fields}: {source.describe()[0]} has no readable "
                "record to take the fields' kinds from"
            )
        kinds = {}
        for f in features.fields:
            if f not in first.fields:
                raise ValueError(
                    f"fields= names {features.feature[f]!r}, which the first record ({first.key}) does not have"
                )
            kinds[f] = "ndarray" if isinstance(first.fields[f], np.ndarray) else "str"
        features.kinds = kinds
    return features.kinds


def _values(feature: Any) -> list[Any]:
    kind = feature.WhichOneof("kind")
    return list(getattr(feature, kind).value) if kind else []


def _tfds_folder(folder: str) -> dict[str, Any]:
    """What a TFDS data folder says: the Image and ClassLabel feature names and the label's
    class names ({"image": [...], "label": [...], "names": [...]}), or {} when it is not one."""
    spec = None
    for name in ("features.json", "dataset_info.json"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                doc = json.load(f)
            spec = doc.get("features", doc) if name == "dataset_info.json" else doc
            if spec:
                break
    if not spec:
        return {}
    kinds = dict(_feature_kinds(spec))
    out: dict[str, Any] = {
        k: [n for n, c in kinds.items() if c.endswith(cls)]
        for k, cls in (("image", ".Image"), ("label", ".ClassLabel"))
    }
    if len(out["label"]) == 1:
        p = os.path.join(folder, f"{out['label'][0].replace('/', '-')}.labels.txt")
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                out["names"] = [line.strip() for line in f if line.strip()]
    return out


def _feature_kinds(node: Any, name: str = "") -> Iterator[tuple[str, str]]:
    """(feature name, its class name) of a TFDS feature spec, in both of TFDS's JSON forms:
    {"pythonClassName", "featuresDict": {"features": {...}}} and {"type", "content": {...}}."""
    if not isinstance(node, dict):
        return
    cls = node.get("pythonClassName") or node.get("type")
    if isinstance(cls, str) and not cls.endswith("FeaturesDict"):
        yield name, cls
        return
    children = (node.get("featuresDict") or {}).get("features") or node.get("content") or (node if cls is None else {})
    for k, v in children.items() if isinstance(children, dict) else ():
        yield from _feature_kinds(v, f"{name}/{k}" if name else k)
