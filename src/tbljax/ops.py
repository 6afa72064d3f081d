"""tbljax.ops: the gather-normalize kernel inside `jax.jit` — XLA FFI custom calls on CPU (and
CUDA when built with it), partitioned per shard, with a pure-JAX twin of identical semantics
for platforms without a handler. Importing this module registers the handlers once.

>>> pixels = tbljax.ops.gather_normalize(dataset, indices, crop=boxes, flip=flips, out_size=(160, 160))
"""
from tbljax._src.jax.ops import (BACKENDS, PACKED_TARGET, PAGE_BYTES, TARGET, PackedRecords,
                                 gather_normalize, normalize, pack_layout, registered_platforms,
                                 twin_gather)

__all__ = ["TARGET", "PACKED_TARGET", "BACKENDS", "PAGE_BYTES", "PackedRecords", "gather_normalize",
           "normalize", "pack_layout", "registered_platforms", "twin_gather"]
