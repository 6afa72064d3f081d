// The serve kernel for NVIDIA GPUs as an XLA FFI handler: the same documented integer
// crop-resize (ComputeAxisTaps / TapWeight from kernel.h, one definition for both) and the same
// exact normalization tables (built on the host by the core), launched on XLA's stream. The handler
// never synchronizes: the tables travel as kernel parameters, nothing is copied.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "gather_call.h"
#include "kernel.h"

namespace tbljax::xla_ffi {
namespace {

// Passed by value (under the 4 KiB parameter limit), so a launch needs no memcpy.
struct Params {
  const uint8_t* data;
  int64_t num_records, height, width;
  // Packed records of different sizes (null: uniform): record i is records[3i + 1] x
  // records[3i + 2] pixels at byte records[3i] * page_bytes of data (data_bytes long).
  const int32_t* records;
  int64_t page_bytes, data_bytes;
  const void* indices;
  int indices_are_64bit;
  const int32_t* crops;  // null: no crop
  const uint8_t* flips;  // null: no flip
  void* out;
  int64_t batch, out_h, out_w;
  int dtype;  // OutDType
  int nchw;
  uint32_t table[3 * 256];  // float32 bits, or bfloat16 bits in the low half; c * 256 + x
};
static_assert(sizeof(Params) <= 4096, "kernel parameters must stay under 4 KiB");

constexpr int kThreads = 256;

// One thread per output pixel (all 3 channels): gather, crop-resize, flip, normalize, write.
// Device code cannot fail a call, so a row whose index or crop box is out of range (already
// rejected on the host when the indices are concrete) is written as zeros: never a wild read.
__global__ void GatherKernel(const Params p) {
  __shared__ uint32_t table[3 * 256];
  if (p.dtype != static_cast<int>(OutDType::kUint8)) {
    for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) table[i] = p.table[i];
  }
  __syncthreads();

  const int64_t plane = p.out_h * p.out_w;
  const int64_t total = p.batch * plane;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = t / plane, oy = (t % plane) / p.out_w, ox = t % p.out_w;
    const int64_t rec = p.indices_are_64bit ? static_cast<const int64_t*>(p.indices)[b]
                                            : static_cast<const int32_t*>(p.indices)[b];
    bool valid = rec >= 0 && rec < p.num_records;
    int64_t H = p.height, W = p.width, offset = 0;
    if (valid && p.records != nullptr) {
      H = p.records[3 * rec + 1];
      W = p.records[3 * rec + 2];
      offset = p.records[3 * rec] * p.page_bytes;
      valid = H >= 1 && W >= 1 && offset >= 0 && offset <= p.data_bytes &&
              H * W * 3 <= p.data_bytes - offset;
    } else if (valid) {
      offset = rec * H * W * 3;
    }
    int64_t y0 = 0, x0 = 0, ch = H, cw = W;
    if (p.crops != nullptr) {
      y0 = p.crops[4 * b];
      x0 = p.crops[4 * b + 1];
      ch = p.crops[4 * b + 2];
      cw = p.crops[4 * b + 3];
      valid = valid && y0 >= 0 && x0 >= 0 && ch >= 1 && cw >= 1 && y0 + ch <= H && x0 + cw <= W;
    }
    // Flip mirrors output columns: output column ox reads what column OW-1-ox would.
    const int64_t sx = (p.flips != nullptr && p.flips[b]) ? p.out_w - 1 - ox : ox;
    int32_t px[3] = {0, 0, 0};
    if (valid) {
      const uint8_t* img = p.data + offset;
      if (p.crops == nullptr) {
        const uint8_t* s = img + (oy * W + sx) * 3;
        for (int c = 0; c < 3; ++c) px[c] = s[c];
      } else {
        // Exact integers (kernel.h): the sum over the taps of both axes fits int32, with one
        // rounding at the end.
        const AxisTaps ty = ComputeAxisTaps(oy, ch, p.out_h);
        const AxisTaps tx = ComputeAxisTaps(sx, cw, p.out_w);
        int32_t acc[3] = {0, 0, 0};
        for (int64_t j = ty.lo; j < ty.hi; ++j) {
          const int32_t wy = TapWeight(ty, j, oy, ch, p.out_h);
          const uint8_t* row = img + ((y0 + j) * W + x0) * 3;
          int32_t h[3] = {0, 0, 0};
          for (int64_t i = tx.lo; i < tx.hi; ++i) {
            const int32_t wx = TapWeight(tx, i, sx, cw, p.out_w);
            for (int c = 0; c < 3; ++c) h[c] += wx * row[i * 3 + c];
          }
          for (int c = 0; c < 3; ++c) acc[c] += wy * h[c];
        }
        for (int c = 0; c < 3; ++c)
          px[c] = (acc[c] + (1 << (2 * kResizeWeightBits - 1))) >> (2 * kResizeWeightBits);
      }
    }
    for (int c = 0; c < 3; ++c) {
      const int64_t o = p.nchw ? ((b * 3 + c) * p.out_h + oy) * p.out_w + ox
                               : ((b * p.out_h + oy) * p.out_w + ox) * 3 + c;
      switch (static_cast<OutDType>(p.dtype)) {  // uniform across the grid: no divergence
        case OutDType::kUint8: static_cast<uint8_t*>(p.out)[o] = static_cast<uint8_t>(px[c]); break;
        case OutDType::kFloat32:
          static_cast<uint32_t*>(p.out)[o] = valid ? table[c * 256 + px[c]] : 0u;
          break;
        case OutDType::kBfloat16:
          static_cast<uint16_t*>(p.out)[o] =
              valid ? static_cast<uint16_t>(table[c * 256 + px[c]]) : uint16_t{0};
          break;
      }
    }
  }
}

// Launches the kernel for a checked call on `data` (uniform records, or packed ones when
// `table` is set).
ffi::Error Launch(cudaStream_t stream, const Call& call, const uint8_t* data, const int32_t* table,
                  int64_t page_bytes, int64_t data_bytes) {
  const GatherRequest& r = call.request;
  if (r.batch == 0) return ffi::Error::Success();
  Params p;
  p.data = data;
  p.records = table;
  p.page_bytes = page_bytes;
  p.data_bytes = data_bytes;
  p.num_records = call.num_records;
  p.height = call.height;
  p.width = call.width;
  p.indices = call.indices;
  p.indices_are_64bit = call.indices_are_64bit ? 1 : 0;
  p.crops = r.crops;
  p.flips = r.flips;
  p.out = r.out;
  p.batch = r.batch;
  const bool nchw = r.layout == Layout::kNCHW;
  p.out_h = nchw ? r.out_shape[2] : r.out_shape[1];
  p.out_w = nchw ? r.out_shape[3] : r.out_shape[2];
  p.dtype = static_cast<int>(r.dtype);
  p.nchw = nchw ? 1 : 0;
  // The contract's tables, from the same host code the CPU kernel uses.
  if (r.dtype == OutDType::kFloat32) {
    float t[3 * 256];
    NormalizeTableF32(r.mean, r.std, t);
    std::memcpy(p.table, t, sizeof(t));
  } else if (r.dtype == OutDType::kBfloat16) {
    uint16_t t[3 * 256];
    NormalizeTableBf16(r.mean, r.std, t);
    for (int i = 0; i < 3 * 256; ++i) p.table[i] = t[i];
  } else {
    std::memset(p.table, 0, sizeof(p.table));
  }
  const int64_t total = p.batch * p.out_h * p.out_w;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 20);
  GatherKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return ffi::Error::Internal(std::string("tbljax gather: CUDA launch failed: ") +
                                cudaGetErrorString(e));
  return ffi::Error::Success();
}

ffi::Error GatherCuda(cudaStream_t stream, DataArg data, IndexArg indices, CropArg crops,
                      FlipArg flips, ffi::RemainingArgs /*aliased output, if any*/,
                      ffi::Span<const double> mean, ffi::Span<const double> stdev,
                      std::string_view layout, ffi::Result<ffi::AnyBuffer> out) {
  SourceShape shape;
  if (ffi::Error e = ShapeOfData(data, &shape); e.failure()) return e;
  Call call;
  if (ffi::Error e = PrepareCall(shape, indices, crops, flips, mean, stdev, layout, *out, &call);
      e.failure())
    return e;
  return Launch(stream, call, data.typed_data(), nullptr, 0, 0);
}

ffi::Error GatherPackedCuda(cudaStream_t stream, PagesArg pages, TableArg table, IndexArg indices,
                            CropArg crops, FlipArg flips, ffi::RemainingArgs /*aliased output*/,
                            ffi::Span<const double> mean, ffi::Span<const double> stdev,
                            std::string_view layout, ffi::Result<ffi::AnyBuffer> out) {
  SourceShape shape;
  if (ffi::Error e = ShapeOfPacked(pages, table, &shape); e.failure()) return e;
  Call call;
  if (ffi::Error e = PrepareCall(shape, indices, crops, flips, mean, stdev, layout, *out, &call);
      e.failure())
    return e;
  const auto pd = pages.dimensions();
  return Launch(stream, call, pages.typed_data(), table.typed_data(), pd[1], pd[0] * pd[1]);
}

}  // namespace
}  // namespace tbljax::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherCuda, tbljax::xla_ffi::GatherCuda,
    tbljax::xla_ffi::BindGatherCall(xla::ffi::Ffi::Bind()
                                        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                        .Arg<tbljax::xla_ffi::DataArg>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherPackedCuda, tbljax::xla_ffi::GatherPackedCuda,
    tbljax::xla_ffi::BindGatherCall(xla::ffi::Ffi::Bind()
                                        .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                        .Arg<tbljax::xla_ffi::PagesArg>()
                                        .Arg<tbljax::xla_ffi::TableArg>()));
