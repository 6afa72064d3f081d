// LZ4 blocks of a field's values: see lz4_blocks.h.
#include "lz4_blocks.h"

#include <lz4.h>

#include <atomic>
#include <string>

namespace tbljax::tbl {

Status Lz4CompressBlock(const uint8_t* src, int64_t n, std::vector<uint8_t>* out) {
  if (n < 0 || n > LZ4_MAX_INPUT_SIZE)
    return InvalidArgument("an LZ4 block holds at most " + std::to_string(LZ4_MAX_INPUT_SIZE) +
                           " bytes, got " + std::to_string(n));
  out->resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(n))));
  int c =
      LZ4_compress_default(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(out->data()),
                           static_cast<int>(n), static_cast<int>(out->size()));
  if (c <= 0) return InvalidArgument("LZ4_compress_default failed");
  out->resize(static_cast<size_t>(c));
  return Status();
}

int64_t Lz4DecodeBlocks(const uint8_t* src, int64_t src_size, const int64_t* begin,
                        const int64_t* end, int64_t n, uint8_t* dst, const int64_t* dst_off,
                        ThreadPool* pool) {
  std::atomic<int64_t> bad{n};  // the lowest failing row, n: none
  auto one = [&](int64_t b) {
    const int64_t lo = begin[b], hi = end[b], want = dst_off[b + 1] - dst_off[b];
    bool ok = lo >= 0 && lo <= hi && hi <= src_size && hi - lo <= LZ4_MAX_INPUT_SIZE && want >= 0 &&
              want <= LZ4_MAX_INPUT_SIZE;
    if (ok && want > 0) {
      int got = LZ4_decompress_safe(reinterpret_cast<const char*>(src + lo),
                                    reinterpret_cast<char*>(dst + dst_off[b]),
                                    static_cast<int>(hi - lo), static_cast<int>(want));
      ok = got == want;
    } else if (ok) {
      ok = hi == lo || (hi - lo == 1 && src[lo] == 0);  // an empty record: LZ4's one-byte block
    }
    if (!ok) {
      int64_t cur = bad.load();
      while (b < cur && !bad.compare_exchange_weak(cur, b)) {
      }
    }
  };
  if (pool == nullptr || n < 2)
    for (int64_t b = 0; b < n; ++b) one(b);
  else pool->ParallelFor(n, one);
  return bad.load() == n ? -1 : bad.load();
}

}  // namespace tbljax::tbl
