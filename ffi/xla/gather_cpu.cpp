// The serve kernel as an XLA FFI handler for the CPU platform, compiled into tbljax._core
// (ffi/python/bind_xla.cpp hands it to JAX). A thin wrapper: it checks the call
// (gather_call.h) and runs the same tbljax::Gather, on the same thread pool and SIMD target,
// as the host loader, so the in-jit path and the loader agree bit for bit by construction.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "gather_call.h"
#include "kernel.h"

namespace tbljax::xla_ffi {
namespace {

// int32 indices (JAX without x64) widened for the kernel, in per-thread memory that only
// grows, so steady-state calls allocate nothing.
const int64_t* WidenIndices(const int32_t* idx, int64_t n) {
  thread_local std::unique_ptr<int64_t[]> buf;
  thread_local int64_t capacity = 0;
  if (capacity < n) {
    buf.reset(new int64_t[n]);
    capacity = n;
  }
  for (int64_t i = 0; i < n; ++i) buf[i] = idx[i];
  return buf.get();
}

// The request's indices as the kernel takes them (int64).
void SetIndices(const Call& call, GatherRequest* r) {
  r->indices = call.indices_are_64bit
                   ? static_cast<const int64_t*>(call.indices)
                   : WidenIndices(static_cast<const int32_t*>(call.indices), r->batch);
}

// The per-image ops of the ops targets as the kernel takes them, their shapes checked against
// the batch (the values are the kernel's CheckOps). The matrices arrive as float64 bit patterns
// and are put together in per-thread memory that only grows.
struct OpsOperands {
  CodesArg codes;
  OpArgsArg args;
  MatricesArg matrices;
  FillArg fill;
  NearestArg nearest;
  EraseBoxesArg boxes;
  EraseKeysArg keys;
  NormalTableArg table;
  int32_t erase_mode;
  SizesArg sizes;  // NaFlex rows' (h, w) when patch > 0
  int64_t patch;
  int32_t size_free;  // 1: the matrices are size-free templates, finished at each row's size
};

// The size-dependent entries of one affine matrix, at its row's output size h x w, from the
// size-free template of tbljax.ops.pixel_program (jit, NaFlex rows): the float64 operations of
// rules/pixel_ops.affine_matrix / tv_affine_matrix in their order (this file is compiled with
// -ffp-contract=off: one rounding per operation, as Python's). Templates: Rotate and TvRotate
// (0..4 without the centre), TranslateX/YRel (the level in 2 or 5), TvTranslateX/Y (tx in 2,
// ty in 5); the other ops' matrices do not depend on the size.
constexpr int kOpTranslateXRel = 16, kOpTvTranslateX = 24;  // beside kernel.h's kOp* codes

void FinishAtSize(uint8_t code, int32_t h, int32_t w, double* m) {
  const double cx = w / 2.0, cy = h / 2.0;
  if (code == kOpRotate || code == kOpTvRotate) {
    m[2] = m[0] * -cx + m[1] * -cy + cx;
    m[5] = m[3] * -cx + m[4] * -cy + cy;
  } else if (code == kOpTranslateXRel) {
    m[2] = m[2] * w;
  } else if (code == kOpTranslateYRel) {
    m[5] = m[5] * h;
  } else if (code == kOpTvTranslateX || code == kOpTvTranslateY) {
    const double tx = m[2], ty = m[5], x = -cx - tx, y = -cy - ty;
    m[2] = 0.0 + (m[0] * x + m[1] * y) + cx;
    m[5] = 0.0 + (m[3] * x + m[4] * y) + cy;
  }
}

ffi::Error PrepareOps(const OpsOperands& o, int64_t batch, OpsRequest* r) {
  auto fail = [](std::string m) { return ffi::Error::InvalidArgument("tbljax gather ops: " + m); };
  const auto cd = o.codes.dimensions(), ad = o.args.dimensions(), md = o.matrices.dimensions();
  const auto fd = o.fill.dimensions(), nd = o.nearest.dimensions(), bd = o.boxes.dimensions();
  const int64_t k = cd[1];
  if (cd[0] != batch || ad[0] != batch || ad[1] != k)
    return fail("codes and args must be (B, K) with B = " + std::to_string(batch) + ", got " +
                Dims(cd) + " and " + Dims(ad));
  if (md[0] != batch || md[1] != k || md[2] != 6 || md[3] != 2)
    return fail("matrices must be (B, K, 6, 2) uint32 bits, got " + Dims(md));
  if (fd[0] != k || fd[1] != 3 || nd[0] != k)
    return fail("fill must be (K, 3) and nearest (K,) with K = " + std::to_string(k) + ", got " +
                Dims(fd) + " and " + Dims(nd));
  if (bd[0] != batch || bd[2] != 4 || o.keys.dimensions()[0] != batch)
    return fail("erase boxes must be (B, E, 4) and erase keys (B,), got " + Dims(bd) + " and " +
                Dims(o.keys.dimensions()));
  if (o.table.dimensions()[0] != kNormalTableSize)
    return fail("the normal table must have " + std::to_string(kNormalTableSize) +
                " entries, got " + Dims(o.table.dimensions()));
  const int64_t n = batch * k * 6;
  thread_local std::unique_ptr<double[]> matrices;
  thread_local int64_t capacity = 0;
  if (capacity < n) {
    matrices.reset(new double[n]);
    capacity = n;
  }
  const uint32_t* bits = o.matrices.typed_data();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t v = (static_cast<uint64_t>(bits[2 * i + 1]) << 32) | bits[2 * i];
    std::memcpy(&matrices[i], &v, sizeof v);
  }
  r->num_ops = k;
  r->codes = o.codes.typed_data();
  r->args = o.args.typed_data();
  r->matrices = matrices.get();
  r->fill = o.fill.typed_data();
  r->nearest = o.nearest.typed_data();
  r->num_erase = bd[1];
  r->erase_boxes = o.boxes.typed_data();
  r->erase_keys = o.keys.typed_data();
  r->erase_mode = static_cast<EraseMode>(o.erase_mode);
  r->normal_table = o.table.typed_data();
  if (o.size_free) {  // NaFlex rows in jit: each row's matrices finished at its own size
    const auto sd = o.sizes.dimensions();
    if (o.patch <= 0 || sd[0] != batch || sd[1] != 2)
      return fail("size-free matrices need patch > 0 and sizes (B, 2), got patch " +
                  std::to_string(o.patch) + " and " + Dims(sd));
    const int32_t* hw = o.sizes.typed_data();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < k; ++j)
        FinishAtSize(r->codes[b * k + j], hw[2 * b], hw[2 * b + 1], &matrices[(b * k + j) * 6]);
  }
  return ffi::Error::Success();
}

// The NaFlex rows of an ops call (the kernel checks each size against the patch and T).
ffi::Error PreparePatches(const OpsOperands& o, GatherRequest* r) {
  const auto sd = o.sizes.dimensions();
  if (o.patch < 0 || (o.patch > 0) != (sd[0] != 0) || sd[1] != 2 ||
      (sd[0] != 0 && sd[0] != r->batch))
    return ffi::Error::InvalidArgument(
        "tbljax gather: patch > 0 needs sizes (B, 2) = (" + std::to_string(r->batch) +
        ", 2), patch 0 sizes (0, 2); got patch " + std::to_string(o.patch) + " and " + Dims(sd));
  r->patch = o.patch;
  r->out_sizes = o.patch > 0 ? o.sizes.typed_data() : nullptr;
  return ffi::Error::Success();
}

// Records of one size; `ops` null: no per-image ops.
ffi::Error GatherUniform(DataArg data, IndexArg indices, CropArg crops, FlipArg flips,
                         ffi::Span<const double> mean, ffi::Span<const double> stdev,
                         std::string_view layout, ffi::AnyBuffer out, const OpsOperands* ops) {
  SourceShape shape;
  if (ffi::Error e = ShapeOfData(data, &shape); e.failure()) return e;
  Call call;
  if (ffi::Error e = PrepareCall(shape, indices, crops, flips, mean, stdev, layout, out, &call);
      e.failure())
    return e;
  OpsRequest ops_request;
  if (ops) {
    if (ffi::Error e = PrepareOps(*ops, call.request.batch, &ops_request); e.failure()) return e;
    if (ffi::Error e = PreparePatches(*ops, &call.request); e.failure()) return e;
    call.request.ops = &ops_request;
  }
  SetIndices(call, &call.request);
  RawSource source;
  if (Status s = RawSource::Create({RawShard{data.typed_data(), call.num_records}}, call.height,
                                   call.width, &source);
      !s.ok())
    return ToError(s);
  return ToError(Gather(source, call.request));
}

// Records of different sizes, packed at page starts: the kernel reads each record's own
// height and width from the table (and checks that the records it reads lie in the pages).
ffi::Error GatherPacked(PagesArg pages, TableArg table, IndexArg indices, CropArg crops,
                        FlipArg flips, ffi::Span<const double> mean, ffi::Span<const double> stdev,
                        std::string_view layout, ffi::AnyBuffer out, const OpsOperands* ops) {
  SourceShape shape;
  if (ffi::Error e = ShapeOfPacked(pages, table, &shape); e.failure()) return e;
  Call call;
  if (ffi::Error e = PrepareCall(shape, indices, crops, flips, mean, stdev, layout, out, &call);
      e.failure())
    return e;
  OpsRequest ops_request;
  if (ops) {
    if (ffi::Error e = PrepareOps(*ops, call.request.batch, &ops_request); e.failure()) return e;
    if (ffi::Error e = PreparePatches(*ops, &call.request); e.failure()) return e;
    call.request.ops = &ops_request;
  }
  SetIndices(call, &call.request);
  const auto pd = pages.dimensions();
  RecordTable t;
  t.pages = table.typed_data();
  t.page_bytes = pd[1];
  t.heights = table.typed_data() + 1;
  t.widths = table.typed_data() + 2;
  t.stride = 3;
  RawSource source;
  if (Status s = RawSource::CreateVariable(
          {RawShard{pages.typed_data(), call.num_records, pd[0] * pd[1]}}, t, &source);
      !s.ok())
    return ToError(s);
  return ToError(Gather(source, call.request));
}

ffi::Error GatherCpu(DataArg data, IndexArg indices, CropArg crops, FlipArg flips,
                     ffi::RemainingArgs /*aliased output, if any*/, ffi::Span<const double> mean,
                     ffi::Span<const double> stdev, std::string_view layout,
                     ffi::Result<ffi::AnyBuffer> out) {
  return GatherUniform(data, indices, crops, flips, mean, stdev, layout, *out, nullptr);
}

ffi::Error GatherPackedCpu(PagesArg pages, TableArg table, IndexArg indices, CropArg crops,
                           FlipArg flips, ffi::RemainingArgs /*aliased output, if any*/,
                           ffi::Span<const double> mean, ffi::Span<const double> stdev,
                           std::string_view layout, ffi::Result<ffi::AnyBuffer> out) {
  return GatherPacked(pages, table, indices, crops, flips, mean, stdev, layout, *out, nullptr);
}

ffi::Error GatherOpsCpu(DataArg data, IndexArg indices, CropArg crops, FlipArg flips,
                        CodesArg codes, OpArgsArg args, MatricesArg matrices, FillArg fill,
                        NearestArg nearest, EraseBoxesArg boxes, EraseKeysArg keys,
                        NormalTableArg normal, SizesArg sizes,
                        ffi::RemainingArgs /*aliased output, if any*/, ffi::Span<const double> mean,
                        ffi::Span<const double> stdev, std::string_view layout, int32_t erase_mode,
                        int64_t patch, int32_t size_free, ffi::Result<ffi::AnyBuffer> out) {
  const OpsOperands ops{codes, args,   matrices,   fill,  nearest, boxes,
                        keys,  normal, erase_mode, sizes, patch,   size_free};
  return GatherUniform(data, indices, crops, flips, mean, stdev, layout, *out, &ops);
}

ffi::Error GatherPackedOpsCpu(PagesArg pages, TableArg table, IndexArg indices, CropArg crops,
                              FlipArg flips, CodesArg codes, OpArgsArg args, MatricesArg matrices,
                              FillArg fill, NearestArg nearest, EraseBoxesArg boxes,
                              EraseKeysArg keys, NormalTableArg normal, SizesArg sizes,
                              ffi::RemainingArgs /*aliased output, if any*/,
                              ffi::Span<const double> mean, ffi::Span<const double> stdev,
                              std::string_view layout, int32_t erase_mode, int64_t patch,
                              int32_t size_free, ffi::Result<ffi::AnyBuffer> out) {
  const OpsOperands ops{codes, args,   matrices,   fill,  nearest, boxes,
                        keys,  normal, erase_mode, sizes, patch,   size_free};
  return GatherPacked(pages, table, indices, crops, flips, mean, stdev, layout, *out, &ops);
}

}  // namespace
}  // namespace tbljax::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherCpu, tbljax::xla_ffi::GatherCpu,
    tbljax::xla_ffi::BindGatherCall(xla::ffi::Ffi::Bind().Arg<tbljax::xla_ffi::DataArg>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherPackedCpu, tbljax::xla_ffi::GatherPackedCpu,
    tbljax::xla_ffi::BindGatherCall(
        xla::ffi::Ffi::Bind().Arg<tbljax::xla_ffi::PagesArg>().Arg<tbljax::xla_ffi::TableArg>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherOpsCpu, tbljax::xla_ffi::GatherOpsCpu,
    tbljax::xla_ffi::BindGatherOpsCall(xla::ffi::Ffi::Bind().Arg<tbljax::xla_ffi::DataArg>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherPackedOpsCpu, tbljax::xla_ffi::GatherPackedOpsCpu,
    tbljax::xla_ffi::BindGatherOpsCall(
        xla::ffi::Ffi::Bind().Arg<tbljax::xla_ffi::PagesArg>().Arg<tbljax::xla_ffi::TableArg>()));
