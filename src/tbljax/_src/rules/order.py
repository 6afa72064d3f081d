"""tbljax.order: which sample sits where. The shuffled order of an epoch, the steps of an epoch,
counter-based random bits for augmentation and the small resumable state. Pure functions.

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

**Steps.** With G the global batch, step s of an epoch that starts at position p0 (0, or the
position a resumed run starts from) covers positions [p0 + s*G, p0 + (s+1)*G). With
``drop_remainder`` the last partial step is dropped; without it the last step is padded past
N and a ``valid`` mask marks real rows.

**Host parts** (``tbljax.loader(..., partition="host")``). Process p of P serves only the
records of its part: global indices [start_p, start_p + n_p), the parts in process order
(`tbljax.partition.host_part` of the shard files, or of the records of a single file). Its
local position x of epoch e holds sample ``start_p + permute(x, n_p, seed, e)``: each part is
reshuffled every epoch by the same (seed, epoch) key. Step s of an epoch covers local positions
[s*b, (s+1)*b) of every part, b = G / P, and every process runs the same steps: with
``drop_remainder`` as many as the smallest part fills, min(n_p // b); without, as many as the
largest part needs, max(ceil(n_p / b)), the parts that run out first padding their rows.
`Parts` holds the counts; with one part (the whole dataset, start 0) it is the global order.

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

import dataclasses
import functools

import numpy as np

from tbljax import _core

__all__ = [
    "STATE_VERSION", "mix32", "hash32", "permute", "random_bits", "steps_in_epoch",
    "advance", "Parts", "make_state", "check_state",
]

_M1 = 0x7FEB352D
_M2 = 0x846CA68B
_IV = 0x243F6A88
_PHI = 0x9E3779B9
_ROUNDS = 8
# Domain tags keep the shuffle keys and the augmentation keys of one (seed, epoch) unrelated.
TAG_SHUFFLE = 0x53484646   # "SHFF"
TAG_AUGMENT = 0x41554730   # "AUG0"
_MAX_N = 1 << 62

STATE_VERSION = 1
_STATE_KEYS = ("version", "seed", "epoch", "position", "fingerprint")


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


def _check_seed_epoch(seed, epoch):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or not 0 <= epoch < 1 << 32:
        raise ValueError(f"epoch must be an integer in [0, 2**32), got {epoch!r}")
    return int(seed), int(epoch)


@functools.lru_cache(maxsize=256)
def _key(tag, seed, epoch, *extra) -> int:
    """A 32-bit key for (tag, seed, epoch, extra...), as a Python int (the same on every host)."""
    seed, epoch = _check_seed_epoch(seed, epoch)
    words = [tag, seed & 0xFFFFFFFF, seed >> 32, epoch, *extra]
    return int(hash32([np.array([w], np.uint32) for w in words])[0])


def _epoch_key(tag, seed, epoch, *extra, xp=np):
    """`_key`, also for an epoch that is a traced jax value (a jitted step that computes its
    epoch from the step number, e.g. tbljax.ResidentDataset): then the same hash is computed
    in the graph, as a uint32 scalar."""
    if xp is np or isinstance(epoch, (int, np.integer)):
        return _key(tag, seed, epoch, *extra)
    seed, _ = _check_seed_epoch(seed, 0)
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
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= _MAX_N:
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
    import jax  # xp is jax.numpy: a loop that also runs inside jit

    def walk(y):
        return xp.where(y >= n, _feistel(y, a, b, keys, xp), y)

    return jax.lax.while_loop(lambda y: xp.any(y >= n), walk, y)


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


def _check_batch(n, global_batch):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= _MAX_N:
        raise ValueError(f"n (the number of samples) must be an integer in [1, 2**62], got {n!r}")
    if isinstance(global_batch, bool) or not isinstance(global_batch, (int, np.integer)) \
            or global_batch < 1:
        raise ValueError(f"global batch must be an integer >= 1, got {global_batch!r}")


def steps_in_epoch(n: int, global_batch: int, *, drop_remainder: bool, start: int = 0) -> int:
    """Steps left in an epoch of n samples from position `start` (0: a whole epoch).

    >>> steps_in_epoch(10, 4, drop_remainder=True), steps_in_epoch(10, 4, drop_remainder=False)
    (2, 3)
    """
    _check_batch(n, global_batch)
    if not 0 <= start <= n:
        raise ValueError(f"start position must be in [0, {n}], got {start!r}")
    left = n - start
    return left // global_batch if drop_remainder else -(-left // global_batch)


def advance(epoch: int, position: int, n: int, global_batch: int, *, drop_remainder: bool):
    """The cursor (epoch, position) after a step that ended at `position`: the start of the
    next epoch once this one has no step left (so a saved state never points at a spent tail).

    >>> advance(0, 8, 10, 4, drop_remainder=True), advance(0, 8, 10, 4, drop_remainder=False)
    ((1, 0), (0, 8))
    """
    position = min(position, n)
    if steps_in_epoch(n, global_batch, drop_remainder=drop_remainder, start=position) == 0:
        return epoch + 1, 0
    return epoch, position


@dataclasses.dataclass(frozen=True)
class Parts:
    """The record counts of every process's part and which part is this process's (see
    "Host parts" above). ``Parts.whole(n)``: one part, the whole dataset (the global order).

    >>> p = Parts((5, 3), index=1)
    >>> p.start, p.n, p.steps(2, drop_remainder=True), p.steps(2, drop_remainder=False)
    (5, 3, 1, 3)
    """

    counts: tuple[int, ...]
    index: int = 0

    def __post_init__(self):
        counts = tuple(int(c) for c in self.counts)
        object.__setattr__(self, "counts", counts)
        if not counts or not 0 <= self.index < len(counts):
            raise ValueError(f"part {self.index} is not one of the {len(counts)} parts")
        empty = [p for p, c in enumerate(counts) if c < 1]
        if empty:
            raise ValueError(f"the parts of processes {empty} hold no records (part sizes "
                             f"{list(counts)}): every process needs at least one record")

    @classmethod
    def whole(cls, n: int) -> "Parts":
        return cls((n,), 0)

    @property
    def start(self) -> int:
        """Global index of this part's first record."""
        return sum(self.counts[:self.index])

    @property
    def n(self) -> int:
        return self.counts[self.index]

    def steps(self, batch: int, *, drop_remainder: bool, start: int = 0) -> int:
        """Steps left from local position `start` with `batch` rows of each part a step: the
        same on every process."""
        left = [steps_in_epoch(c, batch, drop_remainder=drop_remainder, start=min(start, c))
                for c in self.counts]
        return min(left) if drop_remainder else max(left)

    def advance(self, epoch: int, position: int, batch: int, *, drop_remainder: bool):
        """`advance` for parts: the cursor after a step that ended at local `position`."""
        position = min(position, max(self.counts))
        if self.steps(batch, drop_remainder=drop_remainder, start=position) == 0:
            return epoch + 1, 0
        return epoch, position


def make_state(*, seed: int, epoch: int, position: int, fingerprint: str,
               processes: int | None = None) -> dict:
    """The resumable state: a small versioned dict of plain ints and strings. A
    partition="host" loader gives `processes` (P): its state also says ``"partition":
    "host"`` and P, and its position is the local position of every part.

    >>> make_state(seed=0, epoch=1, position=512, fingerprint="ab12")["version"]
    1
    """
    seed, epoch = _check_seed_epoch(seed, epoch)
    state = {"version": STATE_VERSION, "seed": seed, "epoch": epoch, "position": int(position),
             "fingerprint": str(fingerprint)}
    if processes is not None:
        state.update(partition="host", processes=int(processes))
    return state


def check_state(state, *, seed: int, fingerprint: str, n: int,
                processes: int | None = None) -> tuple[int, int]:
    """Validates a state from `make_state` against this run; returns (epoch, position).

    `n` bounds the position (with parts: the largest part). `processes`: P for a
    partition="host" loader, None for the global order. A host-part state resumes at another
    process count only at an epoch boundary: mid-epoch the parts hold other records, so the
    rest of that epoch has no exact continuation, and this refuses it (the error says how to
    go on). Raises ValueError naming the offending value and what was expected.
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"state is missing {missing}; expected keys {list(_STATE_KEYS)}")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"state version {state['version']!r} is not supported: this tbljax "
                         f"reads version {STATE_VERSION}")
    saved, mine = state.get("partition"), ("host" if processes is not None else None)
    if saved != mine:
        # Checked before the fingerprint: the two modes fingerprint the data differently.
        raise ValueError(f"state was saved by a loader with partition={saved!r} but this loader "
                         f"has partition={mine!r}: its positions count other rows; create the "
                         f"loader with partition={saved!r}")
    if state["fingerprint"] != fingerprint:
        raise ValueError(f"state is for dataset {state['fingerprint']!r} but this loader reads "
                         f"dataset {fingerprint!r}")
    if state["seed"] != seed:
        raise ValueError(f"state was saved with seed={state['seed']!r} but this loader has "
                         f"seed={seed!r}: create the loader with the state's seed")
    epoch, position = state["epoch"], state["position"]
    _check_seed_epoch(seed, epoch)
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)) \
            or not 0 <= position <= n:
        raise ValueError(f"state position must be an integer in [0, {n}], got {position!r}")
    if processes is not None:
        saved_p = state.get("processes")
        if isinstance(saved_p, bool) or not isinstance(saved_p, (int, np.integer)) or saved_p < 1:
            raise ValueError(f"state 'processes' must be an integer >= 1, got {saved_p!r}")
        if saved_p != processes and position != 0:
            raise ValueError(
                f"state was saved mid-epoch (epoch {epoch}, position {position} of each "
                f"process's part) by {saved_p} processes, and this job has {processes}: with "
                f"partition='host' each process now owns other records, so the rest of epoch "
                f"{epoch} has no exact continuation. Resume at an epoch boundary: "
                f"loader.set_epoch({epoch + 1}) skips the rest of epoch {epoch}, "
                f"loader.set_epoch({epoch}) serves epoch {epoch} again from its start")
    return int(epoch), int(position)
