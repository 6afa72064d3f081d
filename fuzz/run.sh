#!/usr/bin/env bash
# Builds the libFuzzer harnesses against the core sources (clang, ASan + UBSan) and runs one.
# Usage: bash fuzz/run.sh {tbl|decode|box|kernel} [RUNS] [extra libFuzzer flags...]
#        bash fuzz/run.sh NAME 0 FILE...   replays inputs (e.g. a crash) once each
# Output: build/fuzz/ (binaries, corpus/NAME grown from generated seeds, artifacts/).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-}
runs=${2:-1000000}
shift $(( $# >= 2 ? 2 : 1 ))
case $name in
  tbl|decode|box|kernel) ;;
  *) echo "usage: bash fuzz/run.sh tbl|decode|box|kernel [RUNS] [libFuzzer flags]" >&2; exit 2 ;;
esac

cxx=${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}
[ -n "$cxx" ] || { echo "clang++ not found: apt-get install clang-14 libclang-rt-14-dev" >&2; exit 2; }
out=build/fuzz
mkdir -p "$out/artifacts"
# The whole core, as CMakeLists.txt builds it (every room's folder; libjpeg_static.cpp is a
# wheel's alone), each room's folder on the include path.
rooms=(platform file image jpeg serve)
core=()
incs=()
for room in "${rooms[@]}"; do
  for f in ffi/core/"$room"/*.cpp; do [ "$(basename "$f")" = libjpeg_static.cpp ] || core+=("$f"); done
  incs+=("-Iffi/core/$room")
done
# The kernel's bit-exact contract needs no FMA contraction, as in CMakeLists.txt.
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -ffp-contract=off "${incs[@]}" -DTBLJAX_VERSION='"fuzz"')
san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
libs=(-ljpeg -llz4 -lpthread)

build() {  # rebuild only when a source is newer than the binary
  local bin=$1; shift
  local newest
  newest=$(ls -t "$@" ffi/core/*/*.h ffi/core/*/*.inc 2>/dev/null | head -1)
  if [ ! -x "$bin" ] || [ "$newest" -nt "$bin" ]; then "$cxx" "${flags[@]}" "${san[@]}" "$@" "${libs[@]}" -o "$bin"; fi
}
build "$out/make_seeds" fuzz/make_seeds.cpp "${core[@]}"
san[0]=-fsanitize=fuzzer,address,undefined
build "$out/fuzz_$name" "fuzz/fuzz_$name.cpp" "${core[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if [ "$runs" = 0 ]; then exec "$out/fuzz_$name" "$@"; fi
seeds=$out/seeds
[ -d "$seeds/$name" ] || "$out/make_seeds" "$seeds"
mkdir -p "$out/corpus/$name"
# -max_len covers the largest seed (TBL files hold a 4 KiB-aligned payload region).
exec "$out/fuzz_$name" "$out/corpus/$name" "$seeds/$name" -runs="$runs" -max_len=20000 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix="$out/artifacts/$name-" -print_final_stats=1 "$@"
