#!/usr/bin/env bash
# Developer build: compiles the native modules into src/tbljax/ so `PYTHONPATH=src pytest` tests the
# working tree without installing. Usage: scripts/dev-build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-$(command -v python)}
# Absolute, not resolved: CMake's FindPython takes a relative path for another interpreter
# (the one behind a venv's symlink), which has neither jax nor nanobind.
py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" "$@" >/dev/null
cmake --build build/dev
