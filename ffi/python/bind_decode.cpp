// Python bindings for JPEG decode/encode and resize: the batch hot path (GIL released, one
// image per pool task) and single-image helpers that give exactly the same pixels.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "decode.h"
#include "resize.h"
#include "thread_pool.h"

namespace tbljax::py {
namespace {

using Batch = nb::ndarray<uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu>;
using AnyU8 = nb::ndarray<const uint8_t, nb::device::cpu>;
using Out3 = nb::ndarray<nb::numpy, uint8_t, nb::ndim<3>>;

// A read-only view of any bytes-like object (bytes, bytearray, memoryview, mmap, contiguous
// numpy array) through the buffer protocol: no copy. Release needs the GIL.
class BytesView {
 public:
  explicit BytesView(nb::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw nb::type_error(("expected a bytes-like object (bytes, bytearray, memoryview), got " +
                            std::string(nb::type_name(obj.type()).c_str()))
                               .c_str());
    }
    held_ = true;
  }
  BytesView(BytesView&& o) noexcept : view_(o.view_), held_(o.held_) { o.held_ = false; }
  BytesView(const BytesView&) = delete;
  ~BytesView() {
    if (held_) PyBuffer_Release(&view_);
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

ResizeMode ModeOf(const std::string& name) {
  ResizeMode mode;
  Check(ParseResizeMode(name, &mode));
  return mode;
}

ChromaSubsampling SubsamplingOf(const std::string& name) {
  ChromaSubsampling s;
  Check(ParseChromaSubsampling(name, &s));
  return s;
}

// Hands an RgbImage's buffer to numpy without copying.
Out3 ToNumpy(RgbImage&& img) {
  auto* owned = new std::vector<uint8_t>(std::move(img.pixels));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  size_t shape[3] = {static_cast<size_t>(img.height), static_cast<size_t>(img.width), 3};
  return Out3(owned->data() + img.offset, 3, shape, owner);
}

}  // namespace

void BindDecode(nb::module_& m) {
  m.attr("JPEG_IDCT") = kJpegIdctName;
  m.attr("RESIZE_FILTER") = kResizeFilterName;
  {
    nb::list modes, square;
    for (ResizeMode mode : kResizeModes) {
      modes.append(ResizeModeName(mode));
      if (ResizeModeIsSquare(mode)) square.append(ResizeModeName(mode));
    }
    m.attr("RESIZE_MODES") = nb::tuple(modes);
    m.attr("SQUARE_RESIZE_MODES") = nb::tuple(square);  // every output S x S
    m.attr("DEFAULT_RESIZE_MODE") = ResizeModeName(kDefaultResizeMode);
  }
  m.attr("DCT_SCALE_MIN_RATIO") = kDctScaleMinRatio;
  m.attr("MAX_JPEG_PIXELS") = kMaxJpegPixels;

  m.def(
      "decode_resize_into",
      [](nb::list payloads, Batch out, const std::string& mode_name, int threads) {
        const ResizeMode mode = ModeOf(mode_name);
        CheckThreads(threads);
        if (!ResizeModeIsSquare(mode))
          Check(
              InvalidArgument(std::string("decode_resize_into needs a fixed output size: mode '") +
                              mode_name + "' varies per image, use decode_resize"));
        const size_t n = nb::len(payloads);
        if (out.shape(0) != n || out.shape(1) != out.shape(2) || out.shape(3) != 3)
          Check(InvalidArgument("out must have shape (" + std::to_string(n) + ", S, S, 3) for " +
                                std::to_string(n) + " payloads, got (" +
                                std::to_string(out.shape(0)) + ", " + std::to_string(out.shape(1)) +
                                ", " + std::to_string(out.shape(2)) + ", " +
                                std::to_string(out.shape(3)) + ")"));
        const int size = static_cast<int>(out.shape(1));
        if (size < 1 || size > kMaxResizeSize)
          Check(InvalidArgument("out: S must be in [1, " + std::to_string(kMaxResizeSize) +
                                "], got " + std::to_string(size)));
        std::vector<BytesView> views;
        views.reserve(n);
        for (nb::handle h : payloads) views.emplace_back(h);
        std::vector<Status> status(n);
        {
          nb::gil_scoped_release release;
          uint8_t* base = out.data();
          const size_t item = static_cast<size_t>(size) * size * 3;
          PoolFor(threads).ParallelFor(static_cast<int64_t>(n), [&](int64_t i) {
            status[i] =
                DecodeResizeInto(views[i].data(), views[i].size(), size, mode, base + i * item);
          });
        }
        std::vector<std::optional<std::string>> result(n);
        for (size_t i = 0; i < n; ++i)
          if (!status[i].ok()) result[i] = status[i].message();
        return result;
      },
      nb::arg("payloads"), nb::arg("out").noconvert(),
      nb::arg("mode") = ResizeModeName(kDefaultResizeMode), nb::arg("threads") = 0,
      "Decodes JPEG payloads and resizes each into out[i] (uint8, (B, S, S, 3), C-contiguous).\n\n"
      "Runs without the GIL on the thread pool (threads 0: the default pool). Returns one entry\n"
      "per payload: None on success, else the error message (out[i] is then zeroed). Input that "
      "is\n"
      "not a JPEG gives a message starting 'not a JPEG', so the caller can fall back to Pillow.\n\n"
      "    errs = _core.decode_resize_into([jpeg_bytes], np.empty((1, 160, 160, 3), np.uint8))");

  m.def(
      "decode_jpeg",
      [](nb::handle data, int scale_denom) {
        BytesView v(data);
        RgbImage img;
        Status st;
        {
          nb::gil_scoped_release release;
          st = DecodeJpeg(v.data(), v.size(), &img, scale_denom);
        }
        Check(st);
        return ToNumpy(std::move(img));
      },
      nb::arg("data"), nb::arg("scale_denom") = 1,
      "Decodes a JPEG to an (H, W, 3) uint8 RGB array with EXIF orientation applied.\n\n"
      "scale_denom 2, 4 or 8 decodes at that fraction in the DCT domain (libjpeg's scaled IDCT).\n"
      "Raises tbljax.DecodeError for corrupt, truncated or non-JPEG input.");

  m.def(
      "jpeg_info",
      [](nb::handle data) {
        BytesView v(data);
        JpegInfo info;
        Check(ReadJpegInfo(v.data(), v.size(), &info));
        nb::dict d;
        d["width"] = info.width;
        d["height"] = info.height;
        d["components"] = info.components;
        d["color_space"] = info.color_space;
        d["orientation"] = info.orientation;
        d["progressive"] = info.progressive;
        return d;
      },
      nb::arg("data"),
      "Reads a JPEG header: width/height (after EXIF orientation), components, libjpeg color\n"
      "space, EXIF orientation and progressive flag. Decodes no pixels.");

  m.def(
      "resize",
      [](AnyU8 img, int size, const std::string& mode_name, int max_long_side) {
        const ResizeMode mode = ModeOf(mode_name);
        if (img.ndim() != 3 || img.shape(2) != 3)
          Check(InvalidArgument("resize takes an (H, W, 3) uint8 image, got ndim " +
                                std::to_string(img.ndim())));
        const int h = static_cast<int>(img.shape(0)), w = static_cast<int>(img.shape(1));
        ResizePlan plan;
        Check(PlanResize(h, w, size, mode, &plan, max_long_side));
        RgbImage out;
        out.height = plan.out_h;
        out.width = plan.out_w;
        out.pixels.resize(static_cast<size_t>(plan.out_h) * plan.out_w * 3);
        Status st;
        {
          nb::gil_scoped_release release;
          // Any row stride works; pixels must be packed RGB, otherwise pack them once.
          const uint8_t* src = img.data();
          ptrdiff_t stride = img.stride(0);
          std::vector<uint8_t> packed;
          if (img.stride(1) != 3 || img.stride(2) != 1) {
            packed.resize(static_cast<size_t>(h) * w * 3);
            for (int y = 0; y < h; ++y)
              for (int x = 0; x < w; ++x)
                for (int c = 0; c < 3; ++c)
                  packed[(static_cast<size_t>(y) * w + x) * 3 + c] =
                      src[y * img.stride(0) + x * img.stride(1) + c * img.stride(2)];
            src = packed.data();
            stride = static_cast<ptrdiff_t>(w) * 3;
          }
          st = ResizeRgb(src, h, w, stride, plan, out.pixels.data(),
                         static_cast<ptrdiff_t>(plan.out_w) * 3);
        }
        Check(st);
        return ToNumpy(std::move(out));
      },
      nb::arg("img").noconvert(), nb::arg("size"),
      nb::arg("mode") = ResizeModeName(kDefaultResizeMode), nb::arg("max_long_side") = 0,
      "Resizes an (H, W, 3) uint8 RGB image with the decoder's filter and geometry, so images\n"
      "decoded elsewhere (Pillow for PNG) get exactly the same resize as decode_resize.\n"
      "max_long_side: the cap on the longer side of mode 'shorter_side' (0: none).");

  m.def(
      "decode_resize",
      [](nb::handle data, int size, const std::string& mode_name, int max_long_side) {
        const ResizeMode mode = ModeOf(mode_name);
        BytesView v(data);
        RgbImage img;
        Status st;
        {
          nb::gil_scoped_release release;
          st = DecodeResize(v.data(), v.size(), size, mode, &img, max_long_side);
        }
        Check(st);
        return ToNumpy(std::move(img));
      },
      nb::arg("data"), nb::arg("size"), nb::arg("mode") = ResizeModeName(kDefaultResizeMode),
      nb::arg("max_long_side") = 0,
      "Decodes one JPEG and resizes it (any mode; 'max_side' and 'shorter_side' give a per-image\n"
      "size; max_long_side caps the longer side of 'shorter_side', 0: none).\n"
      "Same pixels as decode_resize_into for the fixed-size modes.");

  m.def(
      "encode_jpeg",
      [](AnyU8 img, int quality, const std::string& subsampling, bool progressive,
         int restart_mcus) {
        EncodeOptions o;
        o.quality = quality;
        o.progressive = progressive;
        o.restart_mcus = restart_mcus;
        o.subsampling = SubsamplingOf(subsampling);
        const bool gray = img.ndim() == 2;
        if (!(gray || (img.ndim() == 3 && img.shape(2) == 3)))
          Check(InvalidArgument("encode_jpeg takes an (H, W, 3) or (H, W) uint8 image"));
        const int channels = gray ? 1 : 3;
        if (img.stride(1) != channels || (!gray && img.stride(2) != 1))
          Check(InvalidArgument(
              "encode_jpeg needs packed pixels (rows may be strided): use np.ascontiguousarray"));
        std::vector<uint8_t> bytes;
        Status st;
        {
          nb::gil_scoped_release release;
          st = EncodeJpeg(img.data(), static_cast<int>(img.shape(0)),
                          static_cast<int>(img.shape(1)), channels, img.stride(0), o, &bytes);
        }
        Check(st);
        return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      nb::arg("img").noconvert(), nb::arg("quality") = 90, nb::arg("subsampling") = "420",
      nb::arg("progressive") = false, nb::arg("restart_mcus") = 0,
      "Encodes an (H, W, 3) RGB or (H, W) gray uint8 image as JPEG bytes (libjpeg, ISLOW DCT).\n"
      "restart_mcus: a restart marker every that many MCUs (0: none), which lets a crop box's\n"
      "decode skip the entropy-coded data it does not need.");

  m.def(
      "encode_jpeg_batch",
      [](nb::list images, int quality, const std::string& subsampling, int threads,
         int restart_mcus) {
        EncodeOptions o;
        o.quality = quality;
        o.restart_mcus = restart_mcus;
        o.subsampling = SubsamplingOf(subsampling);
        CheckThreads(threads);
        using Image = nb::ndarray<const uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
        const size_t n = nb::len(images);
        std::vector<Image> views;  // holds a reference to each array while the GIL is released
        views.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          Image img;
          if (!nb::try_cast(images[i], img, false) || img.shape(2) != 3)
            Check(InvalidArgument("encode_jpeg_batch: image " + std::to_string(i) +
                                  " is not a C-contiguous (H, W, 3) uint8 array"));
          views.push_back(img);
        }
        std::vector<std::vector<uint8_t>> encoded(n);
        std::vector<Status> status(n);
        {
          nb::gil_scoped_release release;
          PoolFor(threads).ParallelFor(static_cast<int64_t>(n), [&](int64_t i) {
            const Image& v = views[i];
            const int w = static_cast<int>(v.shape(1));
            status[i] = EncodeJpeg(v.data(), static_cast<int>(v.shape(0)), w, 3,
                                   static_cast<ptrdiff_t>(w) * 3, o, &encoded[i]);
          });
        }
        nb::list out;
        for (size_t i = 0; i < n; ++i) {
          if (!status[i].ok())
            Check(InvalidArgument("encode_jpeg_batch: image " + std::to_string(i) + ": " +
                                  status[i].message()));
          out.append(
              nb::bytes(reinterpret_cast<const char*>(encoded[i].data()), encoded[i].size()));
        }
        return out;
      },
      nb::arg("images"), nb::arg("quality") = 90, nb::arg("subsampling") = "420",
      nb::arg("threads") = 0, nb::arg("restart_mcus") = 0,
      "Encodes a list of (H, W, 3) uint8 RGB arrays (C-contiguous, sizes may differ) as JPEG\n"
      "bytes, one image per task on the thread pool without the GIL (threads 0: the default\n"
      "pool). Same bytes as encode_jpeg with the same quality, subsampling and restart_mcus.\n\n"
      "    blobs = _core.encode_jpeg_batch([img0, img1], quality=90, subsampling='420')");
}

void CheckThreads(int threads) {
  if (threads < 0 || threads > kMaxThreads)
    Check(InvalidArgument("threads must be 0 (the default pool) or 1.." +
                          std::to_string(kMaxThreads) + ", got " + std::to_string(threads)));
}

ThreadPool& PoolFor(int threads) {
  if (threads == 0) return ThreadPool::Default();
  static std::mutex mu;
  static auto* pools = new std::map<int, std::unique_ptr<ThreadPool>>();  // leaked, like Default()
  std::lock_guard<std::mutex> lock(mu);
  auto& p = (*pools)[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads, "tbljax-decode");
  return *p;
}

}  // namespace tbljax::py
