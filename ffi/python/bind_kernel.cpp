// Python bindings for the serve kernel: RawSource over NumPy shard arrays, gather (GIL
// released), the SIMD target, and the batch contract (names, normalization tables, argument
// checks) that Python uses instead of retyping it. tbljax/kernels.py is the documented front
// end.
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "kernel.h"
#include "order.h"
#include "simd.h"

namespace tbljax::py {
namespace {

// Holds the shard arrays so the memory the RawSource points into stays alive.
struct PyRawSource {
  RawSource source;
  std::vector<nb::object> arrays;
  std::vector<nb::object> tables;  // records of different sizes: offsets, heights, widths
};

using ShardArray = nb::ndarray<const uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu>;

std::string ShapeOf(const ShardArray& a) {
  return "(" + std::to_string(a.shape(0)) + ", " + std::to_string(a.shape(1)) + ", " +
         std::to_string(a.shape(2)) + ", " + std::to_string(a.shape(3)) + ")";
}

void InitRawSource(PyRawSource* self, const nb::sequence& shards) {
  std::vector<RawShard> raw;
  std::vector<nb::object> keep;
  int64_t h = -1, w = -1;
  size_t k = 0;
  for (nb::handle item : shards) {
    ShardArray a;
    if (!nb::try_cast(item, a, /*convert=*/false))
      throw nb::type_error(("shards[" + std::to_string(k) +
                            "] must be a C-contiguous uint8 NumPy array of shape (N, H, W, 3) "
                            "on the CPU, got " +
                            nb::inst_name(item).c_str())
                               .c_str());
    if (a.shape(3) != 3)
      throw nb::value_error(("shards[" + std::to_string(k) + "] has shape " + ShapeOf(a) +
                             ": records must be RGB, shape (N, H, W, 3)")
                                .c_str());
    if (k == 0) {
      h = static_cast<int64_t>(a.shape(1));
      w = static_cast<int64_t>(a.shape(2));
    } else if (static_cast<int64_t>(a.shape(1)) != h || static_cast<int64_t>(a.shape(2)) != w) {
      throw nb::value_error(("shards[" + std::to_string(k) + "] has shape " + ShapeOf(a) +
                             " but shards[0] holds " + std::to_string(h) + "x" + std::to_string(w) +
                             " records: all shards must match")
                                .c_str());
    }
    raw.push_back({a.data(), static_cast<int64_t>(a.shape(0))});
    keep.push_back(nb::borrow(item));
    ++k;
  }
  if (k == 0) throw nb::value_error("RawSource needs at least one shard array");
  RawSource src;
  Check(RawSource::Create(std::move(raw), h, w, &src));
  new (self) PyRawSource{std::move(src), std::move(keep)};
}

// Records of different sizes: shard k is a C-contiguous uint8 array (any shape; its bytes)
// holding counts[k] records; the tables say where each record lies and its size.
PyRawSource VariableRawSource(const nb::sequence& shards, I64Array counts, I64Array offsets,
                              I32Array heights, I32Array widths) {
  std::vector<RawShard> raw;
  std::vector<nb::object> keep;
  const int64_t total = ByteShards(shards, counts, &raw, &keep);
  const int64_t n = static_cast<int64_t>(offsets.shape(0));
  if (total != n || static_cast<int64_t>(heights.shape(0)) != n ||
      static_cast<int64_t>(widths.shape(0)) != n)
    throw nb::value_error(("offsets, heights and widths need one entry per record (" +
                           std::to_string(total) + "), got " + std::to_string(n) + ", " +
                           std::to_string(heights.shape(0)) + ", " +
                           std::to_string(widths.shape(0)))
                              .c_str());
  RecordTable table;
  table.offsets = offsets.data();
  table.heights = heights.data();
  table.widths = widths.data();
  RawSource src;
  Check(RawSource::CreateVariable(std::move(raw), table, &src));
  for (int64_t i = 0; i < n; ++i) Check(src.CheckRecord(i));  // once, here: not per batch
  std::vector<nb::object> tables{nb::cast(offsets), nb::cast(heights), nb::cast(widths)};
  return PyRawSource{std::move(src), std::move(keep), std::move(tables)};
}

}  // namespace

// The out_dtype name, checked against the array it describes.
static OutDType ParseDType(const std::string& s, const OutArray& out) {
  OutDType t;
  Check(ParseOutDType(s, &t));
  const nb::dlpack::dtype d = out.dtype();
  bool ok = false;
  const char* want = OutDTypeName(t);
  switch (t) {
    case OutDType::kUint8: ok = d == nb::dtype<uint8_t>(); break;
    case OutDType::kFloat32: ok = d == nb::dtype<float>(); break;
    case OutDType::kBfloat16:
      ok = d == nb::dtype<uint16_t>() ||
           (d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && d.bits == 16);
      want = "bfloat16 (or its uint16 view)";
      break;
  }
  if (!ok)
    throw nb::type_error(("out_dtype='" + s + "' needs an out array of " + want +
                          ", got dtype code " + std::to_string(d.code) + " with " +
                          std::to_string(d.bits) + " bits")
                             .c_str());
  return t;
}

// The gather arguments every kernel entry takes, checked (see common.h).
GatherRequest ParseGatherRequest(const IndexArray& indices, const OutArray& out,
                                 const std::string& layout, const std::string& out_dtype,
                                 const std::array<double, 3>& mean,
                                 const std::array<double, 3>& std,
                                 const std::optional<CropArray>& crop,
                                 const std::optional<FlipArray>& flip) {
  GatherRequest r;
  r.batch = static_cast<int64_t>(indices.shape(0));
  r.indices = indices.data();
  Check(ParseLayout(layout, &r.layout));
  r.dtype = ParseDType(out_dtype, out);
  if (crop) {
    if (static_cast<int64_t>(crop->shape(0)) != r.batch)
      throw nb::value_error(("crop has " + std::to_string(crop->shape(0)) +
                             " rows but indices has " + std::to_string(r.batch))
                                .c_str());
    r.crops = crop->data();
  }
  if (flip) {
    if (static_cast<int64_t>(flip->shape(0)) != r.batch)
      throw nb::value_error(("flip has " + std::to_string(flip->shape(0)) +
                             " entries but indices has " + std::to_string(r.batch))
                                .c_str());
    const nb::dlpack::dtype d = flip->dtype();
    if (d != nb::dtype<uint8_t>() && d != nb::dtype<bool>())
      throw nb::type_error("flip must be a uint8 or bool array");
    r.flips = static_cast<const uint8_t*>(flip->data());
  }
  for (int c = 0; c < 3; ++c) {
    r.mean[c] = mean[c];
    r.std[c] = std[c];
  }
  r.out = out.data();
  for (int d = 0; d < 4; ++d) r.out_shape[d] = static_cast<int64_t>(out.shape(d));
  return r;
}

void SetPatches(GatherRequest* r, int64_t patch, const std::optional<SizeArray>& sizes) {
  if ((patch > 0) != sizes.has_value() || patch < 0)
    throw nb::value_error("patch > 0 and sizes go together (NaFlex rows), or neither");
  if (!sizes) return;
  if (static_cast<int64_t>(sizes->shape(0)) != r->batch)
    throw nb::value_error(("sizes has " + std::to_string(sizes->shape(0)) +
                           " rows but indices has " + std::to_string(r->batch))
                              .c_str());
  r->patch = patch;
  r->out_sizes = sizes->data();
}

namespace {

// Dimension `dim` of array k of the ops tuple (its first must be `batch`), or ValueError.
void ArrayDims(const nb::tuple& ops, size_t k, int64_t batch, int64_t* out, size_t dim) {
  nb::ndarray<nb::c_contig, nb::device::cpu> a;
  if (!nb::try_cast(ops[k], a, /*convert=*/false) || a.ndim() <= dim ||
      static_cast<int64_t>(a.shape(0)) != batch)
    throw nb::value_error(
        ("ops: entry " + std::to_string(k) + " must have " + std::to_string(batch) + " rows")
            .c_str());
  *out = static_cast<int64_t>(a.shape(dim));
}

// Array `k` of the ops tuple as C-contiguous T with the given shape (-1: any), or TypeError.
template <class T>
const T* OpsArray(const nb::tuple& ops, size_t k, const char* name,
                  std::initializer_list<int64_t> shape) {
  using A = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;
  A a;
  if (!nb::try_cast(ops[k], a, /*convert=*/false) || a.ndim() != shape.size())
    throw nb::type_error((std::string("ops: ") + name + " has the wrong dtype or rank").c_str());
  size_t d = 0;
  for (int64_t want : shape) {
    if (want >= 0 && static_cast<int64_t>(a.shape(d)) != want)
      throw nb::value_error((std::string("ops: ") + name + " has the wrong shape").c_str());
    ++d;
  }
  return a.data();
}

}  // namespace

OpsRequest ParseOps(const nb::tuple& ops, int64_t batch) {
  if (ops.size() != 9) throw nb::value_error("ops must be a tuple of 9 entries");
  OpsRequest o;
  ArrayDims(ops, 0, batch, &o.num_ops, 1);
  o.codes = OpsArray<uint8_t>(ops, 0, "codes", {batch, o.num_ops});
  o.args = OpsArray<int32_t>(ops, 1, "args", {batch, o.num_ops});
  o.matrices = OpsArray<double>(ops, 2, "matrices", {batch, o.num_ops, 6});
  o.fill = OpsArray<uint8_t>(ops, 3, "fill", {o.num_ops, 3});
  o.nearest = OpsArray<uint8_t>(ops, 4, "nearest", {o.num_ops});
  ArrayDims(ops, 5, batch, &o.num_erase, 1);
  o.erase_boxes = OpsArray<int32_t>(ops, 5, "erase_boxes", {batch, o.num_erase, 4});
  o.erase_keys = OpsArray<uint32_t>(ops, 6, "erase_keys", {batch});
  o.erase_mode = static_cast<EraseMode>(nb::cast<int>(ops[7]));
  o.normal_table = OpsArray<float>(ops, 8, "normal_table", {kNormalTableSize});
  return o;
}

namespace {

// float32 or bfloat16 by name, for the normalization helpers (uint8 is never normalized).
OutDType ParseFloatDType(const std::string& s) {
  OutDType t;
  Check(ParseOutDType(s, &t, "dtype"));
  if (t == OutDType::kUint8)
    throw nb::value_error((std::string("dtype='") + OutDTypeName(t) +
                           "' is not normalized: ask for '" + OutDTypeName(OutDType::kFloat32) +
                           "' or '" + OutDTypeName(OutDType::kBfloat16) + "'")
                              .c_str());
  return t;
}

template <class T>
nb::ndarray<nb::numpy, T, nb::shape<3, 256>> TableArray(const std::array<double, 3>& mean,
                                                        const std::array<double, 3>& std,
                                                        void (*build)(const double*, const double*,
                                                                      T*)) {
  auto* table = new T[3 * 256];
  nb::capsule owner(table, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  build(mean.data(), std.data(), table);
  return nb::ndarray<nb::numpy, T, nb::shape<3, 256>>(table, {3, 256}, owner);
}

}  // namespace

int64_t ByteShards(const nb::sequence& shards, const I64Array& counts, std::vector<RawShard>* raw,
                   std::vector<nb::object>* keep) {
  size_t k = 0;
  int64_t total = 0;
  for (nb::handle item : shards) {
    ByteArray a;
    if (!nb::try_cast(item, a, /*convert=*/false))
      throw nb::type_error(("shards[" + std::to_string(k) +
                            "] must be a C-contiguous uint8 NumPy array on the CPU, got " +
                            nb::inst_name(item).c_str())
                               .c_str());
    if (k >= counts.shape(0)) throw nb::value_error("counts has fewer entries than shards");
    raw->push_back({a.data(), counts.data()[k], static_cast<int64_t>(a.size())});
    total += counts.data()[k];
    keep->push_back(nb::borrow(item));
    ++k;
  }
  if (k != counts.shape(0)) throw nb::value_error("counts must have one entry per shard");
  return total;
}

void BindKernel(nb::module_& m) {
  nb::class_<PyRawSource>(m, "RawSource",
                          "N records of HxWx3 uint8 (RGB) held in one or more shard arrays, "
                          "read as one sequence. Holds references to the arrays.")
      .def("__init__", &InitRawSource, nb::arg("shards"),
           "shards: list of C-contiguous uint8 arrays of shape (N_k, H, W, 3), same H and W.")
      .def_static("variable", &VariableRawSource, nb::arg("shards"), nb::arg("counts").noconvert(),
                  nb::arg("offsets").noconvert(), nb::arg("heights").noconvert(),
                  nb::arg("widths").noconvert(),
                  "Records of different sizes: shards[k] (uint8 bytes) holds counts[k] records; "
                  "record i is heights[i] x widths[i] x 3 at byte offsets[i] of its shard.")
      .def_prop_ro("uniform", [](const PyRawSource& s) { return s.source.uniform(); })
      .def_prop_ro("num_records", [](const PyRawSource& s) { return s.source.num_records(); })
      .def_prop_ro("height", [](const PyRawSource& s) { return s.source.height(); })
      .def_prop_ro("width", [](const PyRawSource& s) { return s.source.width(); })
      .def_prop_ro("num_shards", [](const PyRawSource& s) { return s.arrays.size(); })
      .def_prop_ro("shards",
                   [](const PyRawSource& s) {
                     nb::list l;
                     for (const nb::object& a : s.arrays) l.append(a);
                     return l;
                   })
      .def("__len__", [](const PyRawSource& s) { return s.source.num_records(); })
      .def("__repr__", [](const PyRawSource& s) {
        return "RawSource(num_records=" + std::to_string(s.source.num_records()) +
               ", height=" + std::to_string(s.source.height()) +
               ", width=" + std::to_string(s.source.width()) +
               ", num_shards=" + std::to_string(s.arrays.size()) + ")";
      });

  m.def(
      "gather",
      [](const PyRawSource& src, IndexArray indices, OutArray out, const std::string& layout,
         const std::string& out_dtype, std::array<double, 3> mean, std::array<double, 3> std,
         std::optional<CropArray> crop, std::optional<FlipArray> flip, std::optional<nb::tuple> ops,
         int64_t patch, std::optional<SizeArray> sizes) {
        GatherRequest r =
            ParseGatherRequest(indices, out, layout, out_dtype, mean, std, crop, flip);
        SetPatches(&r, patch, sizes);
        OpsRequest o;
        if (ops) {
          o = ParseOps(*ops, r.batch);
          r.ops = &o;
        }
        Status s;
        {
          nb::gil_scoped_release release;
          s = Gather(src.source, r);
        }
        Check(s);
      },
      nb::arg("source"), nb::arg("indices").noconvert(), nb::arg("out").noconvert(),
      nb::arg("layout"), nb::arg("out_dtype"), nb::arg("mean"), nb::arg("std"),
      nb::arg("crop").noconvert().none(), nb::arg("flip").noconvert().none(),
      nb::arg("ops").none() = nb::none(), nb::arg("patch") = 0,
      nb::arg("sizes").noconvert().none() = nb::none(),
      "Fused gather -> crop/resize -> flip -> normalize -> dtype/layout into `out` "
      "(see tbljax.kernels.gather, which validates and documents the arguments).");

  m.def(
      "kernel_target",
      [] {
        SimdTarget t;
        Check(ActiveSimdTarget(&t));
        return std::string(SimdTargetName(t));
      },
      "The SIMD target the kernel, the resize and the CRC run: scalar, avx2 or avx512.");
  m.def(
      "set_kernel_target",
      [](const std::string& name) {
        Check(SetSimdTarget(name));
        SimdTarget t;
        Check(ActiveSimdTarget(&t));
        return std::string(SimdTargetName(t));
      },
      nb::arg("name"),
      "Force the SIMD target of the kernel, the resize and the CRC ('auto', 'scalar', 'avx2', "
      "'avx512'); for tests.");
  m.def(
      "_normalization_path",
      [](std::array<double, 3> mean, std::array<double, 3> std, const std::string& dtype) {
        const OutDType t = ParseFloatDType(dtype);
        Check(CheckNormalization(mean.data(), std.data()));
        return std::string(NormPathName(ChooseNormPath(mean.data(), std.data(), t)));
      },
      nb::arg("mean"), nb::arg("std"), nb::arg("dtype"),
      "How the SIMD targets normalize for these parameters: 'affine-f32', 'affine-f64' or "
      "'table' (all bit-identical; for tests).");
  m.def(
      "_set_normalization_path_limit",
      [](const std::string& name) {
        NormPath p;
        Check(ParseNormPath(name, &p, "limit"));
        SetNormPathLimit(p);
      },
      nb::arg("limit"), "Tests only: the best normalization path the SIMD targets may take.");
  m.def(
      "feistel_permute",
      [](IndexArray positions, int64_t n, std::array<uint32_t, kShuffleRounds> keys, int a, int b) {
        // Called by tbljax.order.permute, which has checked positions and n.
        if (n < 2 || a < 1 || b < 0 || a > 31 || b > 31 || a + b > 62)
          throw nb::value_error("feistel_permute: bad n or half widths");
        const int64_t count = static_cast<int64_t>(positions.shape(0));
        auto* out = new int64_t[static_cast<size_t>(count > 0 ? count : 1)];
        nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
        FeistelPermute(positions.data(), count, n, keys.data(), a, b, out);
        return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(out, {static_cast<size_t>(count)},
                                                            owner);
      },
      nb::arg("positions").noconvert(), nb::arg("n"), nb::arg("keys"), nb::arg("a"), nb::arg("b"),
      "The shuffle of tbljax.order.permute for int64 positions already checked to lie in [0, n).");
  // ---- the batch contract (contract.h), exported so Python never retypes it ----
  m.attr("RESIZE_WEIGHT_BITS") = kResizeWeightBits;
  {
    nb::list layouts, dtypes;
    for (Layout l : kLayouts) layouts.append(LayoutName(l));
    for (OutDType t : kOutDTypes) dtypes.append(OutDTypeName(t));
    m.attr("LAYOUTS") = nb::tuple(layouts);
    m.attr("OUT_DTYPES") = nb::tuple(dtypes);
  }
  m.attr("GATHER_TARGET") = kGatherTarget;
  m.attr("GATHER_PACKED_TARGET") = kGatherPackedTarget;
  m.attr("GATHER_OPS_TARGET") = kGatherOpsTarget;
  m.attr("GATHER_PACKED_OPS_TARGET") = kGatherPackedOpsTarget;
  // threads arguments: 0 for the default pool, else a pool of 1..MAX_THREADS (common.h).
  m.attr("MAX_THREADS") = kMaxThreads;
  m.def(
      "normalize_table",
      [](std::array<double, 3> mean, std::array<double, 3> std,
         const std::string& dtype) -> nb::object {
        const OutDType t = ParseFloatDType(dtype);
        Check(CheckNormalization(mean.data(), std.data()));
        if (t == OutDType::kFloat32)
          return nb::cast(TableArray<float>(mean, std, NormalizeTableF32));
        return nb::cast(TableArray<uint16_t>(mean, std, NormalizeTableBf16));
      },
      nb::arg("mean"), nb::arg("std"), nb::arg("dtype"),
      nb::sig("def normalize_table(mean: collections.abc.Sequence[float], "
              "std: collections.abc.Sequence[float], dtype: str) -> "
              "numpy.typing.NDArray[numpy.float32] | numpy.typing.NDArray[numpy.uint16]"),
      "The normalization contract as a new (3, 256) array: table[c, x] is the float32 (dtype "
      "'float32') or the bfloat16 bit pattern as uint16 (dtype 'bfloat16') nearest to "
      "(x/255 - mean[c]) / std[c] computed in float64 -- the kernel's own table. ValueError "
      "unless every mean is finite and every std finite and > 0.");
  m.def(
      "check_normalization",
      [](std::array<double, 3> mean, std::array<double, 3> std) {
        Check(CheckNormalization(mean.data(), std.data()));
      },
      nb::arg("mean"), nb::arg("std"),
      "ValueError unless every mean is finite and every std finite and > 0 (the kernel's "
      "check and message).");
  m.def(
      "check_indices",
      [](IndexArray indices, int64_t n) {
        Check(CheckIndices(indices.data(), static_cast<int64_t>(indices.shape(0)), n));
      },
      nb::arg("indices").noconvert(), nb::arg("n"),
      "IndexError naming the first position and value unless every int64 index is in "
      "[0, n) (the kernel's check and message).");
  m.def(
      "check_crops",
      [](CropArray crop, int64_t height, int64_t width, int64_t out_h, int64_t out_w) {
        Check(CheckCrops(crop.data(), static_cast<int64_t>(crop.shape(0)), height, width, out_h,
                         out_w));
      },
      nb::arg("crop").noconvert(), nb::arg("height"), nb::arg("width"), nb::arg("out_h") = 0,
      nb::arg("out_w") = 0,
      "ValueError naming the first box unless every int32 row (y0, x0, h, w) is a non-empty "
      "box inside a height x width image whose resize to (out_h, out_w) stays in the kernel's "
      "exact int32 range (the kernel's check and message; 0: size not checked).");
  m.def(
      "check_crops_per_record",
      [](CropArray crop, I32Array heights, I32Array widths, int64_t out_h, int64_t out_w) {
        const int64_t b = static_cast<int64_t>(crop.shape(0));
        if (static_cast<int64_t>(heights.shape(0)) != b ||
            static_cast<int64_t>(widths.shape(0)) != b)
          throw nb::value_error("heights and widths need one entry per crop box");
        for (int64_t i = 0; i < b; ++i)
          Check(CheckCropBox(i, crop.data() + 4 * i, heights.data()[i], widths.data()[i], out_h,
                             out_w));
      },
      nb::arg("crop").noconvert(), nb::arg("heights").noconvert(), nb::arg("widths").noconvert(),
      nb::arg("out_h"), nb::arg("out_w"),
      "check_crops where box b lies in a record of its own heights[b] x widths[b].");

  m.def(
      "set_vbmi_allowed", [](bool allowed) { SetSimdVbmi(allowed); }, nb::arg("allowed"),
      "Whether the avx512 target may use AVX-512 VBMI where the CPU has it (default True); off, "
      "it runs its code without VBMI, the same bytes. For tests.");
  m.def(
      "supported_kernel_targets",
      [] {
        std::vector<std::string> v;
        for (SimdTarget t : SupportedSimdTargets()) v.emplace_back(SimdTargetName(t));
        return v;
      },
      "The SIMD targets this CPU can run, best last.");
}

}  // namespace tbljax::py
