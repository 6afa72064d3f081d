#!/usr/bin/env bash
# Style checks; exits non-zero on the first check that fails. Usage: scripts/lint.sh
#   Python: ruff format --check and ruff check with ruff.toml (ruff comes with the test extra;
#   PYTHON picks the interpreter, default .venv/bin/python). To fix what they report:
#   ruff format src tests benchmarks examples scripts && ruff check --select I --fix (same paths).
#   C++ / CUDA: clang-format --dry-run --Werror over ffi/ and fuzz/ with the repository's
#   .clang-format (written for clang-format 14, Debian 12's package "clang-format"; installed
#   with apt-get when missing). To fix what it reports: clang-format -i FILE...
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- Python (ruff) ----
py=${PYTHON:-.venv/bin/python}
"$py" -m ruff format --check --no-cache src tests benchmarks examples scripts
"$py" -m ruff check --no-cache src tests benchmarks examples scripts
echo "lint: ruff: formatted and clean ($("$py" -m ruff --version))"

# ---- C++ / CUDA (clang-format) ----
if ! command -v clang-format >/dev/null; then
  echo "lint: installing clang-format (apt-get)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang-format >/dev/null
fi
version=$(clang-format --version)
case $version in
  *" 14."*) ;;
  *) echo "lint: note: .clang-format was written for clang-format 14; this is: $version" >&2 ;;
esac
# Tracked files and new ones not yet added (ignored ones are not ours).
mapfile -t cxx < <(git ls-files --cached --others --exclude-standard \
                     'ffi/*.h' 'ffi/*.cpp' 'ffi/*.inc' 'ffi/*.cu' 'fuzz/*.h' 'fuzz/*.cpp')
clang-format --dry-run --Werror "${cxx[@]}"
echo "lint: clang-format: ${#cxx[@]} files clean ($version)"
