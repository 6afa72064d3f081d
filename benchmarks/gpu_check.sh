#!/usr/bin/env bash
# The GPU check of tbljax.ops, for a session lent an NVIDIA GPU (the H200 machine: jax 0.11.2
# with its CUDA 13 plugin, nvcc 13, cmake, ninja, nanobind, pytest): builds with
# -DTBLJAX_CUDA=ON, runs tests/test_ops_cuda.py with TBLJAX_REQUIRE_CUDA=1 (a skip is a
# failure), then a short GPU benchmark. Under 9 minutes in all; every step has a timeout.
# Results go to $OUT when set (else build/gpu_check): summary.txt, env.txt, build.log,
# tests.txt, bench.md. Exit status: 0 only if the build and every GPU test passed.
#
# That machine reaches no network. If its image has no libjpeg / liblz4 headers, carry
# Debian's packages (their static libraries link into the modules). Here, once:
#   mkdir -p .gpu_deps && (cd .gpu_deps && apt-get download libjpeg62-turbo-dev liblz4-dev)
#   echo /.gpu_deps/ >> .git/info/exclude
# then run with carry [".gpu_deps"]:  bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
status=0
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
: >"$OUT/summary.txt"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  nvcc --version 2>&1 | tail -1
  "$PY" -c 'import sys, jax, jaxlib; print(sys.version.split()[0], "jax", jax.__version__,
"jaxlib", jaxlib.__version__, jax.devices())' 2>&1
} >"$OUT/env.txt"
note "env: $(tr '\n' ' ' <"$OUT/env.txt" | cut -c1-400)"

# ---- build (CUDA on, Hopper only: the fastest compile for this check) ----
extra=()
have_header() { echo "#include <$1>" | ${CXX:-c++} -E -x c++ - >/dev/null 2>&1; }
if ! have_header jpeglib.h || ! have_header lz4.h; then
  if compgen -G ".gpu_deps/*.deb" >/dev/null; then
    deps=/tmp/tbljax_deps
    for f in .gpu_deps/*.deb; do dpkg -x "$f" "$deps"; done
    lib=$deps/usr/lib/x86_64-linux-gnu
    extra=(-DJPEG_INCLUDE_DIR="$deps/usr/include" -DJPEG_LIBRARY="$lib/libjpeg.a"
           -DLZ4_INCLUDE_DIR="$deps/usr/include" -DLZ4_LIBRARY="$lib/liblz4.a"
           -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include -isystem $deps/usr/include/x86_64-linux-gnu")
    note "build: libjpeg/liblz4 headers missing; using the carried .gpu_deps packages"
  else
    note "build: libjpeg/liblz4 headers missing and no .gpu_deps carried (see this script's header)"
  fi
fi
rm -f src/tbljax/_core*.so src/tbljax/_ffi_cuda*.so
t0=$(date +%s)
if PYTHON=$(command -v "$PY") timeout 150 scripts/dev-build.sh -DTBLJAX_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 "${extra[@]}" >"$OUT/build.log" 2>&1; then
  note "build: ok in $(( $(date +%s) - t0 )) s ($(ls src/tbljax/*.so | xargs -n1 basename | tr '\n' ' '))"
else
  note "build: FAILED after $(( $(date +%s) - t0 )) s; last lines:"
  tail -25 "$OUT/build.log" | tee -a "$OUT/summary.txt"
  exit 1
fi

# ---- the GPU tests: no skips allowed ----
TBLJAX_REQUIRE_CUDA=1 PYTHONPATH=src timeout 180 "$PY" -m pytest tests/test_ops_cuda.py -q \
  -p no:cacheprovider >"$OUT/tests.txt" 2>&1
rc=$?
note "gpu tests: exit $rc: $(tail -1 "$OUT/tests.txt")"
[ $rc -eq 0 ] || { status=1; tail -40 "$OUT/tests.txt" >>"$OUT/summary.txt"; }
# The CPU suite of the same module, as a cross-check on this machine's jax version.
PYTHONPATH=src JAX_PLATFORMS=cpu timeout 60 "$PY" -m pytest tests/test_ops.py -q \
  -p no:cacheprovider >"$OUT/tests_cpu.txt" 2>&1
rc=$?
note "cpu tests (tests/test_ops.py on this machine's jax): exit $rc: $(tail -1 "$OUT/tests_cpu.txt")"

# ---- a short GPU benchmark: batches of 256 at 160 px, one round of 5 passes per path (the
# per-round lines land in bench.err as they come). Worst case of all steps: 150 + 180 + 60 +
# 150 s = 9 minutes. ----
PYTHONPATH=src timeout 150 "$PY" benchmarks/bench_ops.py --rounds 1 --steps 10 --batch 256 \
  --augment rrc_flip >"$OUT/bench.md" 2>"$OUT/bench.err"
rc=$?
note "bench: exit $rc"
grep '^|' "$OUT/bench.md" >>"$OUT/summary.txt"
exit $status
