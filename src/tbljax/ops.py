"""tbljax.ops: the gather-normalize kernel inside `jax.jit` — XLA FFI custom calls on CPU (and
CUDA when built with it), partitioned per shard, with a pure-JAX twin of identical semantics
for platforms without a handler. Importing this module registers the handlers once.

>>> pixels = tbljax.ops.gather_normalize(dataset, indices, crop=boxes, flip=flips, out_size=(160, 160))
"""

from tbljax._src.jax.mixup import mixup_cutmix
from tbljax._src.jax.ops import BACKENDS, gather_normalize
from tbljax._src.jax.packed import PAGE_BYTES, PackedRecords, pack_layout
from tbljax._src.jax.program import pixel_program
from tbljax._src.jax.registration import PACKED_TARGET, TARGET, registered_platforms
from tbljax._src.jax.twin import normalize, twin_gather
from tbljax._src.rules.mixup import Mixup, mixup_cutmix_host

__all__ = [
    "TARGET",
    "PACKED_TARGET",
    "BACKENDS",
    "PAGE_BYTES",
    "PackedRecords",
    "gather_normalize",
    "normalize",
    "pack_layout",
    "pixel_program",
    "registered_platforms",
    "twin_gather",
    "Mixup",
    "mixup_cutmix",
    "mixup_cutmix_host",
]
