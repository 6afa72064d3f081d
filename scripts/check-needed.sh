#!/usr/bin/env bash
# Every extension module in a wheel needs only the C and C++ runtimes (readelf -d, which reads
# the ELF of any architecture): no libjpeg, no liblz4, nothing else; and no text relocations.
# Usage: scripts/check-needed.sh WHEEL   (scripts/check-wheel.sh and build-manylinux.sh run it)
set -euo pipefail
wheel=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m zipfile -e "$wheel" "$tmp"
allowed='^(libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1)$'
modules=$(find "$tmp" -name "*.so")
[ -n "$modules" ] || { echo "check-needed: no extension module in $wheel" >&2; exit 1; }
for so in $modules; do
  needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  echo "check-needed: $(basename "$so") needs: $(echo $needed)"
  bad=$(echo "$needed" | grep -vE "$allowed" || true)
  [ -z "$bad" ] || { echo "check-needed: $(basename "$so") needs $bad" >&2; exit 1; }
  ! readelf -d "$so" | grep -q TEXTREL || { echo "check-needed: $(basename "$so") has text relocations" >&2; exit 1; }
done
