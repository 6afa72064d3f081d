// libFuzzer harness for the crop-box decode of compact records (DecodeJpegBox): the restart
// segments found and cut (jpeg_restart.h) and Huffman-decoded by our own decoder
// (jpeg_entropy.h), their coefficients turned into pixels by libjpeg (for 4:2:0, its IDCT's
// planes upsampled and converted by jpeg_color.h). The oracle is
// libjpeg-turbo's whole decode of the same bytes (DecodeJpeg, its own entropy decoder): where
// both succeed, the box is its pixels, byte for byte. Any crash, sanitizer report, hang or
// broken postcondition is a bug.
//
// Input: the JPEG bytes followed by 4 control bytes: the box's y0, x0, h, w as fractions
// (byte / 256) of the image's height and width (h and w at least one pixel).
#include <cstdint>
#include <cstring>
#include <vector>

#include "decode.h"

using namespace tbljax;

namespace {

void Expect(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t* ctrl = data + size - 4;
  size -= 4;
  JpegInfo info;
  if (!ReadJpegInfo(data, size, &info).ok()) return 0;
  if (int64_t{info.width} * info.height > (int64_t{1} << 22)) return 0;  // keep runs fast
  JpegBoxRequest q;
  q.box[0] = ctrl[0] * info.height / 256;
  q.box[1] = ctrl[1] * info.width / 256;
  q.box[2] = 1 + ctrl[2] * (info.height - q.box[0] - 1) / 255;
  q.box[3] = 1 + ctrl[3] * (info.width - q.box[1] - 1) / 255;
  q.out_h = q.box[2];
  q.out_w = q.box[3];
  JpegBoxScratch scratch;
  JpegBoxRegion region;
  const Status bs = DecodeJpegBox(data, size, q, &scratch, &region);
  if (!bs.ok()) {
    Expect(bs.code() == Code::kDecodeError && !bs.message().empty());
    return 0;
  }
  Expect(region.scale_denom == 1 && region.box[2] == q.box[2] && region.box[3] == q.box[3]);
  Expect(region.box[0] >= 0 && region.box[1] >= 0 &&
         region.box[0] + region.box[2] <= region.height &&
         region.box[1] + region.box[3] <= region.width);
  RgbImage whole;
  if (!DecodeJpeg(data, size, &whole).ok()) return 0;  // damage the box does not need
  for (int y = 0; y < q.box[2]; ++y) {
    const uint8_t* got = region.pixels + (static_cast<size_t>(region.box[0]) + y) * region.stride +
                         region.box[1] * 3;
    const uint8_t* want =
        whole.rows() + ((static_cast<size_t>(q.box[0]) + y) * whole.width + q.box[1]) * 3;
    Expect(std::memcmp(got, want, static_cast<size_t>(q.box[3]) * 3) == 0);
  }
  return 0;
}
