// EXIF orientation (see exif.h).
#include "exif.h"

#include <cstring>

namespace tbljax::jpeg_detail {

int ExifOrientation(const uint8_t* p, size_t n) {
  if (n < 6 + 8 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* t = p + 6;
  const size_t tn = n - 6;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') le = true;
  else if (t[0] == 'M' && t[1] == 'M') le = false;
  else return 1;
  auto u16 = [&](size_t o) -> uint32_t { return le ? t[o] | t[o + 1] << 8 : t[o] << 8 | t[o + 1]; };
  auto u32 = [&](size_t o) -> uint32_t {
    return le ? u16(o) | u16(o + 2) << 16 : u16(o) << 16 | u16(o + 2);
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > tn || tn - ifd < 2) return 1;
  const size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + 12 * i;
    if (e + 12 > tn) break;
    if (u16(e) != 0x0112) continue;
    const uint32_t type = u16(e + 2);
    const uint32_t v = type == 3 ? u16(e + 8) : type == 4 ? u32(e + 8) : 0;  // SHORT or LONG
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

void Orient(const uint8_t* src, int w, int h, int o, uint8_t* dst) {
  const ptrdiff_t W = w;
  ptrdiff_t base = 0, step_r = W, step_c = 1;
  switch (o) {
    case 2:
      base = W - 1;
      step_r = W;
      step_c = -1;
      break;
    case 3:
      base = (h - 1) * W + W - 1;
      step_r = -W;
      step_c = -1;
      break;
    case 4:
      base = (h - 1) * W;
      step_r = -W;
      step_c = 1;
      break;
    case 5:
      base = 0;
      step_r = 1;
      step_c = W;
      break;
    case 6:
      base = (h - 1) * W;
      step_r = 1;
      step_c = -W;
      break;
    case 7:
      base = (h - 1) * W + W - 1;
      step_r = -1;
      step_c = -W;
      break;
    case 8:
      base = W - 1;
      step_r = -1;
      step_c = W;
      break;
    default: break;
  }
  const int dh = SwapsAxes(o) ? w : h, dw = SwapsAxes(o) ? h : w;
  for (int r = 0; r < dh; ++r) {
    const uint8_t* s = src + 3 * (base + r * step_r);
    for (int c = 0; c < dw; ++c, s += 3 * step_c, dst += 3) {
      dst[0] = s[0];
      dst[1] = s[1];
      dst[2] = s[2];
    }
  }
}

}  // namespace tbljax::jpeg_detail
