"""A SigLIP-style image–text step in JAX on record fields: each record holds a photo and its
caption ("a photo of a <class>") as a `str` field; the loader tokenizes the captions in its
producer thread through `field_fn` (a byte-level tokenizer: no download, no vocabulary), and
two small encoders (a CNN for images, a bag of byte embeddings for text) learn with the
pairwise sigmoid loss. It prints the loss per step and whether it fell.

    python examples/train_contrastive.py                       # the caltech101 photos beside the repo
    python examples/train_contrastive.py --photos DIR --classes 10 --per-class 20 --steps 200
    python examples/train_contrastive.py --synthetic           # generated images, no photos needed

The photos (`DIR/<class>/*.jpg`, as ../shared/data/caltech101/images) are written to a
WebDataset shard (key.jpg, key.cls, key.txt) and converted with ``fields={"caption": "txt"}``;
without photos (or with --synthetic) generated images of the demo's classes are converted
from arrays, the captions a list beside them. Captions of one class are the same text, so a
pair whose captions are equal counts as a positive (SigLIP's diagonal, extended to duplicates).
"""

from __future__ import annotations

import argparse
import io
import tarfile
import tempfile
from pathlib import Path

import numpy as np

PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "caltech101" / "images"
TOKENS = 48  # caption bytes kept; "a photo of a <class>" fits


def tokenize(captions: list[str]) -> np.ndarray:
    """A byte-level tokenizer's batch encode: each UTF-8 byte + 1 (0 is padding), cut or padded
    to TOKENS. Runs in the loader's producer thread, ahead of the step."""
    out = np.zeros((len(captions), TOKENS), np.int32)
    for r, c in enumerate(captions):
        b = np.frombuffer(c.encode()[:TOKENS], np.uint8)
        out[r, : len(b)] = b.astype(np.int32) + 1
    return out


def photo_dataset(photos: Path, classes: int, per_class: int, work: Path, size: int) -> Path:
    """The first `per_class` photos of the first `classes` class folders, in a WebDataset shard
    with their captions, converted with the caption as a str field."""
    import tbljax

    names = sorted(p.name for p in photos.iterdir() if p.is_dir())[:classes]
    tar = work / "photos.tar"
    with tarfile.open(tar, "w") as tf:
        for k, name in enumerate(names):
            for j, p in enumerate(sorted((photos / name).glob("*.jpg"))[:per_class]):
                key = f"{name}-{j:04d}"
                for ext, data in (
                    ("jpg", p.read_bytes()),
                    ("cls", str(k).encode()),
                    ("txt", f"a photo of a {name.lower().replace('_', ' ')}".encode()),
                ):
                    ti = tarfile.TarInfo(f"{key}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    dst = work / "pairs.tbl"
    tbljax.convert(tar, dst, image_size=size, fields={"caption": "txt"}, overwrite=True, progress=False)
    return dst


def synthetic_dataset(n: int, work: Path, size: int) -> Path:
    """Generated images of the demo's classes, each with its caption."""
    import tbljax
    from tbljax import demo

    rng = np.random.default_rng(0)
    labels = rng.integers(len(demo.CLASSES), size=n)
    images = np.stack([demo.make_image(rng, int(k)) for k in labels])
    dst = work / "pairs.tbl"
    tbljax.convert(
        {"image": images, "label": labels, "caption": [f"a photo of a {demo.CLASSES[k]}" for k in labels]},
        dst,
        image_size=size,
        overwrite=True,
        progress=False,
    )
    return dst


def init_params(key, dim: int = 32, width: int = 16):
    import jax

    k = jax.random.split(key, 5)
    he = lambda kk, shape, fan: jax.random.normal(kk, shape) * np.sqrt(2.0 / fan)  # noqa: E731
    return {
        "conv1": he(k[0], (3, 3, 3, width), 27),
        "conv2": he(k[1], (3, 3, width, 2 * width), 9 * width),
        "img_out": he(k[2], (2 * width, dim), 2 * width),
        "embed": jax.random.normal(k[3], (257, dim)) * 0.1,
        "txt_out": he(k[4], (dim, dim), dim),
        "log_t": np.log(10.0),
        "b": -10.0,
    }


def encode_images(p, x):
    import jax
    import jax.numpy as jnp

    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["conv1"], (2, 2), "SAME", dimension_numbers=dn))
    h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["conv2"], (2, 2), "SAME", dimension_numbers=dn))
    z = h.mean(axis=(1, 2)) @ p["img_out"]
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def encode_texts(p, tokens):
    import jax.numpy as jnp

    mask = (tokens > 0)[..., None]
    h = (p["embed"][tokens] * mask).sum(1) / jnp.maximum(mask.sum(1), 1)
    z = jnp.tanh(h) @ p["txt_out"]
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def sigmoid_loss(p, images, tokens):
    """SigLIP's loss: every (image, text) pair of the batch is a binary problem, positive where
    the captions are the same text. Also returns how often an image's best-scoring caption is
    its own (image → text retrieval in the batch)."""
    import jax
    import jax.numpy as jnp

    logits = jnp.exp(p["log_t"]) * encode_images(p, images) @ encode_texts(p, tokens).T + p["b"]
    same = (tokens[:, None, :] == tokens[None, :, :]).all(-1)
    loss = -jnp.mean(jax.nn.log_sigmoid(jnp.where(same, 1.0, -1.0) * logits))
    hit = jnp.take_along_axis(same, jnp.argmax(logits, axis=1)[:, None], axis=1).mean()
    return loss, hit


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=Path, default=PHOTOS, help="a folder of class folders of JPEGs")
    ap.add_argument(
        "--synthetic", type=int, nargs="?", const=256, default=0, help="generated images (this many) instead of photos"
    )
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import tbljax

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        if a.synthetic or not a.photos.is_dir():
            path = synthetic_dataset(a.synthetic or 256, work, a.image_size)
            print(f"generated images: {path}")
        else:
            path = photo_dataset(a.photos, a.classes, a.per_class, work, a.image_size)
            print(f"photos from {a.photos}: {path}")
        ds = tbljax.open(path)
        print(
            f"{len(ds)} records, fields {dict((n, f.kind) for n, f in ds.fields.items())}, "
            f"e.g. {ds.read_record(0)['caption']!r}"
        )
        loader = tbljax.loader(
            ds,
            a.batch_size,
            seed=0,
            augment=tbljax.Augment(size=(a.image_size,) * 2),
            fields=["caption"],
            field_fn={"caption": tokenize},
        )

        params = jax.tree.map(jnp.asarray, init_params(jax.random.PRNGKey(0)))
        opt = jax.tree.map(lambda w: (jnp.zeros_like(w), jnp.zeros_like(w)), params)

        @jax.jit
        def train_step(params, opt, step, images, tokens):  # Adam, by hand
            (loss, hit), grads = jax.value_and_grad(sigmoid_loss, has_aux=True)(params, images, tokens)
            t = step + 1
            opt = jax.tree.map(
                lambda o, g: (0.9 * o[0] + 0.1 * g, 0.999 * o[1] + 0.001 * g * g),
                opt,
                grads,
                is_leaf=lambda x: isinstance(x, tuple),
            )
            params = jax.tree.map(
                lambda w, o: w - a.lr * (o[0] / (1 - 0.9**t)) / (jnp.sqrt(o[1] / (1 - 0.999**t)) + 1e-8),
                params,
                opt,
                is_leaf=lambda x: isinstance(x, tuple),
            )
            return params, opt, loss, hit

        losses, hits = [], []
        for step, batch in zip(range(a.steps), loader):
            params, opt, loss, hit = train_step(params, opt, step, batch["image"], batch["caption"])
            losses.append(float(loss))
            hits.append(float(hit))
            print(f"step {step + 1} loss {losses[-1]:.4f} image->text top-1 {hits[-1]:.2f}")
        loader.close()
    k = max(1, len(losses) // 5)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    print(
        f"loss fell from {first:.4f} to {last:.4f}" if last < first else f"loss did not fall: {first:.4f} -> {last:.4f}"
    )
    print(
        f"image->text top-1 in the batch: {np.mean(hits[:k]):.2f} over the first {k} steps, "
        f"{np.mean(hits[-k:]):.2f} over the last {k}"
    )


if __name__ == "__main__":
    main()
