// Serving compact JPEG records (JPEG re-encoded at the converted geometry) in one pass: each
// sample's record is decoded in a pool thread, only the part its crop box needs
// (DecodeJpegBox), and that part goes at once through the serve kernel (a SampleKernel
// prepared once for the batch, the box shifted into the part) while it is still in cache. So
// a compact file serves exactly the pixels of the RAW file decoded from it.
#pragma once
#include <cstdint>
#include <vector>

#include "kernel.h"  // GatherRequest, RawShard
#include "status.h"

namespace tbljax {

class ThreadPool;

// N JPEG records spread over one or more shards (file mappings), read as one sequence: record
// i is sizes[i] bytes at byte offsets[i] of its shard, heights[i] x widths[i] pixels once
// decoded (what the index says). Where stored_raw (may be null) is nonzero, record i is its
// pixels instead, stored RAW (heights[i] * widths[i] * 3 bytes, rows of RGB): a compact file
// converted with a raw budget keeps the records costliest to decode that way. Does not own
// the memory or the tables.
class JpegSource {
 public:
  JpegSource() = default;
  // Checks that every record lies inside its shard and has sides >= 1, and that a RAW record's
  // size is its pixels' (O(N), once).
  static Status Create(std::vector<RawShard> shards, const int64_t* offsets, const int64_t* sizes,
                       const int32_t* heights, const int32_t* widths, const uint8_t* stored_raw,
                       JpegSource* out);
  int64_t num_records() const { return num_records_; }
  const uint8_t* Data(int64_t i) const;
  int64_t Size(int64_t i) const { return sizes_[i]; }
  int32_t Height(int64_t i) const { return heights_[i]; }
  int32_t Width(int64_t i) const { return widths_[i]; }
  bool StoredRaw(int64_t i) const { return stored_raw_ != nullptr && stored_raw_[i] != 0; }

 private:
  std::vector<RawShard> shards_;
  std::vector<int64_t> starts_;  // first record index of each shard, plus num_records_
  const int64_t* offsets_ = nullptr;
  const int64_t* sizes_ = nullptr;
  const int32_t* heights_ = nullptr;
  const int32_t* widths_ = nullptr;
  const uint8_t* stored_raw_ = nullptr;
  int64_t num_records_ = 0;
};

struct JpegServeOptions {
  // Decode at 1/2, 1/4 or 1/8 by libjpeg's scaled IDCT where ChooseDctScale allows (the box
  // at that scale still covers the output by kDctScaleMinRatio on both axes), then resize
  // from there: faster, and not bit-identical to the exact path.
  bool dct_scale = false;
};

// Serves request (the Gather contract: indices, crops -- null means the whole record, which
// then must have the output size --, flips, normalization, dtype, layout, out) from compact
// JPEG records, over the pool (ThreadPool::Default() when null). Everything but the pixels is
// checked before `out` is touched. A record that fails to decode fails the call with its
// status (DecodeError, or Corrupt when it is not the size the index says); *failed_row (when
// not null) is then a failing batch row (the lowest seen), -1 otherwise, and the rows of `out` are
// unspecified.
Status ServeJpeg(const JpegSource& source, const GatherRequest& request,
                 const JpegServeOptions& options, ThreadPool* pool = nullptr,
                 int64_t* failed_row = nullptr);

// Serves `groups` requests over the same n records, each record read and decoded once for all
// of them (views=, multi-crop): request g's rows are the records each repeated counts[g]
// times, record-major (row i * counts[g] + k: record i's view k; every request's indices say
// so, checked). A record's views' boxes are decoded as one region, their union, at scale 1,
// whose bytes are a whole-image decode's: each row gets exactly the bytes ServeJpeg (without
// dct_scale) gives it. On a failure *failed_record (when not null) is the lowest failing
// record's position i, -1 otherwise.
Status ServeJpegViews(const JpegSource& source, const GatherRequest* requests,
                      const int64_t* counts, int64_t groups, ThreadPool* pool = nullptr,
                      int64_t* failed_record = nullptr);

}  // namespace tbljax
