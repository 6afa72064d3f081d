"""`_core.serve_nearest` at every SIMD target against plain NumPy: one-byte maps go through
shuffles (issue 48) where 16 neighbouring outputs read 16 source bytes, or 32 (a crop that
shrinks by up to 2x), so the cases cover enlarging and shrinking crops, flips, crops that end at
the row's end (the window pulled back) and rows narrower than 16 or 32."""

import numpy as np
import pytest

from tbljax import _core


def reference(m, crop, flip, out_hw):
    # torchvision v2's nearest in float32: start + min(floor(float32(o) * (length / out)), length - 1).
    def index(start, length, out):
        scale = np.float32(length) / np.float32(out)
        return start + np.minimum(np.floor(np.arange(out, dtype=np.float32) * scale).astype(np.int64), length - 1)

    y0, x0, h, w = crop
    got = m[index(y0, h, out_hw[0])][:, index(x0, w, out_hw[1])]
    return got[:, ::-1] if flip else got


def cases(rng, dtype, trail=()):
    for h, w, crop, out_hw in [
        (40, 300, (3, 0, 30, 300), (20, 512)),  # the whole width enlarged
        (40, 300, (0, 250, 40, 50), (33, 200)),  # ends at the row's end: the window pulled back
        (40, 300, (5, 9, 20, 290), (9, 270)),  # shrinks a little: some chunks span 17 bytes
        (40, 300, (5, 1, 20, 299), (9, 64)),  # shrinks a lot: every chunk gathers
        (40, 300, (0, 200, 40, 100), (10, 64)),  # shrinks 1.56x: 32-byte windows, the last pulled back
        (20, 40, (0, 1, 20, 39), (5, 20)),  # shrinks 1.95x: chunks of 31 bytes, and a tail
        (20, 24, (0, 0, 20, 24), (5, 16)),  # shrinks 1.5x, a row narrower than 32: gathered
        (30, 500, (1, 3, 25, 300), (40, 368)),  # enlarges over 23 chunks and a tail
        (9, 12, (1, 2, 7, 10), (5, 77)),  # a row narrower than 16
        (9, 16, (0, 0, 9, 16), (4, 48)),
        (30, 100, (2, 84, 20, 16), (7, 33)),
    ]:
        m = rng.integers(0, 250, (h, w, *trail)).astype(dtype)
        for flip in (0, 1):
            yield m, crop, flip, out_hw


@pytest.mark.parametrize("dtype, trail", [(np.uint8, ()), (np.uint16, ()), (np.uint8, (3,))])
def test_every_simd_target_gathers_as_numpy(dtype, trail):
    rng = np.random.default_rng(0)
    try:
        for target in _core.supported_kernel_targets():
            _core.set_kernel_target(target)
            for m, crop, flip, out_hw in cases(rng, dtype, trail):
                out = np.zeros((2, *out_hw, *trail), dtype)
                hw = np.array([m.shape[0]] * 2, np.int32), np.array([m.shape[1]] * 2, np.int32)
                crops, flips = np.array([crop, crop], np.int32), np.array([flip, 1 - flip], np.uint8)
                _core.serve_nearest([m, m], *hw, crops, flips, out, 0)
                want = reference(m, crop, flip, out_hw)
                np.testing.assert_array_equal(out[0], want, err_msg=f"{target} {crop} {out_hw} flip {flip}")
                np.testing.assert_array_equal(out[1], reference(m, crop, 1 - flip, out_hw), err_msg=target)
    finally:
        _core.set_kernel_target("auto")


@pytest.mark.parametrize("stage", ["nearest", "linear"])
def test_a_crop_outside_its_map_is_refused_naming_the_row(stage):
    # Row 1's box runs one pixel past its 6x8 map (y0 + h = 7 > 6): refused before any work,
    # naming the row, the box and the map, by both map stages.
    maps = [np.zeros((6, 8), np.float32)] * 2
    hw = np.array([6, 6], np.int32), np.array([8, 8], np.int32)
    crops = np.array([[0, 0, 6, 8], [1, 2, 6, 3]], np.int32)
    out = np.zeros((2, 4, 4), np.float32)
    words = r"row 1: crop \(y0, x0, h, w\) = \(1, 2, 6, 3\) is not inside its 6x8 map"
    with pytest.raises(ValueError, match=words):
        if stage == "nearest":
            _core.serve_nearest(maps, *hw, crops, None, out, 0)
        else:
            _core.serve_linear(maps, *hw, crops, None, out, None, 0)


@pytest.mark.parametrize("stage", ["nearest", "linear"])
@pytest.mark.parametrize("short", ["maps", "heights", "crop", "flip"])
def test_per_row_arguments_need_one_entry_per_row_of_out(stage, short):
    # Two rows of out; one argument has a single entry: refused before any work, by both stages.
    args = {
        "maps": [np.zeros((6, 8), np.float32)] * 2,
        "heights": np.array([6, 6], np.int32),
        "crop": np.array([[0, 0, 6, 8]] * 2, np.int32),
        "flip": np.zeros(2, np.uint8),
    }
    args[short] = args[short][:1]
    out = np.zeros((2, 4, 4), np.float32)
    widths = np.array([8, 8], np.int32)
    words = r"need one entry per row of out \(2\)"
    with pytest.raises(ValueError, match=words):
        if stage == "nearest":
            _core.serve_nearest(args["maps"], args["heights"], widths, args["crop"], args["flip"], out, 0)
        else:
            _core.serve_linear(args["maps"], args["heights"], widths, args["crop"], args["flip"], out, None, 0)
