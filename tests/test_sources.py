"""convert's sources: brace patterns expand exactly as bash expands them (checked against bash
itself), a source named twice is refused, and the in-memory spellings users bring from
tf.data, Grain and Keras are understood or refused with the accepted forms named."""

from __future__ import annotations

import random
import shutil
import subprocess

import numpy as np
import pytest

import tbljax
from tbljax._src.rules.braces import MAX_EXPANSION, expand_braces

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is the reference for brace expansion")

# Zero padding, nesting, steps, letters, negatives, unbalanced and escaped braces, commas and
# ranges that are not what they look like, and the shard patterns users write.
PATTERNS = [
    "train-{000..099}.tar",
    "t-{000..010}.tar",
    "{0..10}",
    "{00..5}",
    "{1..010}",
    "{8..11}",
    "{010..8}",
    "{5..1}",
    "{0..10..2}",
    "{0..10..3}",
    "{10..0..3}",
    "{0..10..-3}",
    "{1..3..0}",
    "{-3..3}",
    "{-05..5..3}",
    "{-1..-10..4}",
    "{+1..3}",
    "{1..+3}",
    "{a..e}",
    "{e..a..2}",
    "{a..c..-1}",
    "{A..C}",
    "{x..x}",
    "{7..7}",
    "{1..c}",
    "{a..3}",
    "{aa..b}",
    "{1..}",
    "{..2}",
    "{1...3}",
    "{1..3.}",
    "{1..3..}",
    "{1..3..x}",
    "x{a,{b,c}}y",
    "x{a,b}{c,d}y",
    "{a,b}{1..2}",
    "{{a,b},{c,d}}",
    "{a,{b,{c,d}}}",
    "{a{b,c}d}",
    "{{1..3}}",
    "{a}{b,c}",
    "{a}b,c}",
    "s{7}",
    "s{}",
    "{}",
    "x{}y",
    "{a,}",
    "{,a}",
    "x{,}y",
    "{a,b",
    "a,b}",
    "{a,b}}",
    "{{a,b}",
    "}{a,b}{",
    "x\\{a,b}",
    "x{a\\,b}",
    "x{a,b\\}",
    "x{a,b}\\.",
    "\\{0..2\\}",
    "a\\b",
    "{a..b}\\{x,y}",
    "shard-{0..2}-{a,b}.tar",
    "s-{001..003}-of-{3..3}.tar",
    "{1..2}{a..b}{0..10..5}",
]


def bash_expand(patterns: list[str]) -> list[list[str]]:
    """What bash makes of each pattern as a word (globbing off), one list of words each."""
    script = "set -f\n" + "".join(f"printf '%s\\0' {p}; printf '\\1\\0'\n" for p in patterns)
    out = subprocess.run([BASH, "-c", script], capture_output=True, timeout=120, check=True).stdout
    groups, cur = [], []
    for w in out.decode().split("\0")[:-1]:
        if w == "\1":
            groups.append([] if cur == [""] else cur)  # printf with no words prints one ""
            cur = []
        else:
            cur.append(w)
    return groups


@needs_bash
def test_expand_braces_equals_bash_on_chosen_patterns():
    for pattern, want in zip(PATTERNS, bash_expand(PATTERNS)):
        assert expand_braces(pattern) == want, pattern


@needs_bash
def test_expand_braces_equals_bash_on_random_patterns():
    rng = random.Random(20240611)
    alphabet = list("ab0129-.,{}\\Z+") + ["{", "}", ",", "..", "{", "}"]
    patterns = []
    while len(patterns) < 2000:
        p = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        if p.endswith("\\") or p.startswith(("-", "+")):  # line continuation; printf options
            continue
        if len(expand_braces(p)) <= 2000:
            patterns.append(p)
    mismatches = [(p, expand_braces(p), w) for p, w in zip(patterns, bash_expand(patterns)) if expand_braces(p) != w]
    assert mismatches == [], mismatches[:5]


def test_expand_braces_without_bash():
    """The cases of issue 11, stated by hand so they hold where bash is absent."""
    assert expand_braces("x{a,{b,c}}y") == ["xay", "xby", "xcy"]
    assert expand_braces("{a..c}") == ["a", "b", "c"]
    assert expand_braces("{0..10..2}") == ["0", "2", "4", "6", "8", "10"]
    assert expand_braces("s{7}") == ["s{7}"]
    assert expand_braces("t-{000..002}.tar") == ["t-000.tar", "t-001.tar", "t-002.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("{-05..5..3}") == ["-05", "-02", "001", "004"]
    assert expand_braces("{a,b") == ["{a,b"] and expand_braces("x\\{a,b}") == ["x{a,b}"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_runaway_patterns_are_refused():
    with pytest.raises(ValueError, match="names"):
        expand_braces(f"{{0..{MAX_EXPANSION}}}")
    with pytest.raises(ValueError, match="more than"):
        expand_braces("{0..9999}{0..9999}")


def test_a_source_named_twice_is_an_error(tmp_path):
    imgs = np.zeros((1, 8, 8, 3), np.uint8)
    tbljax.convert(imgs, tmp_path / "a.tbl", image_size=8, progress=False)
    for p in ("s-0.tar", "s-1.tar"):
        (tmp_path / p).write_bytes(b"")
    with pytest.raises(ValueError, match=r"s-0\.tar.*named twice"):
        tbljax.convert(str(tmp_path / "s-{0,1,0}.tar"), tmp_path / "o.tbl", image_size=8)
    with pytest.raises(ValueError, match="named twice"):  # two spellings of one file
        tbljax.convert([str(tmp_path / "s-0.tar"), str(tmp_path / "." / "s-0.tar")], tmp_path / "o.tbl", image_size=8)
    assert not (tmp_path / "o.tbl").exists()


# ---- in-memory spellings ----


def _images(n=6, h=12, w=10):
    return np.random.default_rng(1).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    "form",
    [
        "tuple",
        "tuple-list-labels",
        "keras-n1-labels",
        "dict",
        "dict-plural",
        "dict-img",
        "list-of-batches",
        "list-of-images",
        "array",
    ],
)
def test_in_memory_spellings_convert(tmp_path, form):
    imgs = _images()
    labels = np.array([3, 1, 4, 1, 5, 9])
    src, want_labels = {
        "tuple": ((imgs, labels), labels),
        "tuple-list-labels": ((imgs, labels.tolist()), labels),
        "keras-n1-labels": ((imgs, labels[:, None].astype(np.uint8)), labels),
        "dict": ({"image": imgs, "label": labels}, labels),
        "dict-plural": ({"images": imgs, "labels": labels, "id": np.arange(6)}, labels),
        "dict-img": ({"img": imgs, "label": labels}, labels),
        "list-of-batches": ([imgs[:4], imgs[4:]], -np.ones(6, int)),
        "list-of-images": (list(imgs), -np.ones(6, int)),
        "array": (imgs, -np.ones(6, int)),
    }[form]
    s = tbljax.convert(src, tmp_path / "a.tbl", image_size=8, resize="squash", progress=False)
    ds = tbljax.open(tmp_path / "a.tbl")
    assert s.written == len(ds) == 6 and ds.classes is None
    assert ds.labels.tolist() == want_labels.tolist()
    # The same pixels as each image converted on its own (a real resize: 12x10 -> 8x8).
    for i in range(6):
        tbljax.convert([imgs[i]], tmp_path / f"one{i}.tbl", image_size=8, resize="squash", progress=False)
        np.testing.assert_array_equal(ds.read(i), tbljax.open(tmp_path / f"one{i}.tbl").read(0))


def test_in_memory_forms_keep_pixels_exactly(tmp_path):
    imgs = _images(h=10, w=10)  # no resize: stored pixels are the array's
    for k, src in enumerate([(imgs, np.arange(6)), {"image": imgs, "label": np.arange(6)}, [imgs[:2], imgs[2:]]]):
        tbljax.convert(src, tmp_path / f"{k}.tbl", image_size=10, progress=False)
        np.testing.assert_array_equal(tbljax.open(tmp_path / f"{k}.tbl").view(), imgs)


@pytest.mark.parametrize(
    "bad",
    [
        {"x": 1},
        {"image": 1, "images": 2},
        3,
        object(),
        iter([np.zeros((2, 2, 3), np.uint8)]),
        (np.zeros((2, 4, 4, 3), np.uint8), np.zeros(2), np.zeros(2)),
        [np.zeros((2, 4, 4, 3), np.uint8), np.arange(2)],
    ],
)
def test_unknown_forms_raise_type_error_naming_the_accepted_ones(tmp_path, bad):
    with pytest.raises(TypeError, match=r"image|tuple|dict"):
        tbljax.convert(bad, tmp_path / "x.tbl", image_size=8, progress=False)
    assert not (tmp_path / "x.tbl").exists()


def test_whole_arrays_are_checked_up_front(tmp_path):
    imgs = _images()
    with pytest.raises(ValueError, match="uint8"):
        tbljax.convert(imgs.astype(np.float32) / 255, tmp_path / "x.tbl", image_size=8)
    with pytest.raises(ValueError, match=r"channels-first.*transpose"):
        tbljax.convert(imgs.transpose(0, 3, 1, 2), tmp_path / "x.tbl", image_size=8)
    with pytest.raises(ValueError, match="labels given twice"):
        tbljax.convert((imgs, np.arange(6)), tmp_path / "x.tbl", image_size=8, labels=np.arange(6))
    with pytest.raises(ValueError, match=r"shape \(6,\)"):
        tbljax.convert({"image": imgs, "label": np.arange(5)}, tmp_path / "x.tbl", image_size=8)
