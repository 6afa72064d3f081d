"""A small ViT trained in JAX with the DeiT recipe through tbljax: RandAugment
`rand-m9-mstd0.5-inc1` and random erasing 0.25 in the loader's fused pass, repeated augmentation
(`repeats=3`), and Mixup 0.8 / CutMix 1.0 with label smoothing 0.1 inside the jitted step
(`tbljax.ops.mixup_cutmix`). It prints the loss per step, whether it fell, and the accuracy on the
center crops of the training records.

    python examples/train_vit.py                         # the caltech101 photos beside the repo
    python examples/train_vit.py --photos DIR --classes cat,dog --per-class 200 --steps 300
    python examples/train_vit.py --synthetic             # generated images, no photos needed

The photos (`DIR/<class>/*.jpg`, as ../shared/data/caltech101/images) are converted to
full-aspect RAW records at shorter side 2 x --image-size (the recipe's random-resized-crop draws
from the whole photo); without photos (or with --synthetic) generated images of the demo's
classes are used. The model is plain JAX (patch embedding, pre-norm transformer blocks, a class
token, AdamW written out) so the example needs nothing beyond jax.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "caltech101" / "images"


def photo_dataset(photos: Path, names: list[str], per_class: int, dst: Path, side: int) -> int:
    """The first `per_class` photos of each named class folder as full-aspect records at shorter
    side `side`, each labelled by its folder's place in `names`; returns the number of classes."""
    import tbljax

    files, labels = [], []
    for k, name in enumerate(names):
        found = sorted((photos / name).glob("*.jpg"))[:per_class]
        files += found
        labels += [k] * len(found)
    tbljax.convert(
        [str(f) for f in files],
        dst,
        labels=labels,
        image_size=side,
        resize="shorter_side",
        overwrite=True,
        progress=False,
    )
    return len(names)


def synthetic_dataset(n: int, dst: Path, side: int) -> int:
    """Generated images of the demo's pattern classes, each class half-tinted with its own colour
    so that a tiny ViT learns them in a few dozen steps; returns the number of classes."""
    import tbljax
    from tbljax import demo

    tints = np.array([(230, 40, 40), (40, 200, 40), (40, 40, 230), (220, 220, 40)], np.float32)
    rng = np.random.default_rng(0)
    labels = rng.integers(len(demo.CLASSES), size=n)
    images = np.stack([(demo.make_image(rng, int(k)) + tints[k % len(tints)]) / 2 for k in labels]).astype(np.uint8)
    tbljax.convert((images, labels), dst, image_size=side, overwrite=True, progress=False)
    return len(demo.CLASSES)


def init_params(key, num_classes: int, image: int, patch: int, dim: int, depth: int):
    import jax

    tokens = (image // patch) ** 2
    keys = iter(jax.random.split(key, 4 + 4 * depth))
    normal = lambda shape, std=0.02: jax.random.normal(next(keys), shape) * std  # noqa: E731
    blocks = [
        {
            "ln1": (np.ones(dim, np.float32), np.zeros(dim, np.float32)),
            "qkv": normal((dim, 3 * dim)),
            "proj": normal((dim, dim)),
            "ln2": (np.ones(dim, np.float32), np.zeros(dim, np.float32)),
            "fc1": normal((dim, 4 * dim)),
            "fc2": normal((4 * dim, dim)),
        }
        for _ in range(depth)
    ]
    return {
        "patch": normal((patch * patch * 3, dim)),
        "cls": normal((1, 1, dim)),
        "pos": normal((1, tokens + 1, dim)),
        "blocks": blocks,
        "ln": (np.ones(dim, np.float32), np.zeros(dim, np.float32)),
        "head": np.zeros((dim, num_classes), np.float32),  # DeiT's zero-initialised head
    }


def layer_norm(x, scale_bias):
    import jax.numpy as jnp

    scale, bias = scale_bias
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * scale + bias


def vit(p, x, patch: int, heads: int):
    """NHWC images → logits: patches, a class token, pre-norm transformer blocks."""
    import jax
    import jax.numpy as jnp

    b, h, w, c = x.shape
    x = x.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    x = x.reshape(b, -1, patch * patch * c) @ p["patch"]
    x = jnp.concatenate([jnp.broadcast_to(p["cls"], (b, 1, x.shape[-1])), x], axis=1) + p["pos"]
    for blk in p["blocks"]:
        y = layer_norm(x, blk["ln1"]) @ blk["qkv"]
        q, k, v = (t.reshape(b, -1, heads, t.shape[-1] // heads) for t in jnp.split(y, 3, axis=-1))
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(x.shape) @ blk["proj"]
        x = x + jax.nn.gelu(layer_norm(x, blk["ln2"]) @ blk["fc1"]) @ blk["fc2"]
    return layer_norm(x[:, 0], p["ln"]) @ p["head"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=Path, default=PHOTOS, help="a folder of class folders of JPEGs")
    ap.add_argument(
        "--synthetic", type=int, nargs="?", const=256, default=0, help="generated images (this many) instead of photos"
    )
    ap.add_argument(
        "--classes",
        default="Faces_easy,Leopards,Motorbikes,airplanes",
        help="class folders, comma-separated (caltech101's first four, less Faces: Faces_easy's near twin)",
    )
    ap.add_argument("--per-class", type=int, default=40)
    ap.add_argument("--image-size", type=int, default=32, help="the training crops' side")
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=48, help="a multiple of --repeats keeps copies in one step")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import tbljax

    size = (a.image_size, a.image_size)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "train.tbl"
        if a.synthetic or not a.photos.is_dir():
            num_classes = synthetic_dataset(a.synthetic or 256, path, 2 * a.image_size)
            print(f"generated images: {path}")
        else:
            num_classes = photo_dataset(a.photos, a.classes.split(","), a.per_class, path, 2 * a.image_size)
            print(f"photos from {a.photos}: {path}")
        ds = tbljax.open(path)
        print(f"{len(ds)} records, {num_classes} classes")

        # DeiT (deit_base_patch16_224 in facebookresearch/deit main.py): the per-image ops in the
        # loader's fused pass, the repeats spread over each step's rows, Mixup/CutMix in the step.
        train_aug = tbljax.Augment(
            size=size,
            ops=[tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")],
            erasing=tbljax.RandomErasing(p=0.25, mode="pixel"),
        )
        loader = tbljax.loader(ds, a.batch_size, seed=0, augment=train_aug, repeats=a.repeats)

        params = jax.tree.map(
            jnp.asarray, init_params(jax.random.PRNGKey(0), num_classes, a.image_size, a.patch, a.dim, a.depth)
        )
        opt = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))  # Adam's moments

        def loss_fn(params, images, targets):
            logp = jax.nn.log_softmax(vit(params, images, a.patch, a.heads))
            return -(targets * logp).sum(-1).mean()  # soft targets: timm's SoftTargetCrossEntropy

        @jax.jit
        def train_step(params, opt, step, images, labels):
            images, targets = tbljax.ops.mixup_cutmix(
                images,
                labels,
                seed=0,
                step=step,
                num_classes=num_classes,
                mixup_alpha=0.8,
                cutmix_alpha=1.0,
                label_smoothing=0.1,
            )
            loss, grads = jax.value_and_grad(loss_fn)(params, images, targets)
            t = step + 1  # AdamW, by hand
            m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt[0], grads)
            v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt[1], grads)
            params = jax.tree.map(
                lambda w, m, v: (
                    w - a.lr * ((m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8) + a.weight_decay * w)
                ),
                params,
                m,
                v,
            )
            return params, (m, v), loss

        losses = []
        for step, batch in zip(range(a.steps), loader):
            params, opt, loss = train_step(params, opt, step, batch["image"], batch["label"])
            losses.append(float(loss))
            print(f"step {step + 1} loss {losses[-1]:.4f}")
        loader.close()

        # Accuracy on the center crops of the training records (a tiny run has no held-out set).
        evaluate = tbljax.Augment(crop="center", flip=False, size=size)
        logits = jax.jit(lambda p, x: vit(p, x, a.patch, a.heads))
        hits = seen = 0
        for batch in tbljax.loader(
            ds, a.batch_size, shuffle=False, num_epochs=1, augment=evaluate, drop_remainder=False
        ):
            pred = np.asarray(jnp.argmax(logits(params, batch["image"]), -1))
            valid = np.asarray(batch["valid"])
            hits += int((pred == np.asarray(batch["label"]))[valid].sum())
            seen += int(valid.sum())
    k = max(1, len(losses) // 5)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    print(
        f"loss fell from {first:.4f} to {last:.4f}" if last < first else f"loss did not fall: {first:.4f} -> {last:.4f}"
    )
    print(f"center-crop accuracy {hits / seen:.3f} on {seen} training records ({1 / num_classes:.3f} by chance)")


if __name__ == "__main__":
    main()
