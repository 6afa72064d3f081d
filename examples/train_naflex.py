"""A SigLIP 2-style NaFlex image–text step in JAX: each photo is served at its own aspect ratio
as a sequence of patches (``patches=tbljax.Patches``: resized to the largest size whose patch
grid fits the token budget, patchified in the loader), with its caption as a `str` field; a
small ViT over the valid patches (each patch's (row, column) embedded, attention masked by
``patch_valid``) and a bag of byte embeddings for the text learn with the pairwise sigmoid
loss. It prints the loss per step and whether it fell.

    python examples/train_naflex.py                            # the caltech101 photos beside the repo
    python examples/train_naflex.py --synthetic                # generated images, no photos needed
    python examples/train_naflex.py --lengths 16,36,64         # timm's length schedule (HostLoader)
    python examples/train_naflex.py --pack                     # four images a sequence (NaViT packing)

The photos (or generated images of the demo's classes, each cut to a random aspect ratio) are
written to a WebDataset shard with their captions and converted keeping their aspect
(``resize="max_side"``). With ``--lengths`` each step has one sequence length of the list and
``tokens_per_batch // length`` rows (timm's NaFlex schedule, served by `tbljax.HostLoader`:
the JAX loader's global arrays have one batch size): a program is compiled per length. With
``--pack`` several images share a sequence (``Patches(pack=True)``): attention stays within an
image (``segment_ids``), each image is pooled on its own, and the captions come per segment.
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_contrastive import PHOTOS, encode_texts, tokenize  # noqa: E402  (the same text side)


def shard(pairs, work: Path, size: int) -> Path:
    """(JPEG or PNG bytes, extension, class, caption) pairs in a WebDataset shard, converted
    keeping each image's aspect (longer side `size`), the caption a str field."""
    import tbljax

    tar = work / "pairs.tar"
    with tarfile.open(tar, "w") as tf:
        for j, (data, ext, k, caption) in enumerate(pairs):
            for e, blob in ((ext, data), ("cls", str(k).encode()), ("txt", caption.encode())):
                ti = tarfile.TarInfo(f"{j:05d}.{e}")
                ti.size = len(blob)
                tf.addfile(ti, io.BytesIO(blob))
    dst = work / "pairs.tbl"
    tbljax.convert(
        tar, dst, image_size=size, resize="max_side", fields={"caption": "txt"}, overwrite=True, progress=False
    )
    return dst


def photo_pairs(photos: Path, classes: int, per_class: int):
    names = sorted(p.name for p in photos.iterdir() if p.is_dir())[:classes]
    for k, name in enumerate(names):
        for p in sorted((photos / name).glob("*.jpg"))[:per_class]:
            yield p.read_bytes(), "jpg", k, f"a photo of a {name.lower().replace('_', ' ')}"


def synthetic_pairs(n: int):
    """Generated images of the demo's classes, each cut to a random aspect (1/2 to 2), as PNG."""
    from PIL import Image

    from tbljax import demo

    rng = np.random.default_rng(0)
    for k in rng.integers(len(demo.CLASSES), size=n):
        img = demo.make_image(rng, int(k))
        h, w = img.shape[:2]
        short = int(rng.integers(h // 2, h + 1))
        img = img[:short] if rng.random() < 0.5 else img[:, :short]
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        yield buf.getvalue(), "png", int(k), f"a photo of a {demo.CLASSES[k]}"


def init_params(key, patch: int, max_side: int, width: int = 32, dim: int = 32):
    import jax

    k = jax.random.split(key, 9)
    he = lambda kk, shape, fan: jax.random.normal(kk, shape) * np.sqrt(2.0 / fan)  # noqa: E731
    return {
        "patch": he(k[0], (patch * patch * 3, width), patch * patch * 3),
        "row": jax.random.normal(k[1], (max_side, width)) * 0.02,  # factorized 2-D positions (NaViT)
        "col": jax.random.normal(k[2], (max_side, width)) * 0.02,
        "qkv": he(k[3], (width, 3 * width), width),
        "attn_out": he(k[4], (width, width), width) * 0.5,
        "mlp_in": he(k[5], (width, 2 * width), width),
        "mlp_out": he(k[6], (2 * width, width), 2 * width) * 0.5,
        "img_out": he(k[7], (width, dim), width),
        "embed": jax.random.normal(k[8], (257, dim)) * 0.1,
        "txt_out": he(jax.random.fold_in(k[8], 1), (dim, dim), dim),
        "log_t": np.log(10.0),
        "b": -10.0,
    }


def encode_images(p, x, yx, seg, images: int):
    """One pre-norm transformer block over a (B, T, p·p·3) batch of patch sequences, each
    holding up to `images` images: `seg` (B, T) numbers each token's image 1, 2, … (0:
    padding). A token attends to its own image's tokens only; each image is the mean of its
    tokens. Returns (B·images, dim) unit embeddings (unpacked: seg is patch_valid, images 1)."""
    import jax
    import jax.numpy as jnp

    def norm(h):
        return h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6)

    h = x @ p["patch"] + p["row"][yx[..., 0]] + p["col"][yx[..., 1]]
    q, k, v = jnp.split(norm(h) @ p["qkv"], 3, axis=-1)
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
    h = h + (jax.nn.softmax(jnp.where(same, logits, -1e9), axis=-1) @ v) @ p["attn_out"]
    h = h + jax.nn.gelu(norm(h) @ p["mlp_in"]) @ p["mlp_out"]
    w = (seg[..., None] == jnp.arange(1, images + 1)).astype(h.dtype)  # (B, T, images)
    pooled = jnp.einsum("bti,btd->bid", w, norm(h)) / jnp.maximum(w.sum(1), 1)[..., None]
    z = pooled.reshape(-1, pooled.shape[-1]) @ p["img_out"]
    return z * jax.lax.rsqrt((z * z).sum(-1, keepdims=True) + 1e-12)  # (a padding segment's z is 0)


def sigmoid_loss(p, x, yx, seg, real, tokens):
    """SigLIP's loss over the real images (`real`: (B·images,), False on padding): every
    (image, text) pair a binary problem, positive where the captions are the same text.
    `tokens`: (B, 48) captions, or (B, images, 48) packed."""
    import jax
    import jax.numpy as jnp

    images = 1 if tokens.ndim == 2 else tokens.shape[1]
    # A padding segment's caption is all zeros, which the text encoder cannot normalize: a dummy byte.
    tokens = jnp.where(real[:, None], tokens.reshape(-1, tokens.shape[-1]), 1)
    logits = jnp.exp(p["log_t"]) * encode_images(p, x, yx, seg, images) @ encode_texts(p, tokens).T + p["b"]
    same = (tokens[:, None, :] == tokens[None, :, :]).all(-1)
    pair = real[:, None] & real[None, :]
    loss = -jnp.where(pair, jax.nn.log_sigmoid(jnp.where(same, 1.0, -1.0) * logits), 0).sum() / pair.sum()
    return loss


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=Path, default=PHOTOS, help="a folder of class folders of JPEGs")
    ap.add_argument(
        "--synthetic", type=int, nargs="?", const=256, default=0, help="generated images (this many) instead of photos"
    )
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=64, help="the longer side the records are stored at")
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--lengths", default=None, help="a length schedule, e.g. 16,36,64 (tokens_per_batch: 32×64)")
    ap.add_argument("--pack", action="store_true", help="four images a sequence of 4 × max-tokens (NaViT packing)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import tbljax

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        if a.synthetic or not a.photos.is_dir():
            path = shard(synthetic_pairs(a.synthetic or 256), work, a.image_size)
            print(f"generated images: {path}")
        else:
            path = shard(photo_pairs(a.photos, a.classes, a.per_class), work, a.image_size)
            print(f"photos from {a.photos}: {path}")
        ds = tbljax.open(path)
        sides = {(int(h), int(w)) for h, w in zip(ds.geometry.heights, ds.geometry.widths)}
        print(f"{len(ds)} records of {len(sides)} sizes, e.g. {ds.read_record(0)['caption']!r}")
        kw = dict(seed=0, augment="flip", fields=["caption"], field_fn={"caption": tokenize}, num_epochs=None)
        if a.lengths:
            lengths = [int(t) for t in a.lengths.split(",")]
            patches = tbljax.Patches(
                size=a.patch, max_tokens=lengths, tokens_per_batch=a.batch_size * max(lengths), batch_divisor=1
            )
            rows = a.batch_size * max(lengths) // min(lengths)  # the shortest length's batch
            loader = tbljax.HostLoader(ds, tbljax.LoaderOptions(batch_size=rows, patches=patches, **kw))
            longest = max(lengths)
        elif a.pack:  # each image at most max_tokens, packed into sequences of 4x as many
            patches = tbljax.Patches(size=a.patch, max_tokens=4 * a.max_tokens, pack=True, image_tokens=a.max_tokens)
            loader = tbljax.loader(ds, a.batch_size // 4, patches=patches, **kw)
            longest = 4 * a.max_tokens
        else:
            patches = tbljax.Patches(size=a.patch, max_tokens=a.max_tokens)
            loader = tbljax.loader(ds, a.batch_size, patches=patches, **kw)
            longest = a.max_tokens

        params = jax.tree.map(jnp.asarray, init_params(jax.random.PRNGKey(0), a.patch, longest))
        opt = jax.tree.map(lambda w: (jnp.zeros_like(w), jnp.zeros_like(w)), params)

        @jax.jit
        def train_step(params, opt, step, x, yx, seg, real, tokens):  # Adam, by hand
            loss, grads = jax.value_and_grad(sigmoid_loss)(params, x, yx, seg, real, tokens)
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
            return params, opt, loss

        losses = []
        for step, batch in zip(range(a.steps), loader):
            if a.lengths:  # a HostBatch: NumPy views of the loader's ring, one row range
                f = batch.fields
                x, yx, seg, tokens = batch.image, f["patch_yx"][0], f["patch_valid"][0], f["caption"][0]
                real = np.ones(len(x), bool) if batch.valid is None else batch.valid
            elif a.pack:  # each sequence's images numbered by segment_ids, their captions (B, S, 48)
                x, yx, seg, tokens = (batch[k] for k in ("image", "patch_yx", "segment_ids", "caption"))
                real = batch["segment_index"].reshape(-1) >= 0
            else:
                x, yx, seg, tokens = (batch[k] for k in ("image", "patch_yx", "patch_valid", "caption"))
                real = batch["valid"] if "valid" in batch else jnp.ones(len(x), bool)
            params, opt, loss = train_step(params, opt, step, x, yx, jnp.asarray(seg, jnp.int32), real, tokens)
            losses.append(float(loss))
            print(f"step {step + 1} {tuple(x.shape)} loss {losses[-1]:.4f}")
        loader.close()
    k = max(1, len(losses) // 5)
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    print(
        f"loss fell from {first:.4f} to {last:.4f}" if last < first else f"loss did not fall: {first:.4f} -> {last:.4f}"
    )


if __name__ == "__main__":
    main()
