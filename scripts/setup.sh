#!/usr/bin/env bash
# One-step set-up on a fresh Debian/Ubuntu machine: system libraries (libjpeg-turbo, liblz4,
# a C++ compiler), a virtual environment in .venv, and tbljax built and installed into it with
# its test extras. Safe to run again: it skips what is already there and rebuilds tbljax.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
[ -f /usr/include/jpeglib.h ] || need_pkgs+=(libjpeg-dev)
[ -f /usr/include/lz4.h ] || need_pkgs+=(liblz4-dev)
command -v g++ >/dev/null || need_pkgs+=(g++)
python3 -c "import venv, ensurepip" 2>/dev/null || need_pkgs+=(python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${need_pkgs[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "tbljax needs Python >= 3.11"'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
echo "setup: building and installing tbljax into .venv (first build takes a few minutes)"
.venv/bin/python -m pip install -q ".[test]"
(cd / && "$OLDPWD"/.venv/bin/python -c "import tbljax, json; print('setup: ok', json.dumps(tbljax.build_info()))")
