"""The mixing rule (src/tbljax/_src/rules/mixing.py) against plain arithmetic: each step's rows
per source are the exact quotas of the documented formula, shares hold to the weights, a row's
draw is a pure function of (seed, step, row), and records are drawn without replacement within
each pass over a source and reshuffled at the next."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import tbljax
from tbljax._src.rules.mixing import MixSpec, draw_rows, step_quotas


def reference_quotas(weights, step, batch):
    """T_k(S) = floor(S * G * W_k) with exact fractions, differenced over k and S."""
    cum = np.cumsum([Fraction(w) for w in weights]) / sum(Fraction(w) for w in weights)

    def before(s):
        t = [int(s * batch * c) for c in cum]
        return np.diff([0, *t])

    return before(step + 1) - before(step)


@pytest.mark.parametrize("weights", [(0.75, 0.25), (0.5, 0.25, 0.125, 0.125), (3, 1)])
def test_quotas_are_the_documented_formula(weights):
    spec = MixSpec(weights, (7,) * len(weights))
    for s in range(50):
        q = step_quotas(spec, s, 10)
        assert q.tolist() == reference_quotas(weights, s, 10).tolist() and q.sum() == 10


def test_over_ten_thousand_rows_each_share_is_within_two_percent_of_its_weight():
    weights = (0.7, 0.2, 0.1)
    spec = MixSpec(weights, (50, 1000, 7))
    counts = np.zeros(3, np.int64)
    for s in range(100):
        source, _, _ = draw_rows(spec, seed=1, global_step=s, rows=np.arange(100), batch=100)
        counts += np.bincount(source, minlength=3)
    assert counts.sum() == 10_000
    assert np.abs(counts / 10_000 - np.array(weights)).max() < 0.02


def test_a_row_is_a_pure_function_of_seed_step_and_row():
    spec = MixSpec((0.6, 0.4), (13, 5))
    whole = draw_rows(spec, seed=9, global_step=17, rows=np.arange(16), batch=16)
    halves = [draw_rows(spec, seed=9, global_step=17, rows=np.arange(a, a + 8), batch=16) for a in (0, 8)]
    for w, a, b in zip(whole, *halves):
        assert w.tolist() == np.concatenate([a, b]).tolist()
    other = draw_rows(spec, seed=10, global_step=17, rows=np.arange(16), batch=16)
    assert any(x.tolist() != y.tolist() for x, y in zip(whole, other))


def test_records_are_drawn_without_replacement_and_reshuffled_each_pass():
    # 12 and 4 records, 6 and 2 rows a step: a pass over either source is two steps.
    spec = MixSpec((0.75, 0.25), (12, 4))
    by_pass = {}
    for s in range(8):
        source, record, passes = draw_rows(spec, seed=3, global_step=s, rows=np.arange(8), batch=8)
        for k, r, q in zip(source.tolist(), record.tolist(), passes.tolist()):
            by_pass.setdefault((k, q), []).append(r)
    for (k, q), records in by_pass.items():
        assert sorted(records) == list(range(spec.counts[k])), (k, q)
    orders = {tuple(by_pass[0, q]) for q in range(4)}
    assert len(orders) > 1  # another shuffle each pass


@pytest.mark.parametrize(
    "weights,counts,match",
    [
        ((1.0,), (3, 4), "one weight per source"),
        ((1.0, -1.0), (3, 4), "finite and > 0"),
        ((1.0, float("nan")), (3, 4), "finite and > 0"),
        ((1.0, 1.0), (3, 0), "needs records"),
    ],
)
def test_bad_specs_are_clear_errors(weights, counts, match):
    with pytest.raises(ValueError, match=match):
        MixSpec(weights, counts)


def test_repr_of_a_mixture_never_opens_its_sources(tmp_path):
    # Issue 45 item 13: repr() of a mixture whose source file is missing said FileNotFoundError.
    tbljax.convert(np.zeros((4, 8, 8, 3), np.uint8), tmp_path / "a.tbl", image_size=8, progress=False)
    m = tbljax.mix(
        {"a": tmp_path / "a.tbl", "b": tmp_path / "missing.tbl"}, weights={"a": 3, "b": 1}, steps_per_epoch=2
    )
    assert repr(m) == "Mixture(a: 3, b: 1)"
    with pytest.raises(FileNotFoundError, match="missing.tbl"):
        len(m)
    ok = tbljax.mix({"a": tmp_path / "a.tbl"}, weights={"a": 1}, steps_per_epoch=2)
    assert len(ok) == 4 and repr(ok) == "Mixture(a: 1; 4 records)"
