// libFuzzer harness for the image path: JPEG header parsing, full and DCT-scaled decode with
// EXIF orientation, decode + resize in every mode, and the resize of raw pixels. Any crash,
// sanitizer report, hang or broken postcondition is a bug.
//
// Input: the image bytes followed by 3 control bytes:
//   [0] bits 0-1: resize mode (3 = resize the bytes as raw pixels instead of decoding)
//       bits 2-3: DCT scale 1, 2, 4, 8 for DecodeJpeg
//   [1] output size S = 1 + byte % 64
//   [2] raw-pixel path only: source width = 1 + byte % 32 (height follows from the length)
#include <cstdint>
#include <cstring>
#include <vector>

#include "decode.h"
#include "resize.h"

using namespace tbljax;

namespace {

void Expect(bool ok) {
  if (!ok) __builtin_trap();
}

// Every output byte is read so that ASan and MSan-like tools see the whole buffer.
uint32_t Sum(const std::vector<uint8_t>& v) {
  uint32_t s = 0;
  for (uint8_t c : v) s += c;
  return s;
}

void FuzzDecode(const uint8_t* data, size_t size, int mode_bits, int scale, int out_size) {
  JpegInfo info;
  const Status hs = ReadJpegInfo(data, size, &info);
  if (hs.ok())
    Expect(info.width >= 1 && info.height >= 1 && info.orientation >= 1 && info.orientation <= 8);

  RgbImage img;
  const Status ds = DecodeJpeg(data, size, &img, scale);
  if (ds.ok()) {
    Expect(hs.ok());
    Expect(img.pixels.size() == img.offset + static_cast<size_t>(img.width) * img.height * 3);
    Expect(img.width == (info.width + scale - 1) / scale &&
           img.height == (info.height + scale - 1) / scale);
  } else {
    Expect(ds.code() == Code::kDecodeError && !ds.message().empty());
  }
  volatile uint32_t sink = Sum(img.pixels);

  const ResizeMode mode = static_cast<ResizeMode>(mode_bits);
  RgbImage out;
  const Status rs = DecodeResize(data, size, out_size, mode, &out);
  if (rs.ok()) {
    ResizePlan plan;
    Expect(PlanResize(info.height, info.width, out_size, mode, &plan).ok());
    Expect(out.height == plan.out_h && out.width == plan.out_w);
    Expect(out.pixels.size() == static_cast<size_t>(out.width) * out.height * 3);
  }
  sink = sink + Sum(out.pixels);

  if (mode == ResizeMode::kCenterCrop || mode == ResizeMode::kSquash) {
    // The hot path writes exactly S*S*3 bytes; guard bytes on both sides catch overruns.
    const size_t n = static_cast<size_t>(out_size) * out_size * 3;
    std::vector<uint8_t> dst(n + 64, 0xA5);
    const Status is = DecodeResizeInto(data, size, out_size, mode, dst.data() + 32);
    Expect(is.ok() == rs.ok());
    for (size_t i = 0; i < 32; ++i) Expect(dst[i] == 0xA5 && dst[n + 32 + i] == 0xA5);
    if (is.ok()) Expect(std::memcmp(dst.data() + 32, out.pixels.data(), n) == 0);
  }
  (void)sink;
}

void FuzzResize(const uint8_t* data, size_t size, int out_size, int width, int mode_seed) {
  const int h = static_cast<int>(size / (3 * static_cast<size_t>(width)));
  for (int m = 0; m < 4; ++m) {
    const ResizeMode mode = static_cast<ResizeMode>((m + mode_seed) % 4);
    ResizePlan plan;
    const Status ps = PlanResize(h, width, out_size, mode, &plan);
    if (!ps.ok()) {
      Expect(h < 1);
      return;
    }
    std::vector<uint8_t> dst(static_cast<size_t>(plan.out_h) * plan.out_w * 3 + 64, 0xA5);
    Expect(ResizeRgb(data, h, width, static_cast<ptrdiff_t>(width) * 3, plan, dst.data(),
                     static_cast<ptrdiff_t>(plan.out_w) * 3)
               .ok());
    for (size_t i = dst.size() - 64; i < dst.size(); ++i) Expect(dst[i] == 0xA5);
    // A constant image stays constant: the weights sum to exactly one.
    bool flat = true;
    for (size_t i = 3; i < static_cast<size_t>(h) * width * 3 && flat; ++i)
      flat = data[i] == data[i % 3];
    if (flat)
      for (size_t i = 0; i < dst.size() - 64; ++i) Expect(dst[i] == data[i % 3]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t* ctrl = data + size - 3;
  size -= 3;
  const int mode_bits = ctrl[0] & 3;
  const int scale = 1 << ((ctrl[0] >> 2) & 3);
  const int out_size = 1 + ctrl[1] % 64;
  if (mode_bits == 3) {
    FuzzResize(data, size, out_size, 1 + ctrl[2] % 32, ctrl[2] / 32);
  } else {
    // Mode 2 stands for both modes that keep the aspect: max_side, or shorter_side (3).
    const int mode = mode_bits == 2 && (ctrl[2] & 1) ? 3 : mode_bits;
    FuzzDecode(size ? data : nullptr, size, mode, scale, out_size);
  }
  return 0;
}
