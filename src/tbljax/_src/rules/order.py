"""Which sample sits where. The shuffled order of an epoch and counter-based random
bits for augmentation, pure functions; the steps of an epoch and host parts are in `parts.py`,
the resumable state in `resume.py`.

Everything here is a function of (seed, epoch, position) or (seed, epoch, sample index): no table
of size N, no hidden generator state, so any process can compute any step of any epoch in O(B)
time and memory, and a resumed run computes exactly what the uninterrupted run would have.

**Hash.** All randomness comes from one 32-bit mixing function,

    mix32(x):  x ^= x >> 16;  x *= 0x7FEB352D;  x ^= x >> 15;  x *= 0x846CA68B;  x ^= x >> 16

(the "lowbias32" constants published by C. Wellons; a bijection of uint32 with strong avalanche),
chained over 32-bit words: ``h = IV; for w in words: h = mix32(h ^ w); out = mix32(h ^ PHI)``
with ``IV = 0x243F6A88`` and ``PHI = 0x9E3779B9``. Only uint32 xor, shifts and multiplies that
wrap modulo 2^32: NumPy, ``jax.numpy`` (with or without x64) and C agree bit for bit. Every
function that touches arrays takes ``xp=numpy`` and runs unchanged with ``xp=jax.numpy``, also
inside ``jax.jit`` with a traced epoch (the keys are then hashed in the graph);
tests check that the two agree exactly.

**Shuffle: a keyed Feistel network with cycle walking.** For N samples let k be the number of
bits of N - 1 (so 2^k >= N > 2^(k-1)), a = k - k//2 and b = k//2. A position x < 2^k is split
into L = x >> b (a bits) and R = x & (2^b - 1) (b bits). Each of 8 rounds r maps

    (L, R)  ->  (R, L ^ (mix32(R ^ K_r) & (2^|L| - 1)))

which swaps the widths of the halves, so after the even number of rounds they are (a, b) again
and the result is ``(L << b) | R``. Each round is invertible, so this is a permutation of
[0, 2^k). The round keys are ``K_r = hash(TAG_SHUFFLE, seed_lo, seed_hi, epoch, r)``. Values
that land at or above N are sent through the network again ("cycle walking") until they fall
below N; since the network permutes [0, 2^k) and 2^k < 2N, this restricts it to a permutation
of [0, N) and takes fewer than 2 passes on average. ``shuffle=False`` is the identity. N up to
2^62 is supported (the halves stay within 32 bits).

**Repeats** (``repeats=k``, repeated augmentation as DeiT's ``RASampler``): an epoch has k·N
positions. Its slot j holds record ``permute(j // k, N, seed, epoch)``, repeat ``j % k`` (DeiT's
``repeat_interleave(randperm(N), k)``), so a record's k repeats are neighbours and fall in one
step (unless a step boundary cuts them). Within a step of M rows from position f, the rows take
the step's slots [f, f + M) ordered by (repeat, slot): the rows hold first every repeat 0, then
every repeat 1, ..., so a record's repeats lie about M/k rows apart, on different devices and
hosts as DeiT's strided ranks put them (`repeated`). A bijection of the step's positions: every
(record, repeat) once an epoch, and a resumed run at the same batch size serves the same rows.

**Augmentation bits** for sample index i are ``hash(i_lo, i_hi, counter)`` chained from the key
``hash(TAG_AUGMENT, seed_lo, seed_hi, epoch)``: they depend on (seed, epoch, i, counter) only,
never on batch size, thread count, host count or resume point.

Example:
    >>> import numpy as np
    >>> from tbljax import order
    >>> idx = order.permute(np.arange(10), 10, seed=0, epoch=0)
    >>> sorted(idx.tolist()) == list(range(10))
    True
"""

from __future__ import annotations

import functools

import numpy as np

from tbljax import _core
from tbljax._src.rules.contract import is_integer
from tbljax._src.rules.parts import MAX_SAMPLES

__all__ = [
    "TAG_AUGMENT",
    "TAG_SHUFFLE",
    "check_seed_epoch",
    "hash32",
    "mix32",
    "permute",
    "permute_reference",
    "random_bits",
    "repeated",
]

_M1 = 0x7FEB352D
_M2 = 0x846CA68B
_IV = 0x243F6A88
_PHI = 0x9E3779B9
_ROUNDS = 8
# Domain tags keep the shuffle keys and the augmentation keys of one (seed, epoch) unrelated.
TAG_SHUFFLE = 0x53484646  # "SHFF"
TAG_AUGMENT = 0x41554730  # "AUG0"


def mix32(x, xp=np):
    """The lowbias32 mixer on a uint32 array (a bijection of uint32). Example:

    >>> int(mix32(np.array([1], np.uint32))[0])
    1753845952
    """
    x = x ^ (x >> 16)
    x = x * xp.uint32(_M1)
    x = x ^ (x >> 15)
    x = x * xp.uint32(_M2)
    return x ^ (x >> 16)


def hash32(words, iv=_IV, xp=np):
    """Chains 32-bit words (uint32 arrays that broadcast together) into one uint32 hash.

    ``iv`` may itself be a uint32 array or a Python int (e.g. a key from `hash32`).
    """
    h = xp.asarray(iv, dtype=xp.uint32)
    for w in words:
        h = mix32(h ^ xp.asarray(w, dtype=xp.uint32), xp)
    return mix32(h ^ xp.uint32(_PHI), xp)


def check_seed_epoch(seed, epoch) -> tuple[int, int]:
    """(seed, epoch) as ints: seed in [0, 2**64), epoch in [0, 2**32) (the words hashed)."""
    if not is_integer(seed) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    if not is_integer(epoch) or not 0 <= epoch < 1 << 32:
        raise ValueError(f"epoch must be an integer in [0, 2**32), got {epoch!r}")
    return int(seed), int(epoch)


@functools.lru_cache(maxsize=256)
def _key(tag, seed, epoch, *extra) -> int:
    """A 32-bit key for (tag, seed, epoch, extra...), as a Python int (the same on every host)."""
    seed, epoch = check_seed_epoch(seed, epoch)
    words = [tag, seed & 0xFFFFFFFF, seed >> 32, epoch, *extra]
    return int(hash32([np.array([w], np.uint32) for w in words])[0])


def _epoch_key(tag, seed, epoch, *extra, xp=np):
    """`_key`, also for an epoch that is a traced jax value (a jitted step that computes its
    epoch from the step number, e.g. tbljax.ResidentDataset): then the same hash is computed
    in the graph, as a uint32 scalar."""
    if xp is np or isinstance(epoch, (int, np.integer)):
        return _key(tag, seed, epoch, *extra)
    seed, _ = check_seed_epoch(seed, 0)
    words = [tag, seed & 0xFFFFFFFF, seed >> 32, xp.asarray(epoch).astype(xp.uint32), *extra]
    return hash32(words, xp=xp)


def _feistel(x, a, b, keys, xp):
    """One pass of the 8-round Feistel network on k = a + b bit values (uint32 halves)."""
    left = (x >> b).astype(xp.uint32)
    right = (x & ((1 << b) - 1)).astype(xp.uint32)
    wl, wr = a, b
    for k in keys:
        f = mix32(right ^ xp.uint32(k), xp) & xp.uint32((1 << wl) - 1)
        left, right = right, left ^ f
        wl, wr = wr, wl
    return (left.astype(x.dtype) << b) | right.astype(x.dtype)


def permute(positions, n: int, seed: int = 0, epoch: int = 0, *, shuffle: bool = True, xp=np):
    """Maps positions of epoch `epoch` to sample indices: a bijection of [0, n) keyed by (seed, epoch).

    O(1) time and memory per position; vectorized over an integer array of positions. With
    ``xp=numpy`` positions are checked to lie in [0, n).

    >>> permute(np.arange(5), 5, shuffle=False).tolist()
    [0, 1, 2, 3, 4]
    >>> p = permute(np.arange(1000), 1000, seed=7, epoch=3)
    >>> np.array_equal(np.sort(p), np.arange(1000))
    True
    """
    if not is_integer(n) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"n (the number of samples) must be an integer in [1, 2**62], got {n!r}")
    n = int(n)
    if xp is np:
        positions = np.asarray(positions)
        if positions.dtype.kind not in "iu":
            raise TypeError(f"positions must be an integer array, got dtype {positions.dtype}")
        positions = positions.astype(np.int64, copy=False)
        if positions.size and (positions.min() < 0 or positions.max() >= n):
            bad = positions[(positions < 0) | (positions >= n)][0]
            raise IndexError(f"position {int(bad)} is outside [0, {n})")
    if not shuffle or n == 1:
        return positions if xp is not np else positions.copy()
    k = (n - 1).bit_length()
    a, b = k - k // 2, k // 2
    keys = [_epoch_key(TAG_SHUFFLE, seed, epoch, r, xp=xp) for r in range(_ROUNDS)]
    if xp is np:
        # The same network in C++: one pass over the positions, no temporaries.
        return _core.feistel_permute(np.ascontiguousarray(positions), n, keys, a, b)
    return _permute_xp(positions, n, a, b, keys, xp)


def _permute_xp(positions, n, a, b, keys, xp):
    """The network with cycle walking in array code: the reference for the C++ fast path, and
    the jax.numpy version (also inside jax.jit)."""
    y = _feistel(positions, a, b, keys, xp)
    if xp is np:
        # Cycle walking on the rows still out of range only: cheap, since the network maps
        # [0, 2^k) with 2^k < 2n, so each pass leaves fewer than half the rows behind.
        out = y >= n
        while out.any():
            sel = np.flatnonzero(out)
            y[sel] = _feistel(y[sel], a, b, keys, np)
            out[sel] = y[sel] >= n
        return y
    loop = while_loop(xp)

    def walk(y):
        return xp.where(y >= n, _feistel(y, a, b, keys, xp), y)

    return loop(lambda y: xp.any(y >= n), walk, y)


# Array modules' own while loops (one that also runs inside jit), by module name: the rules
# import no framework, so the JAX room registers jax.numpy's (`jax/collectives.py`).
_WHILE_LOOPS: dict = {}


def register_while_loop(module: str, loop) -> None:
    """`loop(cond, body, init)` runs the rules' loops (`permute`'s cycle walking, NaFlex's
    size search) under array module `module`."""
    _WHILE_LOOPS[module] = loop


def while_loop(xp):
    """The registered `loop(cond, body, init)` of array module `xp` (not NumPy: its loops are
    plain Python); TypeError for a module that has none."""
    loop = _WHILE_LOOPS.get(xp.__name__)
    if loop is None:
        raise TypeError(f"xp must be numpy or jax.numpy, got {xp.__name__}")
    return loop


def permute_reference(positions, n: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """`permute` (shuffled) computed by the network in NumPy array code instead of C++: the
    code jax.numpy runs, and the reference the C++ fast path is tested against.

    >>> np.array_equal(permute_reference(np.arange(9), 9, 1, 2), permute(np.arange(9), 9, 1, 2))
    True
    """
    positions = permute(positions, n, shuffle=False)  # checked, int64, a copy
    if n == 1:
        return positions
    k = (n - 1).bit_length()
    keys = [_key(TAG_SHUFFLE, seed, epoch, r) for r in range(_ROUNDS)]
    return _permute_xp(positions, n, k - k // 2, k // 2, keys, np)


def random_bits(indices, counters, seed: int = 0, epoch: int = 0, *, xp=np):
    """uint32 random words for (seed, epoch, sample index, counter): shape of the broadcast of
    ``indices`` and ``counters``. A pure function: the same sample always gets the same words.

    >>> r = random_bits(np.array([[3], [5]]), np.arange(4), seed=1, epoch=0)
    >>> r.shape, r.dtype
    ((2, 4), dtype('uint32'))
    """
    key = _epoch_key(TAG_AUGMENT, seed, epoch, xp=xp)
    indices = xp.asarray(indices)
    if indices.dtype.itemsize == 8:
        lo, hi = (indices & 0xFFFFFFFF).astype(xp.uint32), (indices >> 32).astype(xp.uint32)
    else:  # 32-bit indices (jax.numpy without x64): the high word is 0, as for int64 < 2^32
        lo = indices.astype(xp.uint32)
        hi = xp.zeros_like(lo)
    return hash32([lo, hi, xp.asarray(counters, dtype=xp.uint32)], iv=key, xp=xp)


def repeated(positions, n: int, seed: int = 0, epoch: int = 0, *, repeats: int, step, shuffle: bool = True, xp=np):
    """(record indices, repeats) of `positions` of an epoch of ``repeats * n`` positions (see
    "Repeats" above). `step`: (f, M), the first position and the rows (real rows: a padded last
    step's) of the step `positions` belong to; positions lie in [f, f + M). f and M may be traced.

    >>> r, k = repeated(np.arange(6), 2, repeats=3, step=(0, 6), shuffle=False)
    >>> r.tolist(), k.tolist()
    ([0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2])
    """
    k = repeats
    first, rows = step
    first = xp.asarray(first, dtype=xp.asarray(positions).dtype)
    # Repeat class c's slots in the step are f + d_c + k t (t < count_c); rows take them class by class.
    d = (xp.arange(k) - first) % k
    count = xp.maximum(rows - d + k - 1, 0) // k
    ends = xp.cumsum(count)
    c = xp.searchsorted(ends, positions - first, side="right")
    slot = first + d[c] + k * (positions - first - (ends - count)[c])
    return permute(slot // k, n, seed, epoch, shuffle=shuffle, xp=xp), (slot % k).astype(xp.int32)
