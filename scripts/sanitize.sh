#!/usr/bin/env bash
# Builds the native core and the nanobind module with AddressSanitizer + UndefinedBehaviorSanitizer
# and runs the format, decode (restart parts and our entropy decoder included), kernel and
# hostile-input tests against that build.
# Usage: scripts/sanitize.sh [extra pytest args]    (PYTHON=... to pick the interpreter)
# The sanitized module lives in build/sanitize/ with a copy of the Python package beside it;
# the developer build in src/tbljax/ is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-$(command -v python)}
py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")  # absolute: the tests run from build/
out=build/sanitize
# Build tools into the interpreter's environment when missing (CI's .venv has only the wheel).
"$py" -c "import nanobind" 2>/dev/null || "$py" -m pip install -q "nanobind>=2.4"
command -v cmake >/dev/null && command -v ninja >/dev/null || "$py" -m pip install -q cmake ninja
export PATH=$(dirname "$py"):$PATH
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"

# SKBUILD=ON keeps CMakeLists.txt from writing the module into the source tree.
cmake -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$py" \
  -DSKBUILD=ON -DSKBUILD_PROJECT_VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)" \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$out" --target _core

# The package as tests import it: this tree's Python files and the sanitized module.
pkg=$out/pkg/tbljax
rm -rf "$out/pkg" && mkdir -p "$pkg"
(cd src/tbljax && find . -name "*.py" -exec cp --parents {} "$root/$pkg/" \;)
cp "$out"/_core*.so "$pkg/"

# ASan must be loaded before anything else in the process, so it is preloaded into Python;
# libstdc++ with it, or ASan's C++ exception interceptor finds no __cxa_throw to forward to
# (python itself does not link libstdc++). CPython frees nothing at exit on purpose: leak
# detection would only report that.
libasan=$(${CXX:-c++} -print-file-name=libasan.so)
libstdcxx=$(${CXX:-c++} -print-file-name=libstdc++.so)
[ -f "$libasan" ] || { echo "libasan.so not found (install the compiler's ASan runtime)" >&2; exit 2; }
export LD_PRELOAD="$libasan $libstdcxx"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONPATH=$root/$out/pkg
cd "$out"  # not the repository root: `import tbljax` must find the sanitized package
exec "$py" -m pytest -q -p no:cacheprovider --rootdir "$root" -c "$root/pyproject.toml" \
  "$root/tests/test_format.py" "$root/tests/test_decode.py" "$root/tests/test_kernel.py" \
  "$root/tests/test_hostile.py" "$root/tests/test_hardening.py" \
  "$root/tests/test_restart_decode.py" "$root/tests/test_jpeg_entropy.py" "$root/tests/test_kernel_ops.py" \
  -k "not 1000" "$@"
