"""`LoaderOptions`, everything that decides what a loader yields, validated once
when it is made (with the rules of `rules/contract.py`). Every loader (JAX, torch, MLX) and the
resident dataset's `batch` take their arguments through it.

>>> LoaderOptions(batch_size=256, dtype="bfloat16").out_dtype.name
'bfloat16'
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tbljax._src.rules import augment as _augment
from tbljax._src.rules import contract

__all__ = ["LoaderOptions"]


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """Everything that decides what a loader yields, validated once. See `tbljax.loader` for
    what each field means."""

    batch_size: int
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    dtype: str = "float32"
    layout: str = "NHWC"
    mean: tuple[float, float, float] = contract.IMAGENET_MEAN
    std: tuple[float, float, float] = contract.IMAGENET_STD
    augment: _augment.Augment | None = None
    drop_remainder: bool = True
    prefetch: int = 2
    threads: int | None = None
    read_ahead: int = 2
    jpeg_dct_scale: bool = False
    fields: object = "all"    # "all", None, or a list of field names
    field_fn: dict | None = None  # field name -> fn(this process's values) -> (rows, ...) array
    pad: dict | None = None       # ragged field name -> rows served
    verify_records: bool = False  # each served record's CRC-16 checked before its batch goes out

    def __post_init__(self):
        integer = contract.is_integer
        if not integer(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not integer(self.seed) or not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if self.num_epochs is not None and (not integer(self.num_epochs) or self.num_epochs < 1):
            raise ValueError(f"num_epochs must be None (endless) or an integer >= 1, got "
                             f"{self.num_epochs!r}")
        object.__setattr__(self, "dtype", contract.dtype_name(self.dtype))
        contract.check_layout(self.layout)
        mean, std = contract.normalization(self.mean, self.std)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "augment", _augment.Augment.from_spec(self.augment))
        if not integer(self.prefetch) or self.prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {self.prefetch!r}")
        if not integer(self.read_ahead) or self.read_ahead < 0:
            raise ValueError(f"read_ahead must be an integer >= 0 (0: off), got "
                             f"{self.read_ahead!r}")
        contract.check_threads(self.threads)
        if not (self.fields is None or self.fields == "all" or (
                isinstance(self.fields, (list, tuple)) and all(isinstance(n, str) for n in self.fields))):
            raise ValueError(f"fields must be 'all', None or a list of field names, got {self.fields!r}")
        if isinstance(self.fields, list):
            object.__setattr__(self, "fields", tuple(self.fields))
        for what in ("field_fn", "pad"):
            if getattr(self, what) is not None and not isinstance(getattr(self, what), dict):
                raise TypeError(f"{what} must be a dict {{field name: ...}}, got {type(getattr(self, what)).__name__}")
        for flag in ("shuffle", "drop_remainder", "jpeg_dct_scale", "verify_records"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")

    @property
    def out_dtype(self) -> np.dtype:
        return contract.np_dtype(self.dtype)

    @property
    def normalization(self) -> tuple[tuple | None, tuple | None]:
        """(mean, std) for the kernel: None, None for uint8 output (not normalized)."""
        return (None, None) if self.dtype == "uint8" else (self.mean, self.std)

    def output_size(self, image_hw: tuple[int, int] | None, epoch: int | None = None
                    ) -> tuple[int, int]:
        """(OH, OW) of a batch of epoch `epoch` from records of `image_hw` (None: records of
        different sizes): the augmentation's size at that epoch, if any, else the stored size.
        `epoch` may be left out only when the size does not change with it."""
        aug = self.augment
        size = None
        if aug is not None:
            if epoch is None:
                if len(aug.schedule) > 1:
                    raise ValueError(f"the output size changes with the epoch (size="
                                     f"{aug.size!r}): say which epoch")
                epoch = 0
            size = aug.size_at(epoch)
        if image_hw is None:
            if size is None:
                raise ValueError(
                    "records of different sizes need an output size fixed by the augmentation: "
                    "pass augment=tbljax.Augment(size=(224, 224)) for training or "
                    "augment=tbljax.Augment(crop='center', flip=False, size=(224, 224)) for "
                    "evaluation")
            return size
        return contract.output_size(image_hw, size, cropped=aug is not None and bool(aug.crop))

    def row_shape(self, image_hw: tuple[int, int] | None, epoch: int | None = None
                  ) -> tuple[int, int, int]:
        """One row of a batch of epoch `epoch`: (OH, OW, 3) in NHWC, (3, OH, OW) in NCHW."""
        oh, ow = self.output_size(image_hw, epoch)
        return contract.row_shape(self.layout, oh, ow)
