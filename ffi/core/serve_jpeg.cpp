// Compact JPEG records served in one pass (see serve_jpeg.h): decode the box's part of each
// record in a pool thread, then run the serve kernel on it in that same thread.
#include "serve_jpeg.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "contract.h"
#include "decode.h"
#include "thread_pool.h"

namespace tbljax {

Status JpegSource::Create(std::vector<RawShard> shards, const int64_t* offsets,
                          const int64_t* sizes, const int32_t* heights, const int32_t* widths,
                          JpegSource* out) {
  if (shards.empty()) return InvalidArgument("a JpegSource needs at least one shard");
  JpegSource s;
  for (size_t k = 0; k < shards.size(); ++k) {
    const RawShard& sh = shards[k];
    if (sh.num_records < 0 || sh.bytes < 0)
      return InvalidArgument("shard " + std::to_string(k) + " has a negative size");
    if (sh.num_records > 0 && (sh.data == nullptr || !offsets || !sizes || !heights || !widths))
      return InvalidArgument("shard " + std::to_string(k) + " has records but no data or table");
    for (int64_t i = s.num_records_; i < s.num_records_ + sh.num_records; ++i) {
      if (heights[i] < 1 || widths[i] < 1 || sizes[i] < 0 || offsets[i] < 0 ||
          offsets[i] > sh.bytes || sizes[i] > sh.bytes - offsets[i])
        return Corrupt("record " + std::to_string(i) + " (" + std::to_string(sizes[i]) +
                       " bytes at byte " + std::to_string(offsets[i]) + ", " +
                       std::to_string(heights[i]) + "x" + std::to_string(widths[i]) +
                       " pixels) does not lie inside its shard of " + std::to_string(sh.bytes) +
                       " bytes");
    }
    s.starts_.push_back(s.num_records_);
    s.num_records_ += sh.num_records;
  }
  s.starts_.push_back(s.num_records_);
  s.shards_ = std::move(shards);
  s.offsets_ = offsets;
  s.sizes_ = sizes;
  s.heights_ = heights;
  s.widths_ = widths;
  *out = std::move(s);
  return Status::Ok();
}

const uint8_t* JpegSource::Data(int64_t i) const {
  // The last shard whose first record is <= i; empty shards share a start and are skipped.
  const auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, i);
  return shards_[static_cast<size_t>(it - starts_.begin()) - 1].data + offsets_[i];
}

namespace {

// Everything ServeJpeg checks before touching `out`; *oh, *ow: the output size.
Status CheckRequest(const JpegSource& src, const GatherRequest& r, int64_t* oh, int64_t* ow) {
  if (r.batch < 0)
    return InvalidArgument("batch size must be >= 0, got " + std::to_string(r.batch));
  if (r.batch > 0 && (r.indices == nullptr || r.out == nullptr))
    return InvalidArgument("indices or out is null");
  const bool nchw = r.layout == Layout::kNCHW;
  const int64_t* s = r.out_shape;
  const int64_t ch = nchw ? s[1] : s[3];
  *oh = nchw ? s[2] : s[1];
  *ow = nchw ? s[3] : s[2];
  if (ch != 3 || *oh < 1 || *ow < 1 || s[0] != r.batch)
    return InvalidArgument(std::string("out must have shape ") +
                           (nchw ? "(B, 3, OH, OW)" : "(B, OH, OW, 3)") +
                           " with B = " + std::to_string(r.batch) + " and OH, OW >= 1 for layout " +
                           LayoutName(r.layout));
  const int64_t elem = OutDTypeBytes(r.dtype);
  if (elem == 0)
    return InvalidArgument("unknown output dtype " + std::to_string(static_cast<int>(r.dtype)));
  if (reinterpret_cast<uintptr_t>(r.out) % static_cast<uintptr_t>(elem) != 0)
    return InvalidArgument("out is not aligned to its element size");
  if (r.dtype != OutDType::kUint8) TBLJAX_RETURN_IF_ERROR(CheckNormalization(r.mean, r.std));
  TBLJAX_RETURN_IF_ERROR(CheckIndices(r.indices, r.batch, src.num_records()));
  for (int64_t b = 0; b < r.batch; ++b) {
    const int64_t i = r.indices[b], h = src.Height(i), w = src.Width(i);
    if (r.crops != nullptr) {
      TBLJAX_RETURN_IF_ERROR(CheckCropBox(b, r.crops + 4 * b, h, w, *oh, *ow));
    } else {
      TBLJAX_RETURN_IF_ERROR(CheckOutputSize(false, *oh, *ow, h, w));
    }
  }
  return Status::Ok();
}

// The first failure of a batch (lowest row), kept under a lock: failures are rare.
struct FirstFailure {
  std::mutex mu;
  int64_t row = -1;
  Status status;
  void Note(int64_t b, Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (row < 0 || b < row) {
      row = b;
      status = std::move(s);
    }
  }
};

// One sample: decode its box's part, then the kernel over that part, inline in this thread.
Status ServeOne(const JpegSource& src, const GatherRequest& r, const JpegServeOptions& o, int64_t b,
                int64_t oh, int64_t ow) {
  const int64_t i = r.indices[b];
  JpegBoxRequest q;
  if (r.crops != nullptr) {
    std::copy(r.crops + 4 * b, r.crops + 4 * b + 4, q.box);
  } else {
    q.box[2] = src.Height(i);
    q.box[3] = src.Width(i);
  }
  q.out_h = static_cast<int>(oh);
  q.out_w = static_cast<int>(ow);
  q.dct_scale = o.dct_scale;
  q.expect_h = src.Height(i);
  q.expect_w = src.Width(i);
  thread_local JpegBoxScratch scratch;
  JpegBoxRegion region;
  TBLJAX_RETURN_IF_ERROR(
      DecodeJpegBox(src.Data(i), static_cast<size_t>(src.Size(i)), q, &scratch, &region));
  RawSource one;
  TBLJAX_RETURN_IF_ERROR(
      RawSource::Create({RawShard{region.pixels, 1}}, region.height, region.width, &one));
  GatherRequest g = r;
  const int64_t zero = 0;
  g.indices = &zero;
  g.batch = 1;
  g.crops = region.box;
  g.flips = r.flips != nullptr ? r.flips + b : nullptr;
  const int64_t sample_bytes = oh * ow * 3 * OutDTypeBytes(r.dtype);
  g.out = static_cast<uint8_t*>(r.out) + b * sample_bytes;
  g.out_shape[0] = 1;
  // A pool of one runs the kernel inline: this thread already is one of the pool's.
  thread_local ThreadPool inline_pool(1);
  Status s = Gather(one, g, &inline_pool);
  // A huge record should not pin its buffers in every pool thread for ever.
  constexpr size_t kKeep = size_t{32} << 20;
  if (scratch.pixels.capacity() > kKeep) scratch = JpegBoxScratch();
  return s;
}

}  // namespace

Status ServeJpeg(const JpegSource& src, const GatherRequest& r, const JpegServeOptions& o,
                 ThreadPool* pool, int64_t* failed_row) {
  if (failed_row != nullptr) *failed_row = -1;
  int64_t oh = 0, ow = 0;
  TBLJAX_RETURN_IF_ERROR(CheckRequest(src, r, &oh, &ow));
  if (r.batch == 0) return Status::Ok();
  if (pool == nullptr) {
    try {
      pool = &ThreadPool::Default();
    } catch (const std::exception& e) {
      return IOError(std::string("could not start the kernel's thread pool: ") + e.what());
    }
  }
  FirstFailure failure;
  std::atomic<bool> failed{false};
  pool->ParallelFor(r.batch, [&](int64_t b) {
    if (failed.load(std::memory_order_relaxed)) return;  // the batch fails anyway
    Status s = ServeOne(src, r, o, b, oh, ow);
    if (!s.ok()) {
      failed.store(true, std::memory_order_relaxed);
      failure.Note(b, std::move(s));
    }
  });
  if (failure.row < 0) return Status::Ok();
  if (failed_row != nullptr) *failed_row = failure.row;
  return failure.status;
}

}  // namespace tbljax
