"""tbljax.augment: random-resized-crop boxes and flips as pure functions of (seed, epoch,
sample index), the same under NumPy and jax.numpy, for records of one size or many; and the
per-image ops' decisions (RandAugment, random erasing), keyed the same way.

>>> boxes, flips = tbljax.augment.sample(tbljax.Augment(size=160), idx, geometry=geometry, seed=0, epoch=0)
"""

from tbljax._src.rules.augment import Augment, center_boxes, crop_boxes, flips, sample
from tbljax._src.rules.erasing import RandomErasing, decide_erasing
from tbljax._src.rules.image_ops import ColorJitter, GaussianBlur, Grayscale, Solarize, ThreeAugment, TrivialAugment
from tbljax._src.rules.randaug import RandAugment, decide, op_arg
from tbljax._src.rules.record_geometry import RecordGeometry
from tbljax._src.rules.scale_jitter import canvas_boxes

__all__ = [
    "Augment",
    "RecordGeometry",
    "sample",
    "crop_boxes",
    "center_boxes",
    "canvas_boxes",
    "flips",
    "RandAugment",
    "RandomErasing",
    "decide",
    "decide_erasing",
    "op_arg",
    "TrivialAugment",
    "ColorJitter",
    "ThreeAugment",
    "Grayscale",
    "Solarize",
    "GaussianBlur",
]
