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
                          const uint8_t* stored_raw, JpegSource* out) {
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
      if (stored_raw != nullptr && stored_raw[i] != 0 &&
          sizes[i] != int64_t{heights[i]} * widths[i] * 3)
        return Corrupt("record " + std::to_string(i) + " is stored RAW but its " +
                       std::to_string(sizes[i]) + " bytes are not " + std::to_string(heights[i]) +
                       "x" + std::to_string(widths[i]) + "x3 pixels");
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
  s.stored_raw_ = stored_raw;
  *out = std::move(s);
  return Status::Ok();
}

const uint8_t* JpegSource::Data(int64_t i) const {
  // The last shard whose first record is <= i; empty shards share a start and are skipped.
  const auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, i);
  return shards_[static_cast<size_t>(it - starts_.begin()) - 1].data + offsets_[i];
}

namespace {

// What ServeJpeg checks about the records before touching `out` (SampleKernel::Prepare checks
// the output): indices, and each sample's box against its record (or, without boxes, the
// record's size against the output's).
Status CheckRecords(const JpegSource& src, const GatherRequest& r, int64_t oh, int64_t ow) {
  if (r.batch > 0 && r.indices == nullptr) return InvalidArgument("indices is null");
  TBLJAX_RETURN_IF_ERROR(CheckIndices(r.indices, r.batch, src.num_records()));
  for (int64_t b = 0; b < r.batch; ++b) {
    const int64_t i = r.indices[b], h = src.Height(i), w = src.Width(i);
    int64_t sh, sw;  // the sample's output size (its own under patches)
    SampleOutSize(r, b, oh, ow, &sh, &sw);
    if (r.crops != nullptr) {
      TBLJAX_RETURN_IF_ERROR(CheckCropBox(b, r.crops + 4 * b, h, w, sh, sw));
    } else {
      TBLJAX_RETURN_IF_ERROR(CheckOutputSize(false, oh, ow, h, w));
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

// One sample: decode its box's part, then the kernel over that part, in this thread. A record
// stored RAW goes to the kernel as it lies in the mapping.
Status ServeOne(const JpegSource& src, const GatherRequest& r, const JpegServeOptions& o,
                const SampleKernel& kernel, int64_t b) {
  const int64_t i = r.indices[b];
  // The box: the sample's crop, or (no crops) the whole record.
  int32_t box[4] = {0, 0, src.Height(i), src.Width(i)};
  if (r.crops != nullptr) std::copy(r.crops + 4 * b, r.crops + 4 * b + 4, box);
  if (src.StoredRaw(i)) {
    SamplePixels px;
    px.pixels = src.Data(i);
    px.height = src.Height(i);
    px.width = src.Width(i);
    px.y0 = box[0];
    px.x0 = box[1];
    px.h = box[2];
    px.w = box[3];
    return kernel.Run(b, px);
  }
  JpegBoxRequest q;
  std::copy(box, box + 4, q.box);
  q.out_h = static_cast<int>(kernel.out_h(b));
  q.out_w = static_cast<int>(kernel.out_w(b));
  q.dct_scale = o.dct_scale;
  q.expect_h = src.Height(i);
  q.expect_w = src.Width(i);
  thread_local JpegBoxScratch scratch;
  JpegBoxRegion region;
  Status s = DecodeJpegBox(src.Data(i), static_cast<size_t>(src.Size(i)), q, &scratch, &region);
  if (s.ok()) {
    SamplePixels px;
    px.pixels = region.pixels;
    px.height = region.height;
    px.width = region.width;
    px.stride = region.stride;
    px.y0 = region.box[0];
    px.x0 = region.box[1];
    px.h = region.box[2];
    px.w = region.box[3];
    s = kernel.Run(b, px);
  }
  // A huge record should not pin its buffers in every pool thread for ever.
  constexpr size_t kKeep = size_t{32} << 20;
  if (scratch.pixels.capacity() > kKeep || scratch.part.capacity() > kKeep ||
      scratch.planes.capacity() > kKeep)
    scratch = JpegBoxScratch();
  return s;
}

// Record i's views over every group (ServeJpegViews): the union of their boxes decoded once,
// then each view's box, shifted into that region, through its group's kernel.
Status ServeViewsOne(const JpegSource& src, const GatherRequest* r, const int64_t* counts,
                     int64_t groups, const std::vector<SampleKernel>& kernels, int64_t i) {
  const int64_t rec = r[0].indices[i * counts[0]], rh = src.Height(rec), rw = src.Width(rec);
  int64_t y0 = rh, x0 = rw, y1 = 0, x1 = 0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t k = 0; k < counts[g]; ++k) {
      const int32_t* c = r[g].crops ? r[g].crops + 4 * (i * counts[g] + k) : nullptr;
      const int64_t by = c ? c[0] : 0, bx = c ? c[1] : 0, bh = c ? c[2] : rh, bw = c ? c[3] : rw;
      y0 = std::min(y0, by);
      x0 = std::min(x0, bx);
      y1 = std::max(y1, by + bh);
      x1 = std::max(x1, bx + bw);
    }
  }
  SamplePixels base;       // the record (stored RAW) or the decoded region of the union
  int64_t oy = 0, ox = 0;  // a record position minus (oy, ox) is the position in base
  thread_local JpegBoxScratch scratch;
  if (src.StoredRaw(rec)) {
    base.pixels = src.Data(rec);
    base.height = rh;
    base.width = rw;
  } else {
    JpegBoxRequest q;
    q.box[0] = static_cast<int32_t>(y0);
    q.box[1] = static_cast<int32_t>(x0);
    q.box[2] = static_cast<int32_t>(y1 - y0);
    q.box[3] = static_cast<int32_t>(x1 - x0);
    q.out_h = q.box[2];
    q.out_w = q.box[3];
    q.expect_h = static_cast<int>(rh);
    q.expect_w = static_cast<int>(rw);
    JpegBoxRegion region;
    TBLJAX_RETURN_IF_ERROR(
        DecodeJpegBox(src.Data(rec), static_cast<size_t>(src.Size(rec)), q, &scratch, &region));
    base.pixels = region.pixels;
    base.height = region.height;
    base.width = region.width;
    base.stride = region.stride;
    oy = y0 - region.box[0];
    ox = x0 - region.box[1];
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t k = 0; k < counts[g]; ++k) {
      const int64_t row = i * counts[g] + k;
      const int32_t* c = r[g].crops ? r[g].crops + 4 * row : nullptr;
      SamplePixels px = base;
      px.y0 = (c ? c[0] : 0) - oy;
      px.x0 = (c ? c[1] : 0) - ox;
      px.h = c ? c[2] : rh;
      px.w = c ? c[3] : rw;
      TBLJAX_RETURN_IF_ERROR(kernels[static_cast<size_t>(g)].Run(row, px));
    }
  }
  constexpr size_t kKeep = size_t{32} << 20;
  if (scratch.pixels.capacity() > kKeep || scratch.part.capacity() > kKeep ||
      scratch.planes.capacity() > kKeep)
    scratch = JpegBoxScratch();
  return Status::Ok();
}

}  // namespace

Status ServeJpeg(const JpegSource& src, const GatherRequest& r, const JpegServeOptions& o,
                 ThreadPool* pool, int64_t* failed_row) {
  if (failed_row != nullptr) *failed_row = -1;
  SampleKernel kernel;
  TBLJAX_RETURN_IF_ERROR(SampleKernel::Prepare(r, &kernel));
  TBLJAX_RETURN_IF_ERROR(CheckRecords(src, r, kernel.out_h(), kernel.out_w()));
  if (r.batch == 0) return Status::Ok();
  TBLJAX_RETURN_IF_ERROR(DefaultPool(&pool));
  FirstFailure failure;
  std::atomic<bool> failed{false};
  pool->ParallelFor(r.batch, [&](int64_t b) {
    if (failed.load(std::memory_order_relaxed)) return;  // the batch fails anyway
    Status s = ServeOne(src, r, o, kernel, b);
    if (!s.ok()) {
      failed.store(true, std::memory_order_relaxed);
      failure.Note(b, std::move(s));
    }
  });
  if (failure.row < 0) return Status::Ok();
  if (failed_row != nullptr) *failed_row = failure.row;
  return failure.status;
}

Status ServeJpegViews(const JpegSource& src, const GatherRequest* r, const int64_t* counts,
                      int64_t groups, ThreadPool* pool, int64_t* failed_record) {
  if (failed_record != nullptr) *failed_record = -1;
  if (groups < 1 || r == nullptr || counts == nullptr)
    return InvalidArgument("views: at least one group is needed");
  std::vector<SampleKernel> kernels(static_cast<size_t>(groups));
  int64_t n = -1;
  for (int64_t g = 0; g < groups; ++g) {
    TBLJAX_RETURN_IF_ERROR(SampleKernel::Prepare(r[g], &kernels[static_cast<size_t>(g)]));
    TBLJAX_RETURN_IF_ERROR(CheckRecords(src, r[g], kernels[g].out_h(), kernels[g].out_w()));
    if (counts[g] < 1 || r[g].batch % counts[g] != 0 || (n >= 0 && r[g].batch / counts[g] != n))
      return InvalidArgument(
          "views: group " + std::to_string(g) + " has " + std::to_string(r[g].batch) +
          " rows, not " + std::to_string(counts[g]) + " per record of the other groups' records");
    n = r[g].batch / counts[g];
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t row = 0; row < r[g].batch; ++row) {
      if (r[g].indices[row] != r[0].indices[(row / counts[g]) * counts[0]])
        return InvalidArgument("views: group " + std::to_string(g) + " row " + std::to_string(row) +
                               " is not its record's view (record-major)");
    }
  }
  if (n == 0) return Status::Ok();
  TBLJAX_RETURN_IF_ERROR(DefaultPool(&pool));
  FirstFailure failure;
  std::atomic<bool> failed{false};
  pool->ParallelFor(n, [&](int64_t i) {
    if (failed.load(std::memory_order_relaxed)) return;
    Status s = ServeViewsOne(src, r, counts, groups, kernels, i);
    if (!s.ok()) {
      failed.store(true, std::memory_order_relaxed);
      failure.Note(i, std::move(s));
    }
  });
  if (failure.row < 0) return Status::Ok();
  if (failed_record != nullptr) *failed_record = failure.row;
  return failure.status;
}

}  // namespace tbljax
