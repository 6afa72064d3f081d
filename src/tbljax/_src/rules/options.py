"""`LoaderOptions`, everything that decides what a loader yields, validated once
when it is made (with the rules of `rules/contract.py`). Every loader (JAX, torch, MLX) and the
resident dataset's `batch` take their arguments through it, and `front_end` writes each
loader function's signature from its fields: a new option is a field here (and its check in
`__post_init__`), nothing in the front ends.

>>> LoaderOptions(batch_size=256, dtype="bfloat16").out_dtype.name
'bfloat16'
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import numpy as np

from tbljax._src.rules import contract, scale_jitter
from tbljax._src.rules.augment import MAX_REPEATS, MAX_VIEWS, Augment
from tbljax._src.rules.buckets import Buckets
from tbljax._src.rules.naflex import Patches

__all__ = ["VIEW_RESERVED", "LoaderOptions", "front_end"]

# The batch keys a view's name may not take (`LoaderOptions.views`).
VIEW_RESERVED = ("image", "label", "index", "valid", "repeat", "source")


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """Everything that decides what a loader yields, validated once. The loader options: every
    field is a keyword of `tbljax.loader`, `tbljax.torch.loader` and `tbljax.mlx.loader` (each
    documents only its own arguments and what it reads differently).

    Args:
      batch_size: the global batch G over all processes (the torch and MLX loaders take it per
        rank). Step s of an epoch holds shuffled positions [s*G, (s+1)*G).
      seed, shuffle: the order of epoch e is a fixed bijection of (seed, e); shuffle=False
        serves samples in file order. seed in [0, 2**64).
      num_epochs: None to iterate forever, or the number of epochs a pass serves.
      dtype: "float32", "bfloat16" (normalized with mean/std) or "uint8" (raw pixels).
      layout: "NHWC" or "NCHW".
      mean, std: per-channel, on the 0..1 scale: value = (x/255 - mean) / std.
      augment: None, "flip", "rrc_flip" or an `Augment`; a sample's crop and flip depend only
        on (seed, epoch, sample index).
      drop_remainder: True drops the last partial batch; False pads it (index and label -1,
        zero image) and adds a bool `valid` mask, so every sample is served exactly once.
      prefetch: batches prepared ahead of the consumer.
      threads: threads for decoding non-RAW records (None: the pool's default).
      read_ahead: RAW and compact files: steps whose records are requested from the disk
        before the kernel reads them (posix_fadvise WILLNEED into the page cache), so an epoch
        larger than the page cache runs at the disk's random-read speed; a cold file that fits
        in half the available memory is also requested whole, front to back, in the
        background (when this process reads all of it); 0 turns both off.
      jpeg_dct_scale: compact JPEG files: decode a box at 1/2, 1/4 or 1/8 (libjpeg's scaled
        IDCT) when at that scale it still covers the output twice over on both axes, then
        resize from there: faster for small outputs of large records, not bit-identical to
        the default exact path (benchmarks/README.md measures both).
      fields: the record fields served beside the image: "all" (default), None, or a list of
        names. A fixed ndarray field is ``batch[name]``, (B, *shape) placed like label (zeros
        on padding rows); a ragged one is cut or zero-padded to ``pad[name]`` rows, with
        ``batch[name + "_length"]`` (the true length; 0 on padding rows); a str/json field is
        a Python list of this process's rows, in the order of its image rows ("" / None on
        padding rows).
      field_fn: {name: fn}: fn gets this process's values of the field for the batch (the
        list, or the array) in the producer thread and returns an array (rows, ...), served
        like a fixed field: a tokenizer's batch encode, a multi-hot of tags. An exception in
        it reaches the consumer naming the field and the step.
      pad: {name: length} for ragged fields (required for each ragged field served without a
        field_fn).
      verify_records: check each record's CRC-16 (the check `tbljax verify` makes) as it is
        served, and raise `tbljax.CorruptFileError` naming the file and record before a batch
        holding a damaged one is handed out. Opening a file checks its header and index, not
        every payload; RAW and compact records are otherwise served unchecked (LZ4 and
        original-bytes JPEG records are always checked). Its cost is measured in
        benchmarks/README.md ("Checking records as they are served").
      repeats: repeated augmentation (DeiT's `RASampler`): an epoch serves every record
        `repeats` times, k·N positions, each (record, repeat) once (with drop_remainder=False);
        a record's repeats sit in the same step, spread over its rows (`tbljax.order.repeated`),
        each with its own crop and flip (repeat 0: those of the loader without repeats).
        An integer in [1, 1024]; 1 (default): off.
      buckets: a `tbljax.Buckets`: native resolution by aspect-ratio buckets (issue 49). Each
        record goes to the bucket nearest its aspect ratio, is resized to cover it and cropped
        to it (the bucket decides the crop: ``augment`` may only flip); every global step is
        one bucket (the same on every host), its size the batch's; an epoch serves every
        record once (each bucket's last batch padded, ``valid``, or dropped by
        drop_remainder). Adds ``orig_hw`` (B, 2), ``crop_yx`` (B, 2) and ``bucket`` (B,)
        int32 (the step's bucket on every row). A state's position is the steps handed out
        times the global batch.
      patches: a `tbljax.Patches`: NaFlex patch sequences (issue 49). Each sample (the
        augmentation's random crop and flip, or the whole record) resized keeping its aspect to
        big_vision's ``resize_to_sequence`` size and served as ``image`` (B, max_tokens,
        size·size·3) in `naflex.patchify`'s layout, with ``patch_yx`` (B, max_tokens, 2) int32
        and ``patch_valid`` (B, max_tokens) bool. A list of max_tokens: a length schedule, each
        step one length and ``tokens_per_batch // length`` rows (timm's rule); ``pack=True``:
        several images a sequence with ``segment_ids`` (docs/reference.md).
      max_boxes, min_size, min_area, min_visibility: a boxes field (`tbljax.Boxes`) served
        through the crop, resize and flip (docs/reference.md, "Geometric fields"): padded or cut
        to `max_boxes` per row; a box whose clipped side is under `min_size` pixels, clipped
        area under `min_area`, or under `min_visibility` of its area before clipping is dropped
        (torchvision v2's SanitizeBoundingBoxes).
      views: multi-crop (DINO): ``{name: (count, Augment(size=...)), ...}`` serves each record
        as ``count`` views per name, ``batch[name]`` (B, count, H, W, 3) (NCHW: (B, count, 3,
        H, W)) at that Augment's size, instead of ``image``. Views are numbered in the dict's
        order across names; view v's crop and flip are keyed by (seed, epoch, index, v), so
        view 0 is what ``augment=`` that Augment serves. Not with ``augment=`` (each view has
        its own), buckets/patches, a mixture or geometric fields.
    """

    batch_size: int
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    dtype: str = "float32"
    layout: str = "NHWC"
    mean: tuple[float, float, float] = contract.IMAGENET_MEAN
    std: tuple[float, float, float] = contract.IMAGENET_STD
    augment: Augment | str | None = None  # str: 'flip' or 'rrc_flip'
    drop_remainder: bool = True
    prefetch: int = 2
    threads: int | None = None
    read_ahead: int = 2
    jpeg_dct_scale: bool = False
    fields: object = "all"  # "all", None, or a list of field names
    field_fn: dict | None = None  # field name -> fn(this process's values) -> (rows, ...) array
    pad: dict | None = None  # ragged field name -> rows served
    verify_records: bool = False  # each served record's CRC-16 checked before its batch goes out
    repeats: int = 1  # each record served this many times an epoch, each repeat its own augmentation
    # Native resolution (issue 49): one of these, or neither.
    buckets: Buckets | None = None  # aspect-ratio buckets: each step one bucket's size
    patches: Patches | None = None  # NaFlex: each sample its own patch grid, as a sequence
    # Geometric fields (issue 48): how a boxes field is cut and padded.
    max_boxes: int = 100
    min_size: float = 1.0
    min_area: float = 1.0
    min_visibility: float = 0.0
    # Multi-view (issue 47, DINO multi-crop): {name: (count, Augment)}, kept as ((name, count, Augment), ...).
    views: dict | None = None

    def __post_init__(self):
        integer, Arg, ArgumentError = contract.is_integer, contract.Arg, contract.ArgumentError
        # ArgumentErrors: the command line (bench, show) names its flags for these.
        if not integer(self.batch_size) or self.batch_size < 1:
            raise ArgumentError(Arg("batch_size"), f" must be an integer >= 1, got {self.batch_size!r}")
        if not integer(self.seed) or not 0 <= self.seed < 1 << 64:
            raise ArgumentError(Arg("seed"), f" must be an integer in [0, 2**64), got {self.seed!r}")
        if self.num_epochs is not None and (not integer(self.num_epochs) or self.num_epochs < 1):
            raise ArgumentError(
                Arg("num_epochs"), f" must be None (endless) or an integer >= 1, got {self.num_epochs!r}"
            )
        object.__setattr__(self, "dtype", contract.dtype_name(self.dtype))
        contract.check_layout(self.layout)
        mean, std = contract.normalization(self.mean, self.std)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "augment", Augment.from_spec(self.augment))
        if not integer(self.prefetch) or self.prefetch < 1:
            raise ArgumentError(Arg("prefetch"), f" must be an integer >= 1, got {self.prefetch!r}")
        if not integer(self.read_ahead) or self.read_ahead < 0:
            raise ArgumentError(Arg("read_ahead"), f" must be an integer >= 0 (0: off), got {self.read_ahead!r}")
        contract.check_threads(self.threads)
        if not integer(self.repeats) or not 1 <= self.repeats <= MAX_REPEATS:
            raise ArgumentError(
                Arg("repeats"), f" must be an integer in [1, {MAX_REPEATS}] (1: off), got {self.repeats!r}"
            )
        object.__setattr__(self, "repeats", int(self.repeats))
        if not (
            self.fields is None
            or self.fields == "all"
            or (isinstance(self.fields, (list, tuple)) and all(isinstance(n, str) for n in self.fields))
        ):
            raise ValueError(f"fields must be 'all', None or a list of field names, got {self.fields!r}")
        if isinstance(self.fields, list):
            object.__setattr__(self, "fields", tuple(self.fields))
        for what in ("field_fn", "pad"):
            if getattr(self, what) is not None and not isinstance(getattr(self, what), dict):
                raise TypeError(f"{what} must be a dict {{field name: ...}}, got {type(getattr(self, what)).__name__}")
        self._check_boxes()
        for flag in ("shuffle", "drop_remainder", "jpeg_dct_scale", "verify_records"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        self._check_native_resolution()
        self._check_views()

    def _check_views(self) -> None:
        """``views``: a non-empty {name: (count >= 1, Augment with a fixed size)}, kept as a tuple
        of (name, count, Augment); refuses by name what views are not served with."""
        if self.views is None:
            return
        views = self.views
        if isinstance(views, tuple) and all(isinstance(v, tuple) and len(v) == 3 for v in views):
            views = {n: (c, a) for n, c, a in views}  # already kept (dataclasses.replace runs this again)
        if not isinstance(views, dict) or not views:
            raise ValueError(f"views must be a non-empty dict {{name: (count, tbljax.Augment)}}, got {self.views!r}")
        kept = []
        for name, value in views.items():
            where = f"views[{name!r}]"
            if not isinstance(name, str) or not name.isidentifier() or name in VIEW_RESERVED:
                raise ValueError(
                    f"views: {name!r} is not a view name: use an identifier other than the batch's keys {VIEW_RESERVED}"
                )
            if not (isinstance(value, (tuple, list)) and len(value) == 2):
                raise ValueError(f"{where} must be (count, tbljax.Augment(size=...)), got {value!r}")
            count, aug = value
            if not contract.is_integer(count) or count < 1:
                raise ValueError(f"{where}: count must be an integer >= 1, got {count!r}")
            if not isinstance(aug, Augment):
                raise ValueError(f"{where}: the augmentation must be a tbljax.Augment, got {aug!r}")
            if aug.size is None or isinstance(aug.size[0], tuple):
                raise ValueError(
                    f"{where}: the Augment needs a fixed size=(height, width) (each view's output), "
                    f"got size={aug.size!r}"
                )
            if scale_jitter.on_canvas(aug):
                raise ValueError(f"{where}: Augment(scale_jitter=/crop='longer_pad') per view: not served yet")
            kept.append((name, int(count), aug))
        total = sum(c for _, c, _ in kept)
        refused = [
            (total > MAX_VIEWS, f"views of {total} crops in all (at most {MAX_VIEWS})"),
            (self.augment is not None, "augment= with views= (each view has its own Augment): pass one of them"),
            (self.buckets is not None, "views with buckets: not served yet"),
            (self.patches is not None, "views with patches: not served yet"),
        ]
        for bad, words in refused:
            if bad:
                raise ValueError(words)
        object.__setattr__(self, "views", tuple(kept))

    def _check_native_resolution(self) -> None:
        """Refuses by name what buckets and patches are not served with."""
        for name, kind in (("buckets", Buckets), ("patches", Patches)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"{name} must be None or a tbljax.{kind.__name__}, got {type(value).__name__}")
        what = "buckets" if self.buckets is not None else "patches" if self.patches is not None else None
        if what is None:
            return
        aug = self.augment
        refused = [
            (self.buckets is not None and self.patches is not None, "buckets and patches together"),
            (self.repeats > 1, f"{what} with repeats={self.repeats}"),
            (
                self.buckets is not None and aug is not None and bool(aug.crop),
                "buckets with an Augment crop (the bucket decides the crop: augment='flip' or None)",
            ),
            (
                self.patches is not None and aug is not None and (aug.crop == "center" or aug.size is not None),
                "patches with an Augment size or center crop (the patch grid decides the size: "
                "Augment(size=None) for a random crop, 'flip' or None)",
            ),
            (
                self.patches is not None and self.layout != "NHWC",
                "patches with layout='NCHW' (rows are patch sequences: pass layout='NHWC', "
                "which tbljax.torch.loader does not default to)",
            ),
            (
                self.patches is not None and self.patches.pack and aug is not None and bool(aug.crop),
                "patches with pack=True and an Augment crop (a record's tokens come from its stored size: "
                "augment='flip' or None)",
            ),
        ]
        for bad, words in refused:
            if bad:
                raise ValueError(f"{words}: not served yet")

    def _check_boxes(self) -> None:
        """The boxes options: max_boxes an integer >= 1, the rest finite numbers >= 0
        (min_visibility at most 1)."""
        if not contract.is_integer(self.max_boxes) or self.max_boxes < 1:
            raise ValueError(f"max_boxes must be an integer >= 1, got {self.max_boxes!r}")
        for name, top in (("min_size", math.inf), ("min_area", math.inf), ("min_visibility", 1.0)):
            v = getattr(self, name)
            if not contract.is_real(v) or not 0 <= v <= top or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number in [0, {top}], got {v!r}")
            object.__setattr__(self, name, float(v))
        object.__setattr__(self, "max_boxes", int(self.max_boxes))

    @property
    def out_dtype(self) -> np.dtype:
        return contract.np_dtype(self.dtype)

    @property
    def normalization(self) -> tuple[tuple | None, tuple | None]:
        """(mean, std) for the kernel: None, None for uint8 output (not normalized)."""
        return (None, None) if self.dtype == "uint8" else (self.mean, self.std)

    def output_size(self, image_hw: tuple[int, int] | None, epoch: int | None = None) -> tuple[int, int]:
        """(OH, OW) of a batch of epoch `epoch` from records of `image_hw` (None: records of
        different sizes): the augmentation's size at that epoch, if any, else the stored size.
        `epoch` may be left out only when the size does not change with it."""
        aug = self.augment
        size = None
        if aug is not None:
            if epoch is None:
                if len(aug.schedule) > 1:
                    raise ValueError(f"the output size changes with the epoch (size={aug.size!r}): say which epoch")
                epoch = 0
            size = aug.size_at(epoch)
        if image_hw is None:
            if size is None:
                raise ValueError(
                    "records of different sizes need an output size fixed by the augmentation: "
                    "pass augment=tbljax.Augment(size=(224, 224)) for training or "
                    "augment=tbljax.Augment(crop='center', flip=False, size=(224, 224)) for "
                    "evaluation"
                )
            return size
        return contract.output_size(image_hw, size, cropped=aug is not None and bool(aug.crop))

    def row_shape(self, image_hw: tuple[int, int] | None, epoch: int | None = None) -> tuple[int, int, int]:
        """One row of a batch of epoch `epoch`: (OH, OW, 3) in NHWC, (3, OH, OW) in NCHW."""
        oh, ow = self.output_size(image_hw, epoch)
        return contract.row_shape(self.layout, oh, ow)


def front_end(name: str, *, without: tuple[str, ...] = (), **defaults):
    """Decorates a loader function written ``def loader(path_or_paths, *, <its own keywords>,
    **options)``: its signature (``__signature__``, what `inspect.signature` and the docs test
    read) becomes its own parameters plus every `LoaderOptions` field (those without a default,
    ``batch_size``, positional after its own), and a call receives the options, defaults
    filled, in ``options``. `defaults` overrides a field's default for this front end (torch's
    layout); `without` leaves out fields it does not take. `name` is the public name an
    unknown keyword's TypeError names."""
    fields = [f for f in dataclasses.fields(LoaderOptions) if f.name not in without]
    unknown = (set(defaults) | set(without)) - {f.name for f in dataclasses.fields(LoaderOptions)}
    if unknown:  # a typo here would silently drop the override
        raise TypeError(f"{name}: {sorted(unknown)} are not LoaderOptions fields")
    P = inspect.Parameter

    def wrap(fn):
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not P.VAR_KEYWORD]
        shared = [
            P(f.name, P.POSITIONAL_OR_KEYWORD, annotation=f.type) for f in fields if f.default is dataclasses.MISSING
        ]
        shared += [
            P(f.name, P.KEYWORD_ONLY, default=defaults.get(f.name, f.default), annotation=f.type)
            for f in fields
            if f.default is not dataclasses.MISSING
        ]
        positional = [p for p in own if p.kind is P.POSITIONAL_OR_KEYWORD]
        signature = inspect.signature(fn).replace(
            parameters=positional + shared + [p for p in own if p.kind is P.KEYWORD_ONLY]
        )

        @functools.wraps(fn)
        def front(*args, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as e:  # bind's words name no function
                raise TypeError(f"{name}(): {e}") from None
            bound.apply_defaults()
            return fn(**bound.arguments)

        front.__signature__ = signature
        return front

    return wrap
