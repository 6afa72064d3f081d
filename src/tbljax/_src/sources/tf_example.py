"""The `tf.train.Example` message classes without TensorFlow: their descriptor written here
from the public schema (tensorflow/core/example/{example,feature}.proto) and turned into
classes by protobuf's own runtime, in a pool of their own (so they never clash with
TensorFlow's when both are loaded). The wire format is protobuf's: parsing is its job."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["example_class"]


@functools.cache
def example_class() -> Any:
    """The `tensorflow.Example` message class (`protobuf`, the `tfds` extra)."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise ImportError(
            "TFRecord and ArrayRecord sources parse tf.train.Example with protobuf: pip install 'tbljax[tfds]'"
        ) from None
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(
        name="tbljax/tensorflow_example.proto", package="tensorflow", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str], parent: Any = None) -> Any:
        m = (parent.nested_type if parent is not None else f.message_type).add(name=name)
        for field_name, number, kind, label, type_name in fields:
            m.field.add(
                name=field_name,
                number=number,
                type=kind,
                label=label,
                **({"type_name": type_name} if type_name else {}),
            )
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    # feature.proto: the three value lists, Feature (a oneof of them), Features (a map).
    message("BytesList", ("value", 1, F.TYPE_BYTES, rep, ""))
    message("FloatList", ("value", 1, F.TYPE_FLOAT, rep, ""))
    message("Int64List", ("value", 1, F.TYPE_INT64, rep, ""))
    feature = message(
        "Feature",
        ("bytes_list", 1, F.TYPE_MESSAGE, opt, ".tensorflow.BytesList"),
        ("float_list", 2, F.TYPE_MESSAGE, opt, ".tensorflow.FloatList"),
        ("int64_list", 3, F.TYPE_MESSAGE, opt, ".tensorflow.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for fld in feature.field:
        fld.oneof_index = 0
    features = message("Features", ("feature", 1, F.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry"))
    entry = message(
        "FeatureEntry",
        ("key", 1, F.TYPE_STRING, opt, ""),
        ("value", 2, F.TYPE_MESSAGE, opt, ".tensorflow.Feature"),
        parent=features,
    )
    entry.options.map_entry = True
    # example.proto: Example wraps Features.
    message("Example", ("features", 1, F.TYPE_MESSAGE, opt, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))
