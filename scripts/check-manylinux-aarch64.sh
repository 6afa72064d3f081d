#!/usr/bin/env bash
# The aarch64 wheel proved under emulation (qemu-user-static): Debian's arm64 CPython 3.11,
# unpacked into a sysroot, with the wheel and numpy/jax/jaxlib/ml_dtypes/pillow/pytest wheels for
# manylinux aarch64 installed into a folder of their own. Under qemu the wheel imports and names
# its SIMD targets, converts 16 real photos (16 seeded synthetic images where PHOTOS has none),
# serves a batch from RAW and from JPEG records and runs
# the in-jit op (scripts/manylinux/batch_bytes.py), byte for byte equal to the x86-64 wheel's on
# this machine; then the kernel tests (every SIMD target the CPU has: on aarch64, scalar) run there.
# Usage: scripts/check-manylinux-aarch64.sh   (after scripts/build-manylinux.sh; PYTHON=... the
# host's CPython 3.11; PHOTOS=... a folder of JPEGs, default ../shared/data/kodak).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
photos=${PHOTOS:-$root/../shared/data/kodak}
out=$root/build/manylinux
a=$out/aarch64/emulated
arm_wheel=$(ls "$out"/wheelhouse/tbljax-*-manylinux_2_28_aarch64.whl)
x86_wheel=$(ls "$out"/wheelhouse/tbljax-*-manylinux_2_28_x86_64.whl)
log() { echo "check-aarch64: $*"; }
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v qemu-aarch64-static >/dev/null; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq qemu-user-static >/dev/null
fi
dpkg --print-foreign-architectures | grep -qx arm64 || { $sudo dpkg --add-architecture arm64 && $sudo apt-get update -qq; }

# Debian's arm64 CPython and the libraries it (and jaxlib: libstdc++) loads, unpacked, not installed.
sysroot=$a/sysroot
if [ ! -x "$sysroot/usr/bin/python3.11" ]; then
  rm -rf "$a/debs" "$sysroot" && mkdir -p "$a/debs" "$sysroot"
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances python3.11-minimal:arm64 libpython3.11-stdlib:arm64 libstdc++6:arm64 |
         grep -E '^[a-z0-9.+-]+:arm64$' | grep -vE '^(dpkg|tar|install-info|perl.*):' | sort -u)
  (cd "$a/debs" && apt-get download -qq $pkgs >/dev/null)
  for deb in "$a"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
fi
qpy=(qemu-aarch64-static -L "$sysroot" "$sysroot/usr/bin/python3.11")

# The aarch64 wheel and its dependencies' aarch64 wheels, from the index by pip on this machine.
site=$a/site
if [ ! -d "$site/numpy" ] || [ "$arm_wheel" -nt "$site" ]; then
  rm -rf "$site"
  "$py" -m pip install -q --target "$site" $(for g in 28 27 26 24 17; do echo --platform manylinux_2_${g}_aarch64; done) \
    --platform manylinux2014_aarch64 --python-version 3.11 \
    --implementation cp --only-binary=:all: "$arm_wheel" pillow pytest
fi

# The same script on the x86-64 wheel (a fresh venv) and on the aarch64 wheel (qemu).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$x86_wheel"
cp scripts/manylinux/batch_bytes.py "$work/"
start=$SECONDS
(cd "$work" && JAX_PLATFORMS=cpu "$work/venv/bin/python" batch_bytes.py "$photos" "$work/x86_64")
(cd "$work" && JAX_PLATFORMS=cpu PYTHONPATH=$site "${qpy[@]}" batch_bytes.py "$photos" "$work/aarch64")
log "batch_bytes under qemu in $((SECONDS - start)) s"
n=0
for f in "$work"/x86_64/out/*.npy; do
  cmp "$f" "$work/aarch64/out/$(basename "$f")" || { echo "check-aarch64: $(basename "$f") differs" >&2; exit 1; }
  n=$((n + 1))
done
[ "$n" -ge 6 ] || { echo "check-aarch64: only $n results to compare" >&2; exit 1; }
log "the aarch64 wheel's $n results equal the x86-64 wheel's byte for byte"

# The kernel tests under qemu, against the installed wheel (tests/ only, no src/ on the path).
cp -r tests pyproject.toml "$work/"
start=$SECONDS
# Two of them start sys.executable as a child process, which only a binfmt_misc registration
# would hand to qemu (a container has none): they run on x86-64 only.
(cd "$work" && JAX_PLATFORMS=cpu PYTHONPATH=$site "${qpy[@]}" -m pytest -q -p no:cacheprovider tests/test_kernel.py \
   --deselect tests/test_kernel.py::test_forced_scalar_process_matches_dispatched \
   --deselect tests/test_kernel.py::test_target_reporting_and_env_errors)
log "tests/test_kernel.py under qemu in $((SECONDS - start)) s"
