"""`tbljax show`: a PNG grid of a file's samples with their labels, as stored or as the loader
serves them after augmentation, so a user can see what conversion produced and what the
model will get."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tbljax._src.rules import contract
from tbljax._src.rules.contract import Arg, ArgumentError


def sample_grid(
    path: Any,
    *,
    count: int = 16,
    columns: int = 8,
    augment: Any = None,
    seed: int = 0,
    epoch: int = 0,
    start: int = 0,
    shuffle: bool = False,
) -> tuple[np.ndarray, list[str]]:
    """(grid uint8 (rows*H, columns*W, 3), captions) of `count` records from record `start` on
    (file order), or with `shuffle` the first `count` of the loader's shuffled order for `seed`
    and `epoch`; drawn by the loader itself (uint8 out) so that with `augment` the tiles are what
    `tbljax.loader(..., augment=augment, seed=seed)` serves in `epoch` (from `start` 0)."""
    from tbljax._src.datasets import reader
    from tbljax._src.datasets.host_part import PartDataset
    from tbljax._src.datasets.mixture import Mixture
    from tbljax._src.jax import loader as jax_loader

    ds = reader.as_dataset(path)
    for name, v, least in (("count", count, 1), ("columns", columns, 1), ("start", start, 0)):
        if not contract.is_integer(v) or v < least:
            raise ArgumentError(Arg(name), f" must be an int >= {least}, got {v!r}")
    if start and (shuffle or not isinstance(ds, reader.Dataset) or len(ds.paths) != 1):
        raise ArgumentError(
            Arg("start"),
            " picks records of one TBL file in file order: not with ",
            Arg("shuffle", True),
            ", a mixture or several files",
        )
    if len(ds) == 0:
        raise ValueError(f"{ds.paths[0]}: no records to show")
    if start >= len(ds):
        raise ArgumentError(Arg("start"), f" is {start}; {ds.paths[0]} holds {len(ds)} records")
    n = min(count, len(ds) - start)
    served = PartDataset(ds, start, len(ds), ds.fingerprint) if start else ds
    # A mixture has no file order: its first step's rows.
    ld = jax_loader.loader(
        served,
        n,
        shuffle=shuffle or isinstance(ds, Mixture),
        seed=seed,
        dtype="uint8",
        augment=augment,
        sharding=_one_device(),
        fields=None,
    )  # pixels only
    ld.set_epoch(epoch)
    try:
        batch = next(iter(ld))
        tiles, idx = np.asarray(batch["image"]), np.asarray(batch["index"])
    finally:
        ld.close()
    th, tw = tiles.shape[1:3]
    cols = min(columns, n)
    rows = -(-n // cols)
    grid = np.full((rows * (th + 2), cols * (tw + 2), 3), 255, np.uint8)
    for k in range(n):
        r, c = divmod(k, cols)
        grid[r * (th + 2) + 1 : r * (th + 2) + 1 + th, c * (tw + 2) + 1 : c * (tw + 2) + 1 + tw] = tiles[k]
    classes = ds.classes or []
    captions = []
    for i in (idx + start).tolist():
        lab = int(ds.labels[i])
        name = classes[lab] if 0 <= lab < len(classes) else (str(lab) if lab >= 0 else "?")
        captions.append(f"{i}: {name}")
    return grid, captions


def _one_device():
    import jax

    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def save_grid_png(path: Any, out: str, *, scale: int = 0, **kw: Any) -> str:
    """Writes the grid with captions under each tile to `out`, in the format its extension
    names (PNG, JPEG, ...; needs Pillow). The folder must exist."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise ValueError("tbljax show writes images with Pillow: pip install 'tbljax[pil]'") from None
    image_format = Image.registered_extensions().get(os.path.splitext(str(out))[1].lower())
    if image_format is None or image_format not in Image.SAVE:
        raise ArgumentError(Arg("out"), f" {out!r}: name an image file Pillow writes (.png, .jpg, ...)")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"destination directory does not exist: {folder}")
    grid, captions = sample_grid(path, **kw)
    cols = min(kw.get("columns", 8), len(captions))
    rows = -(-len(captions) // cols)
    th, tw = grid.shape[0] // rows - 2, grid.shape[1] // cols - 2
    scale = scale or max(1, 128 // max(th, tw))  # small images are enlarged so they can be seen
    img = Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale), Image.NEAREST)
    cell_h, cell_w, text_h = (th + 2) * scale, (tw + 2) * scale, 14
    canvas = Image.new("RGB", (img.width, img.height + rows * text_h), "white")
    draw = ImageDraw.Draw(canvas)
    for r in range(rows):
        canvas.paste(img.crop((0, r * cell_h, img.width, (r + 1) * cell_h)), (0, r * (cell_h + text_h)))
    for k, cap in enumerate(captions):
        r, c = divmod(k, cols)
        max_chars = max(4, cell_w // 6)
        draw.text((c * cell_w + 2, r * (cell_h + text_h) + cell_h), cap[:max_chars], fill="black")
    canvas.save(out, format=image_format)
    return out
