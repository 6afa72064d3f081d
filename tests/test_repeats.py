"""Repeated augmentation (issue 47, `repeats=k`): every (record, repeat) once an epoch of k·N
positions, in DeiT's order (each shuffled record k times in a row, `np.repeat` here) with each
step's rows ordered by repeat; repeats augmented apart, repeat 0 the loader without repeats;
resume exact; the host loader, torch, MLX, host parts and `ResidentDataset.batch` in jit agree;
refusals by name."""

from __future__ import annotations

import numpy as np
import pytest

import tbljax
from tbljax._src.datasets.host_part import PartDataset
from tbljax._src.engine.host_loader import HostLoader
from tbljax._src.engine.rows import RowLayout
from tbljax._src.rules.augment import sample

import _loader_testing as T
import oracle

N, K, G, SEED = 11, 3, 4, 5
AUG = tbljax.Augment(size=(4, 4))
ALL = sorted((i, r) for i in range(N) for r in range(K))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    imgs = T.images(N, 9, 7, seed=2)
    return imgs, T.write_tbl(tmp_path_factory.mktemp("repeats") / "a.tbl", imgs, np.arange(N))


def deit_steps(n, k, g, epoch, first_index=0):
    """The plain reference: DeiT's `repeat_interleave(perm, k)` cut into steps of g, each step's
    (record, repeat) pairs ordered by (repeat, slot)."""
    perm = tbljax.order.permute(np.arange(n), n, SEED, epoch) + first_index
    slots = list(zip(np.repeat(perm, k).tolist(), np.tile(np.arange(k), n).tolist()))
    steps = [slots[s : s + g] for s in range(0, len(slots), g)]
    return [sorted(st, key=lambda p: (p[1], st.index(p))) for st in steps]


def pairs(index, repeat, valid=None):
    index, repeat = np.asarray(index), np.asarray(repeat)
    keep = np.ones(len(index), bool) if valid is None else np.asarray(valid)
    return list(zip(index[keep].tolist(), repeat[keep].tolist()))


def test_jax_loader_serves_deits_order_every_record_repeat_once(data):
    _, path = data
    steps, seen = [], []
    for b in tbljax.loader(
        path, G, seed=SEED, augment=AUG, dtype="uint8", repeats=K, num_epochs=2, drop_remainder=False
    ):
        idx, rep, valid = (np.asarray(b[k]) for k in ("index", "repeat", "valid"))
        assert rep.dtype == np.int32 and (rep[~valid] == -1).all() and (idx[~valid] == -1).all()
        steps.append(pairs(idx, rep, valid))
        seen += steps[-1]
    assert steps == deit_steps(N, K, G, 0) + deit_steps(N, K, G, 1)
    assert sorted(seen[: N * K]) == ALL and sorted(seen[N * K :]) == ALL


def test_repeats_get_their_own_crops_and_repeat_0_is_the_loader_without_repeats(data):
    imgs, path = data
    rows = {}
    for b in tbljax.loader(path, G, seed=SEED, augment=AUG, dtype="uint8", repeats=K, num_epochs=1):
        for i, r, x in zip(np.asarray(b["index"]).tolist(), np.asarray(b["repeat"]).tolist(), np.asarray(b["image"])):
            rows[i, r] = x
    plain = {}
    for b in tbljax.loader(path, 1, seed=SEED, augment=AUG, dtype="uint8", num_epochs=1):
        assert "repeat" not in b
        plain[int(b["index"][0])] = np.asarray(b["image"][0])
    for (i, r), x in rows.items():
        if r == 0:
            np.testing.assert_array_equal(x, plain[i])  # bit for bit
    # The oracle's pixels from each repeat's own box and flip (counters + 64 r).
    idx = np.array([i for i, _ in rows]), np.array([r for _, r in rows])
    boxes, flips = sample(AUG, idx[0], height=9, width=7, seed=SEED, epoch=0, repeat=idx[1])
    want = oracle.gather(imgs, idx[0], AUG.size, crop=boxes, flip=flips)
    np.testing.assert_array_equal(np.stack(list(rows.values())), want)
    # A record's repeats are different draws: boxes of repeats 0, 1, 2 not all equal.
    by = {k: b.tolist() + [bool(f)] for k, b, f in zip(rows, boxes, flips)}
    assert all(len({tuple(by[i, r]) for r in range(K)}) > 1 for i in range(N) if (i, K - 1) in by)


def test_torch_and_mlx_serve_the_same_rows(data):
    pytest.importorskip("torch")
    pytest.importorskip("mlx.core")
    import tbljax.mlx
    import tbljax.torch

    _, path = data
    kw = dict(seed=SEED, augment=AUG, dtype="uint8", repeats=K, drop_remainder=False)
    want = deit_steps(N, K, G, 0)
    for ld, host in (
        (tbljax.torch.loader(path, G, layout="NHWC", **kw), lambda t: t.numpy()),
        (tbljax.mlx.loader(path, G, **kw), np.array),
    ):
        got = [pairs(host(b.index), host(b.repeat), host(b.valid)) for b in ld]
        assert got == want, type(ld).__name__


def test_two_host_parts_each_serve_their_records_k_times(data):
    _, path = data
    ds = tbljax.open(path)
    parts = tbljax.order.Parts((5, 6), index=0)
    served = []
    for p, (lo, hi) in enumerate([(0, 5), (5, 11)]):
        part = PartDataset(ds, lo, hi, ds.fingerprint)
        opts = tbljax.LoaderOptions(batch_size=G, seed=SEED, num_epochs=1, repeats=K, drop_remainder=False)
        ld = HostLoader(part, opts, RowLayout.for_rank(G // 2, 0, 1), parts=tbljax.order.Parts(parts.counts, p))
        mine = [pairs(hb.index, hb.repeats[0], hb.valid) for hb in ld]
        # Each process: its own part in DeiT's order over its own rows (G/2 a step).
        assert [st for st in mine if st] == deit_steps(hi - lo, K, G // 2, 0, first_index=lo)
        served += sum(mine, [])
    assert sorted(served) == ALL


def test_mid_epoch_state_resumes_exactly_and_refuses_another_repeats(data):
    _, path = data
    kw = dict(seed=SEED, augment=AUG, dtype="uint8", repeats=K, num_epochs=1, drop_remainder=False)
    ld = tbljax.loader(path, G, **kw)
    it = iter(ld)
    next(it), next(it), next(it)
    state = ld.state_dict()
    assert state["repeats"] == K and state["position"] == 3 * G
    rest = [{k: np.asarray(v) for k, v in b.items()} for b in it]
    again = tbljax.loader(path, G, **kw)
    again.load_state_dict(state)
    resumed = [{k: np.asarray(v) for k, v in b.items()} for b in again]
    assert len(rest) == len(resumed) == -(-N * K // G) - 3
    for a, b in zip(rest, resumed):
        for k in ("index", "repeat", "image", "valid"):
            np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match=r"saved with repeats=3 but this loader has repeats=1"):
        tbljax.loader(path, G, **{**kw, "repeats": 1}).load_state_dict(state)


def test_resident_dataset_in_jit_serves_the_loaders_bytes(data):
    import jax

    _, path = data
    rd = tbljax.ResidentDataset(path)
    assert rd.steps_per_epoch(G, repeats=K) == N * K // G
    step = jax.jit(lambda ds, s: ds.batch(s, batch_size=G, seed=SEED, augment=AUG, dtype="uint8", repeats=K))
    host = tbljax.loader(path, G, seed=SEED, augment=AUG, dtype="uint8", repeats=K, num_epochs=2)
    for s, b in enumerate(host):
        got = step(rd, s)
        for k in ("image", "index", "repeat", "label"):
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(b[k]), err_msg=f"{k} step {s}")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", 1025])
def test_repeats_must_be_an_integer_from_1_to_1024(bad):
    with pytest.raises(ValueError, match=r"repeats must be an integer in \[1, 1024\] \(1: off\), got"):
        tbljax.LoaderOptions(batch_size=4, repeats=bad)


def test_a_mixture_refuses_repeats_by_name(data):
    _, path = data
    mixture = tbljax.mix({"a": path, "b": path}, weights={"a": 0.5, "b": 0.5}, steps_per_epoch=2)
    with pytest.raises(ValueError, match=r"repeats=2 is not supported with a mixture"):
        tbljax.loader(mixture, G, repeats=2)
