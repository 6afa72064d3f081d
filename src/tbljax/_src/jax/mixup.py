"""`mixup_cutmix`: the batch-level Mixup/CutMix of `rules/mixup.py` inside `jax.jit`, each
device mixing its own rows (partners within the device, as big_vision does under `shard_map`):
no cross-device traffic. The arithmetic is the rule's, so the host path (`rules.mixup.mix`, the
torch and MLX loaders) gives the same bits."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tbljax._src.jax.partitioning import batch_spec
from tbljax._src.rules import mixup as rule

__all__ = ["mixup_cutmix"]


def mixup_cutmix(
    images,
    labels,
    *,
    seed: int,
    step,
    num_classes: int,
    mixup_alpha: float = 0.8,
    cutmix_alpha: float = 1.0,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    label_smoothing: float = 0.1,
    mode: str = "batch",
    layout: str = "NHWC",
    sharding=None,
):
    """(images mixed, soft labels float32 (B, num_classes)): timm's ``Mixup`` on a batch, inside
    or outside `jax.jit`, keyed by (seed, step) so a resumed run mixes the same pairs.

    Row i of each device's block of b rows mixes with row b-1-i of the same block. The draws
    (whether to mix, Mixup or CutMix, λ, the box) depend on (seed, step) in ``"batch"`` mode and
    on (seed, step, row in the block) in ``"pair"`` / ``"elem"`` modes; the exact rule is in
    the module docstring of ``tbljax._src.rules.mixup`` and docs/reference.md.

    Args:
      images: (B, H, W, C) (``layout="NHWC"``) or (B, C, H, W) uint8, float32 or bfloat16; the
        result has the same dtype (uint8 Mixup rounds half to even).
      labels: (B,) integer class ids; -1 marks a padding row (its soft label is all zeros).
      seed: a Python int in [0, 2**64). step: an integer in [0, 2**32), traced or not.
      num_classes, mixup_alpha, cutmix_alpha, prob, switch_prob, label_smoothing, mode: timm's
        ``Mixup`` arguments (``correct_lam=True``).
      sharding: None, or the `Mesh` / `NamedSharding` the batch is split over: each device then
        mixes its own rows under `jax.shard_map`. With None, a concrete batch split over
        devices is mixed per device too, and so is one typed with explicit mesh axes inside
        jit; inside your own `shard_map` the block is what the device holds. Otherwise the
        whole batch is one block.

    Example::

        @jax.jit
        def step_fn(params, images, labels, step):
            images, targets = ops.mixup_cutmix(images, labels, seed=0, step=step, num_classes=1000)
            return loss(params, images, targets)
    """
    rule.check_seed(seed)
    m = rule.Mixup(
        num_classes=num_classes,
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        prob=prob,
        switch_prob=switch_prob,
        label_smoothing=label_smoothing,
        mode=mode,
    )
    images, labels = jnp.asarray(images), jnp.asarray(labels)
    step = _checked_step(step)
    placement = _placement(images, sharding)
    blocks = 1
    if placement is not None:
        mesh, spec = placement
        axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
        blocks = int(np.prod([mesh.shape[a] for a in axes if a is not None], dtype=np.int64))
    rule.check_batch(m, images, labels, layout, blocks)
    if not isinstance(labels, jax.core.Tracer) and labels.is_fully_addressable:
        rule.check_labels(m, np.asarray(labels))

    return _compiled(m, int(seed), layout, placement)(images, labels, step)


@functools.lru_cache(maxsize=64)
def _compiled(m: rule.Mixup, seed: int, layout: str, placement):
    """The op as one jitted function per configuration (inlined into an enclosing jit; outside
    one it spares a sharded batch `shard_map`'s op-by-op dispatch)."""

    def body(x, y, s):
        return rule.mix_block(m, x, y, seed=seed, step=s, layout=layout, xp=jnp)

    if placement is None:
        return jax.jit(body)
    mesh, spec = placement
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, PartitionSpec()), out_specs=(spec, spec)))


def _checked_step(step):
    if isinstance(step, jax.core.Tracer):
        if step.shape != () or not jnp.issubdtype(step.dtype, jnp.integer):
            raise ValueError(f"step must be an integer scalar, got {step.dtype} of shape {step.shape}")
        return step
    return jnp.uint32(rule.check_step(step if not isinstance(step, jax.Array) else step.item()))


def _placement(images, sharding):
    """(mesh, PartitionSpec of the batch) when each device is to mix its own rows, else None."""
    if sharding is not None:
        return batch_spec(sharding)
    context = jax.sharding.get_abstract_mesh()
    if context.axis_names and set(context.manual_axes) == set(context.axis_names):
        return None  # inside shard_map over every axis: already one device's rows
    if isinstance(images, jax.core.Tracer):
        typed = getattr(jax.typeof(images), "sharding", None)  # a mesh with explicit axes
        given = typed if isinstance(typed, NamedSharding) and typed.spec and typed.spec[0] else None
    else:
        given = images.sharding if isinstance(images.sharding, NamedSharding) else None
        if given is not None and not (given.spec and given.spec[0]):
            given = None
    return batch_spec(given) if given is not None else None
