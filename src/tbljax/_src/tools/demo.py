"""`tbljax demo`: the whole path in about a minute on two cores, with nothing to download.

1. Make a labelled JPEG dataset from code (four patterns that survive a horizontal flip:
   horizontal stripes, vertical stripes, rings, checks; random colours, scale and noise) as
   WebDataset TAR shards.
2. Convert the shards to TBL files (train and eval).
3. Train a small CNN in plain JAX on `tbljax.loader` and evaluate with the padded, masked
   last batch, printing loss, accuracy and images per second.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from tbljax._src.rules import contract

CLASSES = ["horizontal", "vertical", "rings", "checks"]
SRC_SIZE = 72  # side of the generated JPEGs
IMAGE_SIZE = 32  # side after conversion (what the model sees)


def make_image(rng: np.random.Generator, label: int) -> np.ndarray:
    """A pattern whose kind is the label; period, phase, centre, colours and noise vary."""
    y, x = np.mgrid[0:SRC_SIZE, 0:SRC_SIZE].astype(np.float32)
    period = rng.uniform(7, 14)
    phase = rng.uniform(0, 2 * np.pi)
    if label == 2:
        cy, cx = rng.uniform(0.3, 0.7, 2) * SRC_SIZE
        wave = 0.5 + 0.5 * np.sin(2 * np.pi * np.hypot(y - cy, x - cx) / period + phase)
    elif label == 3:
        wave = (np.sin(2 * np.pi * y / period + phase) * np.sin(2 * np.pi * x / period) > 0).astype(np.float32)
    else:
        wave = 0.5 + 0.5 * np.sin(2 * np.pi * (y if label == 0 else x) / period + phase)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    while np.abs(c0 - c1).sum() < 150:  # keep the stripes visible
        c1 = rng.uniform(0, 255, 3)
    img = c0 + wave[..., None] * (c1 - c0) + rng.normal(0, 12, (SRC_SIZE, SRC_SIZE, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_shards(dst: Path, n: int, shards: int, seed: int) -> str:
    """WebDataset shards dst-000.tar ...; returns the brace pattern naming them."""
    from tbljax import _core

    rng = np.random.default_rng(seed)
    per = -(-n // shards)
    for s in range(shards):
        with tarfile.open(f"{dst}-{s:03d}.tar", "w") as tf:
            for j in range(s * per, min(n, (s + 1) * per)):
                label = int(rng.integers(len(CLASSES)))
                jpeg = _core.encode_jpeg(make_image(rng, label), quality=90)
                for name, data in ((f"{j:06d}.jpg", jpeg), (f"{j:06d}.cls", str(label).encode())):
                    ti = tarfile.TarInfo(name)
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    return f"{dst}-{{000..{shards - 1:03d}}}.tar"


def init_params(key, num_classes: int):
    import jax

    def conv(k, cin, cout):
        return jax.random.normal(k, (3, 3, cin, cout)) * np.sqrt(2.0 / (9 * cin))

    ks = jax.random.split(key, 4)
    return {
        "c1": conv(ks[0], 3, 16),
        "b1": np.zeros(16, np.float32),
        "c2": conv(ks[1], 16, 32),
        "b2": np.zeros(32, np.float32),
        "c3": conv(ks[2], 32, 64),
        "b3": np.zeros(64, np.float32),
        "w": jax.random.normal(ks[3], (64, num_classes)) * 0.05,
        "b": np.zeros(num_classes, np.float32),
    }


def forward(params, x):
    import jax
    import jax.numpy as jnp

    for i in (1, 2, 3):
        x = jax.lax.conv_general_dilated(x, params[f"c{i}"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = jax.nn.relu(x + params[f"b{i}"])
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    x = x.mean(axis=(1, 2))
    return x @ params["w"] + params["b"]


def main(steps: int = 300, workdir: str | None = None, batch_size: int = 64) -> int:
    if not contract.is_integer(steps) or steps < 2:  # step 1 compiles; img/s times steps 2..N
        raise contract.ArgumentError(contract.Arg("steps"), f" must be an integer >= 2, got {steps!r}")
    import jax
    import jax.numpy as jnp

    from tbljax._src.conversion.convert import convert
    from tbljax._src.engine.kernels import build_info
    from tbljax._src.jax.loader import loader as make_loader

    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tbljax-demo-")
        workdir = tmp.name
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    where = "a temporary folder, deleted at the end (--workdir DIR keeps the files)" if tmp else "kept"
    print(
        f"tbljax demo in {work} ({where}; {build_info()['simd']} kernels, jax {jax.__version__}, "
        f"{jax.device_count()} device(s))"
    )

    t0 = time.perf_counter()
    train_src = write_shards(work / "train", 2048, 4, seed=1)
    eval_src = write_shards(work / "eval", 500, 1, seed=2)
    print(f"1. made 2548 labelled JPEGs in 5 WebDataset shards ({time.perf_counter() - t0:.1f} s)")

    for name, src in (("train", train_src), ("eval", eval_src)):
        s = convert(src, work / f"{name}.tbl", image_size=IMAGE_SIZE, overwrite=True, progress=False)
        print(f"2. convert {name}: {s}")

    @jax.jit
    def train_step(params, opt, images, labels):
        def loss_fn(p):
            logits = forward(p, images)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)), logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        # Adam, written out: the demo needs no optimizer library.
        b1, b2, lr, eps = 0.9, 0.999, 3e-3, 1e-8
        t = opt["t"] + 1
        m = jax.tree.map(lambda m_, g: b1 * m_ + (1 - b1) * g, opt["m"], grads)
        v = jax.tree.map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, opt["v"], grads)
        params = jax.tree.map(
            lambda p, m_, v_: p - lr * (m_ / (1 - b1**t)) / (jnp.sqrt(v_ / (1 - b2**t)) + eps), params, m, v
        )
        acc = jnp.mean(jnp.argmax(logits, -1) == labels)
        return params, {"m": m, "v": v, "t": t}, loss, acc

    @jax.jit
    def eval_step(params, images, labels, valid):
        correct = (jnp.argmax(forward(params, images), -1) == labels) & valid
        return correct.sum(), valid.sum()

    params = init_params(jax.random.key(0), len(CLASSES))
    opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params), "t": 0}
    loader = make_loader(work / "train.tbl", batch_size, seed=0, augment="flip")
    print(
        f"3. training a small CNN on {IMAGE_SIZE}x{IMAGE_SIZE} px images for {steps} steps of "
        f"{batch_size} ({len(loader)} steps per epoch)"
    )
    t_start = None
    losses, accs = [], []
    for step, batch in enumerate(loader):
        if step == steps:
            break
        params, opt, loss, acc = train_step(params, opt, batch["image"], batch["label"])
        if step == 0:
            jax.block_until_ready(loss)  # compile time is not throughput
            t_start = time.perf_counter()
        losses.append(loss)
        accs.append(acc)
        if (step + 1) % 50 == 0:
            print(
                f"   step {step + 1:4d}  loss {np.mean(jax.device_get(losses[-50:])):.3f}  "
                f"acc {np.mean(jax.device_get(accs[-50:])):.3f}"
            )
    jax.block_until_ready(params)
    elapsed = time.perf_counter() - t_start
    ips = (steps - 1) * batch_size / elapsed
    m = loader.metrics()
    loader.close()

    correct = total = 0
    for batch in make_loader(work / "eval.tbl", 128, shuffle=False, num_epochs=1, drop_remainder=False):
        c, n = eval_step(params, batch["image"], batch["label"], batch["valid"])
        correct, total = correct + int(c), total + int(n)
    print(f"   eval: accuracy {correct / total:.3f} on {total} held-out images (every one exactly once)")
    print(
        f"throughput at {IMAGE_SIZE}x{IMAGE_SIZE} px: {ips:.0f} img/s training (loader + this small "
        f"CNN's step, steps 2-{steps}: compiling excluded); the loader alone produced "
        f"{m['produced_img_per_s']:.0f} img/s and the step waited {m['wait_seconds']:.2f} s for data in all; "
        f"{time.perf_counter() - t0:.1f} s end to end"
    )
    if tmp is not None:
        tmp.cleanup()
        print(f"deleted {work} (pass --workdir DIR to keep the files)")
    return 0 if correct / total > 0.5 else 1
