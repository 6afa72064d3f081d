// LZ4 blocks of a field's values (Mask / DenseMap compress="lz4", issue 48): each record's
// bytes one LZ4 block, back to back in the field's values block; decoded row by row in parallel.
#pragma once
#include <cstdint>
#include <vector>

#include "status.h"
#include "thread_pool.h"

namespace tbljax::tbl {

// `n` bytes of src as one LZ4 block into *out (resized to the block's size).
Status Lz4CompressBlock(const uint8_t* src, int64_t n, std::vector<uint8_t>* out);

// Row b's block src[begin[b], end[b]) decompressed to exactly dst_off[b + 1] - dst_off[b]
// bytes at dst + dst_off[b], rows spread over `pool`. Returns the first row whose block does
// not decompress to its declared size (or lies outside src), -1 when every row did.
int64_t Lz4DecodeBlocks(const uint8_t* src, int64_t src_size, const int64_t* begin,
                        const int64_t* end, int64_t n, uint8_t* dst, const int64_t* dst_off,
                        ThreadPool* pool);

}  // namespace tbljax::tbl
