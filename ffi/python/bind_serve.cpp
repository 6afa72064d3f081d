// Python bindings for serving compact JPEG records (serve_jpeg.h): JpegSource over a file's
// mapping and its index, and serve_jpeg (GIL released). tbljax/kernels.py is the documented
// front end.
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "boxes.h"
#include "common.h"
#include "linear_map.h"
#include "nearest.h"
#include "serve_jpeg.h"

namespace tbljax::py {
namespace {

// Holds the shard arrays and the tables so the memory the JpegSource points into stays alive.
struct PyJpegSource {
  JpegSource source;
  std::vector<nb::object> keep;
};

PyJpegSource MakeJpegSource(const nb::sequence& shards, I64Array counts, I64Array offsets,
                            I64Array sizes, I32Array heights, I32Array widths,
                            std::optional<U8Array> stored_raw) {
  std::vector<RawShard> raw;
  std::vector<nb::object> keep;
  const int64_t total = ByteShards(shards, counts, &raw, &keep);
  for (size_t n : {offsets.shape(0), sizes.shape(0), heights.shape(0), widths.shape(0)})
    if (static_cast<int64_t>(n) != total)
      throw nb::value_error(("offsets, sizes, heights and widths need one entry per record (" +
                             std::to_string(total) + "), got " + std::to_string(n))
                                .c_str());
  if (stored_raw && static_cast<int64_t>(stored_raw->shape(0)) != total)
    throw nb::value_error(("stored_raw needs one entry per record (" + std::to_string(total) +
                           "), got " + std::to_string(stored_raw->shape(0)))
                              .c_str());
  JpegSource src;
  Check(JpegSource::Create(std::move(raw), offsets.data(), sizes.data(), heights.data(),
                           widths.data(), stored_raw ? stored_raw->data() : nullptr, &src));
  for (nb::object t : {nb::cast(offsets), nb::cast(sizes), nb::cast(heights), nb::cast(widths)})
    keep.push_back(t);
  if (stored_raw) keep.push_back(nb::cast(*stored_raw));
  return PyJpegSource{std::move(src), std::move(keep)};
}

using AnyArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using MapOut = nb::ndarray<nb::c_contig, nb::device::cpu>;

// The map stages' per-row arguments: maps, heights, widths, crop and flip (one byte each), one
// entry per row of out.
void CheckMapArgs(const nb::sequence& maps, const I32Array& heights, const I32Array& widths,
                  const std::optional<CropArray>& crop, const std::optional<FlipArray>& flip,
                  int64_t batch) {
  if (static_cast<int64_t>(nb::len(maps)) != batch ||
      static_cast<int64_t>(heights.shape(0)) != batch ||
      static_cast<int64_t>(widths.shape(0)) != batch ||
      (crop && static_cast<int64_t>(crop->shape(0)) != batch) ||
      (flip && (static_cast<int64_t>(flip->shape(0)) != batch || flip->itemsize() != 1)))
    Check(
        InvalidArgument("maps, heights, widths, crop and flip (one byte each) need one entry per "
                        "row of out (" +
                        std::to_string(batch) + ")"));
}

// serve_nearest: each row's map (maps[b], any dtype equal to out's, heights[b] x widths[b]
// elements of out's trailing shape) through its crop and flip into out (B, out_h, out_w, ...).
void ServeNearestPy(const nb::sequence& maps, I32Array heights, I32Array widths,
                    std::optional<CropArray> crop, std::optional<FlipArray> flip, MapOut out,
                    int threads) {
  if (out.ndim() < 3)
    Check(InvalidArgument("out must be (B, out_h, out_w[, ...]), got " +
                          std::to_string(out.ndim()) + " dimensions"));
  NearestRequest r;
  r.batch = static_cast<int64_t>(out.shape(0));
  r.out_h = static_cast<int64_t>(out.shape(1));
  r.out_w = static_cast<int64_t>(out.shape(2));
  int64_t trail = 1;
  for (size_t d = 3; d < out.ndim(); ++d) trail *= static_cast<int64_t>(out.shape(d));
  r.elem_bytes = trail * out.itemsize();
  CheckMapArgs(maps, heights, widths, crop, flip, r.batch);
  std::vector<const uint8_t*> rows(static_cast<size_t>(r.batch));
  for (int64_t b = 0; b < r.batch; ++b) {
    AnyArray a = nb::cast<AnyArray>(maps[b]);
    const int64_t want = int64_t{heights.data()[b]} * widths.data()[b] * r.elem_bytes;
    if (a.dtype() != out.dtype() || static_cast<int64_t>(a.nbytes()) != want)
      Check(InvalidArgument("maps[" + std::to_string(b) + "] must hold " + std::to_string(want) +
                            " bytes of out's dtype (" + std::to_string(heights.data()[b]) + "x" +
                            std::to_string(widths.data()[b]) + " elements), got " +
                            std::to_string(a.nbytes()) + " bytes"));
    rows[b] = static_cast<const uint8_t*>(a.data());
  }
  r.rows = rows.data();
  r.heights = heights.data();
  r.widths = widths.data();
  r.crops = crop ? crop->data() : nullptr;
  r.flips = flip ? static_cast<const uint8_t*>(flip->data()) : nullptr;
  r.out = static_cast<uint8_t*>(out.data());
  CheckThreads(threads);
  Status s;
  {
    nb::gil_scoped_release release;
    s = ServeNearest(r, &PoolFor(threads));
  }
  Check(s);
}

// serve_linear: each row's float32 map (maps[b], heights[b] x widths[b] x C) through its crop
// and flip into out (B, out_h, out_w[, C]) float32 by the linear rule (linear_map.h).
void ServeLinearPy(const nb::sequence& maps, I32Array heights, I32Array widths,
                   std::optional<CropArray> crop, std::optional<FlipArray> flip,
                   nb::ndarray<float, nb::c_contig, nb::device::cpu> out,
                   std::optional<float> invalid, int threads) {
  if (out.ndim() < 3 || out.ndim() > 4)
    Check(InvalidArgument("out must be (B, out_h, out_w[, C]), got " + std::to_string(out.ndim()) +
                          " dimensions"));
  LinearRequest r;
  r.batch = static_cast<int64_t>(out.shape(0));
  r.out_h = static_cast<int64_t>(out.shape(1));
  r.out_w = static_cast<int64_t>(out.shape(2));
  r.channels = out.ndim() == 4 ? static_cast<int64_t>(out.shape(3)) : 1;
  CheckMapArgs(maps, heights, widths, crop, flip, r.batch);
  std::vector<const float*> rows(static_cast<size_t>(r.batch));
  for (int64_t b = 0; b < r.batch; ++b) {
    AnyArray a = nb::cast<AnyArray>(maps[b]);
    const int64_t want = int64_t{heights.data()[b]} * widths.data()[b] * r.channels;
    if (a.dtype() != nb::dtype<float>() || static_cast<int64_t>(a.size()) != want)
      Check(InvalidArgument("maps[" + std::to_string(b) + "] must hold " + std::to_string(want) +
                            " float32 values (" + std::to_string(heights.data()[b]) + "x" +
                            std::to_string(widths.data()[b]) + "x" + std::to_string(r.channels) +
                            "), got " + std::to_string(a.size())));
    rows[b] = static_cast<const float*>(a.data());
  }
  r.rows = rows.data();
  r.heights = heights.data();
  r.widths = widths.data();
  r.crops = crop ? crop->data() : nullptr;
  r.flips = flip ? static_cast<const uint8_t*>(flip->data()) : nullptr;
  r.has_invalid = invalid.has_value();
  r.invalid = invalid.value_or(0.0f);
  r.out = out.data();
  CheckThreads(threads);
  Status s;
  {
    nb::gil_scoped_release release;
    s = ServeLinear(r, &PoolFor(threads));
  }
  Check(s);
}

using F64In = nb::ndarray<const double, nb::c_contig, nb::device::cpu>;
using I64In = nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>;

// serve_boxes: rows' xyxy boxes (B, n, 4) through their crops, output sizes and flips into
// boxes (B, M, 4) float32, valid (B, M) bool and labels (B, M) int32 (boxes.h).
void ServeBoxesPy(F64In xyxy, I64Array counts, std::optional<I64In> labels, F64In crops,
                  F64In out_hw, std::optional<FlipArray> flip, double min_size, double min_area,
                  double min_visibility, nb::ndarray<float, nb::ndim<3>, nb::c_contig> boxes,
                  nb::ndarray<bool, nb::ndim<2>, nb::c_contig> valid,
                  nb::ndarray<int32_t, nb::ndim<2>, nb::c_contig> out_labels) {
  BoxesRequest r;
  r.batch = static_cast<int64_t>(counts.shape(0));
  r.n = xyxy.ndim() == 3 ? static_cast<int64_t>(xyxy.shape(1)) : -1;
  r.max_boxes = static_cast<int64_t>(boxes.shape(1));
  const auto is = [](const auto& a, std::initializer_list<int64_t> shape) {
    if (a.ndim() != shape.size()) return false;
    size_t d = 0;
    for (int64_t s : shape)
      if (static_cast<int64_t>(a.shape(d++)) != s) return false;
    return true;
  };
  if (!is(xyxy, {r.batch, r.n, 4}) || (labels && !is(*labels, {r.batch, r.n})) ||
      !is(crops, {r.batch, 4}) || !is(out_hw, {r.batch, 2}) ||
      (flip && (static_cast<int64_t>(flip->shape(0)) != r.batch || flip->itemsize() != 1)) ||
      !is(boxes, {r.batch, r.max_boxes, 4}) || !is(valid, {r.batch, r.max_boxes}) ||
      !is(out_labels, {r.batch, r.max_boxes}))
    Check(InvalidArgument(
        "serve_boxes takes xyxy (B, n, 4), counts (B,), labels (B, n), crops (B, 4), out_hw "
        "(B, 2), flip (B,) one byte each, and boxes (B, M, 4), valid and labels_out (B, M); B = " +
        std::to_string(r.batch)));
  r.xyxy = xyxy.data();
  r.counts = counts.data();
  r.labels = labels ? labels->data() : nullptr;
  r.crops = crops.data();
  r.out_hw = out_hw.data();
  r.flips = flip ? static_cast<const uint8_t*>(flip->data()) : nullptr;
  r.min_size = min_size, r.min_area = min_area, r.min_visibility = min_visibility;
  r.boxes = boxes.data();
  r.valid = reinterpret_cast<uint8_t*>(valid.data());
  r.out_labels = out_labels.data();
  Check(ServeBoxes(r));
}

}  // namespace

void BindServe(nb::module_& m) {
  nb::class_<PyJpegSource>(m, "JpegSource",
                           "N JPEG records in one or more shards (file mappings), read as one "
                           "sequence. Holds references to the arrays.")
      .def_static("create", &MakeJpegSource, nb::arg("shards"), nb::arg("counts").noconvert(),
                  nb::arg("offsets").noconvert(), nb::arg("sizes").noconvert(),
                  nb::arg("heights").noconvert(), nb::arg("widths").noconvert(),
                  nb::arg("stored_raw").noconvert() = nb::none(),
                  "shards[k] (uint8 bytes) holds counts[k] records; record i is sizes[i] bytes "
                  "at byte offsets[i] of its shard and decodes to heights[i] x widths[i], or, "
                  "where stored_raw[i] (uint8) is nonzero, is those pixels stored RAW. "
                  "CorruptFileError if a record does not lie inside its shard or a RAW "
                  "record's size is not its pixels'.")
      .def_prop_ro("num_records", [](const PyJpegSource& s) { return s.source.num_records(); })
      .def("__len__", [](const PyJpegSource& s) { return s.source.num_records(); });

  m.def(
      "serve_jpeg",
      [](const PyJpegSource& src, IndexArray indices, OutArray out, const std::string& layout,
         const std::string& out_dtype, std::array<double, 3> mean, std::array<double, 3> std,
         std::optional<CropArray> crop, std::optional<FlipArray> flip, bool dct_scale, int threads,
         nb::object where, std::optional<nb::tuple> ops, int64_t patch,
         std::optional<SizeArray> sizes) {
        GatherRequest r =
            ParseGatherRequest(indices, out, layout, out_dtype, mean, std, crop, flip);
        SetPatches(&r, patch, sizes);
        OpsRequest ops_request;
        if (ops) {
          ops_request = ParseOps(*ops, r.batch);
          r.ops = &ops_request;
        }
        CheckThreads(threads);
        JpegServeOptions o;
        o.dct_scale = dct_scale;
        Status s;
        int64_t row = -1;
        {
          nb::gil_scoped_release release;
          s = ServeJpeg(src.source, r, o, &PoolFor(threads), &row);
        }
        if (!s.ok() && row >= 0 && !where.is_none()) {
          // The caller names the record (file and record within it).
          const std::string name = nb::cast<std::string>(where(r.indices[row]));
          s = Status(s.code(), name + ": " + s.message());
        }
        Check(s);
      },
      nb::arg("source"), nb::arg("indices").noconvert(), nb::arg("out").noconvert(),
      nb::arg("layout"), nb::arg("out_dtype"), nb::arg("mean"), nb::arg("std"),
      nb::arg("crop").noconvert().none(), nb::arg("flip").noconvert().none(),
      nb::arg("dct_scale") = false, nb::arg("threads") = 0, nb::arg("where").none() = nb::none(),
      nb::arg("ops").none() = nb::none(), nb::arg("patch") = 0,
      nb::arg("sizes").noconvert().none() = nb::none(),
      "Decode only each box's part of compact JPEG records, then crop/resize -> flip -> "
      "normalize -> dtype/layout into `out` (see tbljax.kernels.serve_jpeg). where(i) -> str "
      "names record i in the error of a record that fails.");

  m.def(
      "serve_jpeg_views",
      [](const PyJpegSource& src, nb::list groups, const std::string& layout,
         const std::string& out_dtype, std::array<double, 3> mean, std::array<double, 3> std,
         int threads, nb::object where) {
        // groups: [(count, indices, out, crop, flip, ops)], one per view group.
        const size_t g = nb::len(groups);
        std::vector<GatherRequest> requests(g);
        std::vector<OpsRequest> ops(g);  // sized once: requests point into it
        std::vector<int64_t> counts(g);
        for (size_t k = 0; k < g; ++k) {
          nb::tuple t = nb::cast<nb::tuple>(groups[k]);
          counts[k] = nb::cast<int64_t>(t[0]);
          requests[k] = ParseGatherRequest(
              nb::cast<IndexArray>(t[1], false), nb::cast<OutArray>(t[2], false), layout, out_dtype,
              mean, std,
              t[3].is_none() ? std::nullopt
                             : std::optional<CropArray>(nb::cast<CropArray>(t[3], false)),
              t[4].is_none() ? std::nullopt
                             : std::optional<FlipArray>(nb::cast<FlipArray>(t[4], false)));
          if (!t[5].is_none()) {
            ops[k] = ParseOps(nb::cast<nb::tuple>(t[5]), requests[k].batch);
            requests[k].ops = &ops[k];
          }
        }
        CheckThreads(threads);
        Status s;
        int64_t record = -1;
        {
          nb::gil_scoped_release release;
          s = ServeJpegViews(src.source, requests.data(), counts.data(), static_cast<int64_t>(g),
                             &PoolFor(threads), &record);
        }
        if (!s.ok() && record >= 0 && !where.is_none()) {
          const std::string name =
              nb::cast<std::string>(where(requests[0].indices[record * counts[0]]));
          s = Status(s.code(), name + ": " + s.message());
        }
        Check(s);
      },
      nb::arg("source"), nb::arg("groups"), nb::arg("layout"), nb::arg("out_dtype"),
      nb::arg("mean"), nb::arg("std"), nb::arg("threads") = 0, nb::arg("where").none() = nb::none(),
      "serve_jpeg for several view groups over the same records, each record decoded once "
      "for all of its views: groups = [(count, indices, out, crop, flip, ops)], rows "
      "record-major (see tbljax.kernels.serve_jpeg_views).");

  m.def("serve_nearest", &ServeNearestPy, nb::arg("maps"), nb::arg("heights").noconvert(),
        nb::arg("widths").noconvert(), nb::arg("crop").noconvert().none(),
        nb::arg("flip").noconvert().none(), nb::arg("out").noconvert(), nb::arg("threads") = 0,
        "Label or dense maps through each row's crop (y0, x0, h, w; None: the whole map), "
        "resize to out's (out_h, out_w) by the nearest rule (float32, as torchvision v2's "
        "Mask) and flip, into out (B, out_h, out_w[, C]). maps[b]: heights[b] x widths[b] "
        "elements of out's dtype. GIL released.");
  m.def("serve_linear", &ServeLinearPy, nb::arg("maps"), nb::arg("heights").noconvert(),
        nb::arg("widths").noconvert(), nb::arg("crop").noconvert().none(),
        nb::arg("flip").noconvert().none(), nb::arg("out").noconvert(), nb::arg("invalid").none(),
        nb::arg("threads") = 0,
        "Dense float32 maps through each row's crop (y0, x0, h, w; None: the whole map), "
        "resize to out's (out_h, out_w) by the linear rule (rules/geometry.crop_taps and "
        "blend_linear; `invalid` samples given no weight, None: all valid) and flip, into out "
        "(B, out_h, out_w[, C]) float32. maps[b]: heights[b] x widths[b] x C values. GIL "
        "released.");

  m.def("serve_boxes", &ServeBoxesPy, nb::arg("xyxy").noconvert(), nb::arg("counts").noconvert(),
        nb::arg("labels").noconvert().none(), nb::arg("crops").noconvert(),
        nb::arg("out_hw").noconvert(), nb::arg("flip").noconvert().none(), nb::arg("min_size"),
        nb::arg("min_area"), nb::arg("min_visibility"), nb::arg("boxes").noconvert(),
        nb::arg("valid").noconvert(), nb::arg("labels_out").noconvert(),
        "Rows' xyxy boxes (B, n, 4) float64, the first counts[r] of row r real, through each "
        "row's crop (B, 4) y0, x0, h, w (float64), onto its out_hw (B, 2) and flip, clipped and "
        "dropped by tbljax's rules/geometry.serve_boxes_batch (the reference; the same float64 "
        "arithmetic, so the same bytes) into boxes (B, M, 4) float32, valid (B, M) bool and "
        "labels_out (B, M) int32 (labels (B, n) int64 carried, -1 past the kept boxes; "
        "untouched when labels is None). M = max_boxes.");
}

}  // namespace tbljax::py
