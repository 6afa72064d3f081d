"""Tests of the one native module, tbljax._core: one thread pool and one SIMD target shared by
the loader's kernel, the resize, the CRC and the XLA CPU handler; the constants, tables and
argument checks it exports so that Python never retypes them; build_info(); and its typed
stub, regenerated and compared with the one generated at build."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tbljax
from tbljax import _core

from _loader_testing import normalize

TARGETS = _core.supported_kernel_targets()
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@pytest.fixture(autouse=True)
def _restore_target():
    yield
    _core.set_kernel_target("auto")


# ---------------------------------------------------------------------------------------------
# One module: one pool, one SIMD target, for the host kernel and the XLA CPU handler alike
# ---------------------------------------------------------------------------------------------

_ONE_POOL_CHILD = r"""
import json, os
import numpy as np
import jax, jax.numpy as jnp
import tbljax
from tbljax import kernels, ops

def tbljax_threads():  # the names of this process's threads that tbljax started
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(n for n in names if n.startswith("tbljax"))

before = tbljax_threads()
data = np.random.default_rng(0).integers(0, 256, (8, 12, 10, 3), dtype=np.uint8)
idx = np.array([3, 1, 7, 0, 2, 5], np.int64)
norm = dict(mean=(0.5, 0.4, 0.3), std=(0.25, 0.2, 0.3))
host = kernels.gather(data, idx, np.empty((6, 12, 10, 3), np.float32), **norm)
f = jax.jit(lambda d, i: ops.gather_normalize(d, i, backend="ffi", **norm))
in_jit = np.asarray(f(jnp.asarray(data), jnp.asarray(idx)))
with open("/proc/self/maps") as m:
    libs = {line.split()[-1] for line in m if line.rstrip().endswith(".so")}
print(json.dumps(dict(
    before=before, after=tbljax_threads(), same=bool(np.array_equal(host, in_jit)),
    # The package folder itself, not any path holding "/tbljax/": a clone named tbljax
    # keeps its .venv (numpy, jaxlib, ...) under such a path.
    native=sorted(os.path.basename(p) for p in libs
                  if os.path.dirname(os.path.realpath(p)) == os.path.dirname(os.path.realpath(tbljax.__file__))),
    info=tbljax.build_info(), cpu=ops.registered_platforms()["cpu"])))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_host_kernel_and_xla_handler_share_one_pool_and_one_module():
    # Before one module, a process using both the loader and the in-jit op ran two copies of
    # the core: two pools (2 x 2 workers here) and two SIMD targets.
    env = dict(os.environ, TBLJAX_NUM_THREADS="3")
    r = subprocess.run([sys.executable, "-c", _ONE_POOL_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["same"]
    assert got["before"] == []
    assert got["after"] == ["tbljax-pool", "tbljax-pool"]  # 3 threads: the caller + 2 workers
    assert len(got["native"]) == 1 and got["native"][0].startswith("_core."), got["native"]
    assert got["cpu"] == "registered by tbljax._core"
    info = got["info"]
    assert info["xla_cpu"] is True and info["threads"] == 3 and info["pool_started"] is True


def test_build_info_describes_both_front_ends():
    info = tbljax.build_info()
    assert info["simd"] == _core.kernel_target() and info["simd"] in info["simd_targets"]
    assert info["simd_targets"] == TARGETS
    assert info["threads"] >= 1 and isinstance(info["pool_started"], bool)
    # jax (for jax.ffi.include_dir()) is a build requirement: every build has the handlers.
    assert info["xla_cpu"] is True and hasattr(_core, "xla_registrations")
    assert info["xla_ffi_api"].count(".") == 1
    assert set(_core.xla_registrations()) == {
        "tbljax_gather_normalize",
        "tbljax_gather_normalize_packed",
        "tbljax_gather_normalize_ops",
        "tbljax_gather_normalize_packed_ops",
    }
    assert isinstance(info["xla_cuda"], bool)
    assert info["xla_cuda"] or info["xla_cuda_error"]
    for key in ("version", "compiler", "libjpeg_turbo", "lz4", "cpu_features", "nanobind"):
        assert info[key], key
    # What a target is compiled with, the CPU has (simd.h: one list per target).
    if "avx2" in TARGETS:
        assert {"avx2", "fma", "bmi", "bmi2", "f16c", "popcnt", "pclmul"} <= set(info["cpu_features"])


_SIMD_CHILD = r"""
import sys
import numpy as np
from tbljax import _core

def run():
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, (6, 37, 41, 3), dtype=np.uint8)
    idx = np.array([5, 0, 3, 3], np.int64)
    crop = np.array([[0, 0, 37, 41], [3, 4, 20, 30], [1, 2, 11, 13], [0, 5, 36, 30]], np.int32)
    out = np.empty((4, 29, 33, 3), np.float32)
    _core.gather(_core.RawSource([data]), idx, out, "NHWC", "float32", [0.485, 0.456, 0.406],
                 [0.229, 0.224, 0.225], crop, None)
    img = rng.integers(0, 256, (203, 317, 3), dtype=np.uint8)
    buf = rng.integers(0, 256, 80_000, dtype=np.uint8)
    crc = [_core.crc16_modbus(buf[o:o + n]) for n, o in ((76_800, 0), (79_999, 1), (100, 3))]
    return dict(gather=out, resize=_core.resize(img, 97, "center_crop"), crc=np.array(crc))

if __name__ == "__main__":
    np.savez(sys.argv[1], target=_core.kernel_target(), **run())
"""


def test_tbljax_simd_sets_the_one_target_of_kernel_resize_and_crc(tmp_path):
    # Each target forced the way users force it (TBLJAX_SIMD, in a fresh process), and here
    # (set_kernel_target): kernel, resize and CRC all follow it and give the same bytes.
    ns: dict = {}
    exec(_SIMD_CHILD, ns)
    _core.set_kernel_target("scalar")
    want = ns["run"]()
    for name in [*TARGETS, "auto"]:
        path = tmp_path / f"{name}.npz"
        env = dict(os.environ, TBLJAX_SIMD=name)
        subprocess.run([sys.executable, "-c", _SIMD_CHILD, str(path)], env=env, check=True, timeout=120)
        got = np.load(path)
        assert str(got["target"]) == (TARGETS[-1] if name == "auto" else name)
        if name != "auto":
            _core.set_kernel_target(name)
            here = ns["run"]()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")
            np.testing.assert_array_equal(here[key], want[key], err_msg=f"{name} {key}")


# ---------------------------------------------------------------------------------------------
# Constants and rules exported once from C++
# ---------------------------------------------------------------------------------------------


def test_constants():
    assert _core.MAX_SIDE == 2**16 - 1  # TBL stores width and height as u16
    assert _core.RESIZE_WEIGHT_BITS == 11  # kernel.h kResizeWeightBits
    assert _core.LAYOUTS == ("NHWC", "NCHW")
    assert _core.OUT_DTYPES == ("uint8", "float32", "bfloat16")


@pytest.mark.parametrize(
    "params",
    [IMAGENET, ((0.5, -0.25, 3.0), (0.1, 2.0, 1e-3)), ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))],
    ids=["imagenet", "odd", "unit"],
)
def test_normalize_table_is_the_contract(params):
    mean, std = params
    x = np.arange(256, dtype=np.uint8)[:, None].repeat(3, 1)[None]  # every value, each channel
    t32 = _core.normalize_table(list(mean), list(std), "float32")
    assert t32.dtype == np.float32 and t32.shape == (3, 256)
    np.testing.assert_array_equal(t32.T[None].view(np.uint32), normalize(x, mean, std, np.float32).view(np.uint32))
    t16 = _core.normalize_table(list(mean), list(std), "bfloat16")
    assert t16.dtype == np.uint16 and t16.shape == (3, 256)
    np.testing.assert_array_equal(t16.T[None], normalize(x, mean, std, ml_dtypes.bfloat16).view(np.uint16))
    # The kernel normalizes with this very table.
    out = np.empty((1, 1, 256, 3), np.uint16)
    _core.gather(
        _core.RawSource([x.reshape(1, 1, 256, 3)]),
        np.zeros(1, np.int64),
        out,
        "NHWC",
        "bfloat16",
        list(mean),
        list(std),
        None,
        None,
    )
    np.testing.assert_array_equal(out[0, 0].T, t16)


@pytest.mark.parametrize(
    "v", [0.0, -0.0, -2.0, -1e-20, -1234567.0, -1e16, -0.0001, -1.5e-05, -0.1, math.nan, math.inf, -math.inf]
)
def test_std_must_be_finite_and_positive_everywhere(v):
    # One rule, one message: the table, the checker and the kernel say the same, with the value
    # written as Python writes it.
    msg = f"std[1] = {v!r} must be a finite number > 0"
    std = [1.0, v, 1.0]
    for call in (
        lambda: _core.normalize_table([0, 0, 0], std, "float32"),
        lambda: _core.check_normalization([0, 0, 0], std),
        lambda: _core.gather(
            _core.RawSource([np.zeros((1, 2, 2, 3), np.uint8)]),
            np.zeros(1, np.int64),
            np.empty((1, 2, 2, 3), np.float32),
            "NHWC",
            "float32",
            [0, 0, 0],
            std,
            None,
            None,
        ),
    ):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == msg


def test_mean_must_be_finite_and_dtype_named():
    with pytest.raises(ValueError, match=r"^mean\[2\] = nan must be a finite number$"):
        _core.check_normalization([0, 0, math.nan], [1, 1, 1])
    _core.check_normalization([-3.0, 0.0, 1e6], [1e-3, 1.0, 1e6])
    with pytest.raises(ValueError, match="dtype='float16' is not one of: uint8, float32, bfloat16"):
        _core.normalize_table([0, 0, 0], [1, 1, 1], "float16")
    with pytest.raises(ValueError, match="dtype='uint8' is not normalized"):
        _core.normalize_table([0, 0, 0], [1, 1, 1], "uint8")


def test_the_xla_handler_refuses_a_negative_std():
    jnp = pytest.importorskip("jax.numpy")
    from tbljax import ops

    data = jnp.zeros((2, 3, 3, 3), jnp.uint8)
    with pytest.raises(Exception, match=r"std\[1\] = -2\.0 must be a finite number > 0"):
        ops.gather_normalize(
            data, jnp.array([0, 1]), mean=(0, 0, 0), std=(1, -2.0, 1), backend="ffi"
        ).block_until_ready()


def _gather_error(n, idx, crop, h=6, w=5):
    src = _core.RawSource([np.zeros((n, h, w, 3), np.uint8)])
    oh, ow = (2, 2) if crop is not None else (h, w)
    with pytest.raises((IndexError, ValueError)) as e:
        _core.gather(
            src,
            np.asarray(idx, np.int64),
            np.empty((len(idx), oh, ow, 3), np.uint8),
            "NHWC",
            "uint8",
            [0, 0, 0],
            [1, 1, 1],
            crop,
            None,
        )
    return e


def test_check_indices_is_the_kernels_check():
    _core.check_indices(np.array([0, 4, 2], np.int64), 5)
    _core.check_indices(np.zeros(0, np.int64), 0)
    with pytest.raises(IndexError) as e:
        _core.check_indices(np.array([0, 4, 7, -1], np.int64), 5)
    assert str(e.value) == ("indices[2] = 7 is out of range for a source of 5 records (allowed 0..4)")
    assert str(_gather_error(5, [0, 4, 7, -1], None).value) == str(e.value)
    with pytest.raises(TypeError):  # no silent conversion
        _core.check_indices(np.array([0, 1], np.int32), 5)


def test_check_crops_is_the_kernels_check():
    good = np.array([[0, 0, 6, 5], [1, 2, 5, 3]], np.int32)
    _core.check_crops(good, 6, 5)
    bad = np.array([[0, 0, 6, 5], [1, 2, 6, 3]], np.int32)  # row 1 runs past the bottom
    with pytest.raises(ValueError) as e:
        _core.check_crops(bad, 6, 5)
    assert str(e.value).startswith("crop[1] = (y0=1, x0=2, h=6, w=3) is not a non-empty box inside the 6x5 image")
    assert str(_gather_error(3, [0, 1], bad).value) == str(e.value)
    with pytest.raises(TypeError):
        _core.check_crops(bad.astype(np.int64), 6, 5)


# ---------------------------------------------------------------------------------------------
# The typed stub: generated at build (install, or dev build beside the sources), never drifts
# ---------------------------------------------------------------------------------------------

MAKE_STUB = Path(__file__).resolve().parents[1] / "ffi" / "python" / "make_stub.py"


def test_stub_matches_the_module(tmp_path):
    pkg = Path(_core.__file__).resolve().parent
    pyi = pkg / "_core.pyi"
    if not pyi.exists():
        pytest.skip(
            f"no generated stub beside the module ({pyi}): build with scripts/dev-build.sh or install the package"
        )
    nanobind = pytest.importorskip("nanobind", reason="stubgen ships with nanobind")
    built = _core.native_info()["nanobind"]
    if nanobind.__version__ != built:
        pytest.skip(
            f"nanobind {nanobind.__version__} here, {built} built the module: stubgen "
            "output may differ between versions"
        )
    out = tmp_path / "_core.pyi"
    # The build's own generator (CMakeLists.txt), over the module the tests import.
    subprocess.run([sys.executable, str(MAKE_STUB), str(pkg), "-o", str(out)], check=True, timeout=300)
    assert out.read_text() == pyi.read_text(), (
        f"{pyi} is not the stub of the module beside it: rebuild (scripts/dev-build.sh) or reinstall"
    )
