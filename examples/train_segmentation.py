"""A small segmentation network trained in JAX through tbljax: each photo's mask (its pixels'
colour clusters, computed once at conversion) stored as a `tbljax.Mask` field and served
through the same random-resized crop and flip as the photo, so the two stay aligned in every
batch. It prints the loss per step, whether it fell, and the pixel accuracy and mean IoU on the
center crops of the training records.

    python examples/train_segmentation.py                     # the kodak photos beside the repo
    python examples/train_segmentation.py --photos DIR --count 64 --steps 300
    python examples/train_segmentation.py --synthetic         # generated images, no photos needed

The photos (`DIR/*.jpg`, as ../shared/data/kodak/images) are converted to full-aspect RAW
records at shorter side 2 x --image-size; their masks are a k-means of the colours of all
photos into --classes clusters (one palette for the dataset, so a class means the same colour
everywhere), each pixel labelled by its nearest centre. Without photos (or with --synthetic)
generated images of coloured discs and bars on a background are used, masked the same way.
The model is plain JAX (a two-level convolutional encoder-decoder with a skip, Adam written
out) so the example needs nothing beyond jax.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "kodak" / "images"
IGNORE = 255


def kmeans_masks(images: list[np.ndarray], k: int, seed: int = 0) -> list[np.ndarray]:
    """Each image's pixels labelled 0..k-1 by the nearest of k colour centres fitted (Lloyd's
    iterations, k-means++ seeding) on a sample of every image's pixels."""
    rng = np.random.default_rng(seed)
    sample = np.concatenate([im.reshape(-1, 3)[rng.integers(0, im.shape[0] * im.shape[1], 2000)] for im in images])
    sample = sample.astype(np.float32)
    centres = sample[rng.integers(len(sample))][None]
    for _ in range(k - 1):  # k-means++: far colours are likelier centres
        d = ((sample[:, None] - centres[None]) ** 2).sum(-1).min(1)
        centres = np.concatenate([centres, sample[rng.choice(len(sample), p=d / d.sum())][None]])
    for _ in range(20):
        near = ((sample[:, None] - centres[None]) ** 2).sum(-1).argmin(1)
        centres = np.stack([sample[near == j].mean(0) if (near == j).any() else centres[j] for j in range(k)])
    # Labels by brightness of their centre, so class 0 is the darkest whatever the seeding.
    centres = centres[np.argsort(centres.sum(1))]
    return [((im.astype(np.float32)[:, :, None] - centres) ** 2).sum(-1).argmin(-1).astype(np.uint8) for im in images]


def photo_images(photos: Path, count: int) -> list[np.ndarray]:
    from PIL import Image

    files = sorted(photos.glob("*.jpg"))[:count]
    return [np.asarray(Image.open(f).convert("RGB")) for f in files]


def synthetic_images(n: int, side: int) -> list[np.ndarray]:
    """Generated images: a noisy background with coloured discs and bars of random sizes."""
    rng = np.random.default_rng(0)
    palette = np.array([(30, 30, 40), (220, 60, 50), (60, 180, 70), (70, 90, 220)], np.float32)
    y, x = np.mgrid[0:side, 0:side]
    out = []
    for _ in range(n):
        im = np.broadcast_to(palette[0], (side, side, 3)).copy()
        for _ in range(rng.integers(2, 6)):
            c = palette[rng.integers(1, len(palette))]
            cy, cx, r = rng.uniform(0, side, 2).tolist() + [rng.uniform(side / 10, side / 3)]
            shape = (y - cy) ** 2 + (x - cx) ** 2 < r * r if rng.random() < 0.5 else abs(y - cy) < r / 3
            im[shape] = c
        out.append(np.clip(im + rng.normal(0, 12, im.shape), 0, 255).astype(np.uint8))
    return out


def conv(x, w, stride=1):
    import jax

    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def init_params(seed: int, classes: int, width: int) -> dict:
    """He-normal convolution weights (HWIO) and zero biases, in NumPy: no compile per shape."""
    rng = np.random.default_rng(seed)
    shapes = {
        "enc1": (3, 3, 3, width),
        "enc2": (3, 3, width, 2 * width),  # stride 2
        "mid": (3, 3, 2 * width, 2 * width),
        "dec": (3, 3, 3 * width, width),  # the upsampled features and the skip
        "head": (1, 1, width, classes),
    }
    return {
        n: ((rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[:3]))).astype(np.float32), np.zeros(s[-1], np.float32))
        for n, s in shapes.items()
    }


def segment(p, x):
    """NHWC images (even sides) → per-pixel logits."""
    import jax
    import jax.numpy as jnp

    relu = jax.nn.relu
    skip = relu(conv(x, p["enc1"][0]) + p["enc1"][1])
    y = relu(conv(skip, p["enc2"][0], 2) + p["enc2"][1])
    y = relu(conv(y, p["mid"][0]) + p["mid"][1])
    y = jnp.repeat(jnp.repeat(y, 2, axis=1), 2, axis=2)  # back to full size
    y = relu(conv(jnp.concatenate([y, skip], -1), p["dec"][0]) + p["dec"][1])
    return conv(y, p["head"][0]) + p["head"][1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=Path, default=PHOTOS, help="a folder of JPEGs")
    ap.add_argument(
        "--synthetic", type=int, nargs="?", const=128, default=0, help="generated images (this many) instead of photos"
    )
    ap.add_argument("--count", type=int, default=96, help="photos used (the first N)")
    ap.add_argument("--classes", type=int, default=4, help="colour clusters, the mask's classes")
    ap.add_argument("--image-size", type=int, default=64, help="the training crops' side (even)")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import tbljax

    size = (a.image_size, a.image_size)
    if a.synthetic or not a.photos.is_dir():
        images = synthetic_images(a.synthetic or 128, 2 * a.image_size)
        print(f"{len(images)} generated images")
    else:
        images = photo_images(a.photos, a.count)
        print(f"{len(images)} photos from {a.photos}")
    masks = kmeans_masks(images, a.classes)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "train.tbl"
        # The mask is resized with its photo by the nearest rule: labels are never blended.
        tbljax.convert(
            {"image": images, "seg": masks},
            path,
            image_size=2 * a.image_size,
            resize="shorter_side",
            fields={"seg": tbljax.Mask(ignore=IGNORE)},
            progress=False,
        )
        ds = tbljax.open(path)
        print(f"{len(ds)} records, {a.classes} classes, fields {list(ds.fields)}")

        # Random-resized crop + flip: the mask takes the image's crop box and flip, every step.
        loader = tbljax.loader(ds, a.batch_size, seed=0, augment=tbljax.Augment(size=size), fields=["seg"])
        # Replicated over the loader's mesh from the start: the step's outputs then have its
        # inputs' sharding, and it compiles once.
        on_mesh = jax.sharding.NamedSharding(loader.sharding.mesh, jax.sharding.PartitionSpec())
        params = jax.device_put(init_params(0, a.classes, a.width), on_mesh)
        zeros = jax.tree.map(lambda w: np.zeros(w.shape, np.float32), params)
        opt = jax.device_put((zeros, zeros), on_mesh)  # Adam's moments

        def loss_fn(params, images, seg):
            logp = jax.nn.log_softmax(segment(params, images))
            keep = seg != IGNORE
            picked = jnp.take_along_axis(logp, jnp.where(keep, seg, 0)[..., None].astype(jnp.int32), -1)[..., 0]
            return -(picked * keep).sum() / jnp.maximum(keep.sum(), 1)

        @jax.jit
        def train_step(params, opt, step, images, seg):
            loss, grads = jax.value_and_grad(loss_fn)(params, images, seg)
            t = step + 1  # Adam, by hand
            m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt[0], grads)
            v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt[1], grads)
            params = jax.tree.map(
                lambda w, m, v: w - a.lr * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8), params, m, v
            )
            return params, (m, v), loss

        losses = []
        for step, batch in zip(range(a.steps), loader):
            params, opt, loss = train_step(params, opt, step, batch["image"], batch["seg"])
            losses.append(float(loss))
            print(f"step {step + 1} loss {losses[-1]:.4f}")
        loader.close()

        # Pixel accuracy and mean IoU on the center crops of the training records (a tiny run
        # has no held-out set).
        predict = jax.jit(lambda p, x: jnp.argmax(segment(p, x), -1))
        evaluate = tbljax.Augment(crop="center", flip=False, size=size)
        inter, union = np.zeros(a.classes), np.zeros(a.classes)
        hits = seen = 0
        for batch in tbljax.loader(
            ds, a.batch_size, shuffle=False, num_epochs=1, augment=evaluate, drop_remainder=False, fields=["seg"]
        ):
            valid = np.asarray(batch["valid"])
            pred, seg = np.asarray(predict(params, batch["image"]))[valid], np.asarray(batch["seg"])[valid]
            hits += int((pred == seg).sum())
            seen += seg.size
            for c in range(a.classes):
                inter[c] += ((pred == c) & (seg == c)).sum()
                union[c] += ((pred == c) | (seg == c)).sum()
    k = max(1, len(losses) // 5)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    print(
        f"loss fell from {first:.4f} to {last:.4f}" if last < first else f"loss did not fall: {first:.4f} -> {last:.4f}"
    )
    iou = inter[union > 0] / union[union > 0]
    print(f"center-crop pixel accuracy {hits / seen:.3f}, mean IoU {iou.mean():.3f} on {seen} pixels")


if __name__ == "__main__":
    main()
