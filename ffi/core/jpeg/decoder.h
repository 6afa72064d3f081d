// The decoder over libjpeg and its steps, shared by the whole-image decode (decode.cpp) and
// the box decode (decode_box.cpp). Private to the jpeg room. libjpeg reports errors by calling
// back into us; we leave its frames with longjmp, so the functions that call setjmp hold only
// trivially destructible locals and everything with a destructor lives in their callers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode.h"
#include "libjpeg_plumbing.h"
#include "resize.h"  // PixelRect
#include "status.h"

namespace tbljax::jpeg_detail {

struct PartEntropy;  // decode_box.cpp

// One libjpeg decompressor with our error manager and memory source (libjpeg_plumbing.h).
struct Decoder {
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  MemSource src;
  bool created = false;
  int orientation = 1;
  PartEntropy* entropy = nullptr;  // when set, the coefficients come from it (DecodeRestartPart)
  Decoder() { InitErrorMgr(&err); }
  ~Decoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// The stored (unoriented) image at the decode scale, as libjpeg will emit it.
struct Geometry {
  int w = 0, h = 0;            // stored size at 1/scale_denom
  int imcu_w = 0, imcu_h = 0;  // an iMCU (the unit libjpeg crops and skips by), in those pixels
  bool windowable = false;     // whether Decompress may crop and skip (see SetUpDecode)
};

// Columns [x, x + w), rows [y, y + h) of the stored image at the decode scale.
struct Window {
  int x = 0, y = 0, w = 0, h = 0;
};

// n rounded up to a multiple of 64 (a cache line: decoded rows and planes start on one).
inline size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

// Bytes from p to the first address at `phase` bytes past a 64-byte boundary (buffers are
// allocated 63 bytes over for it).
inline size_t BytesToPhase(const void* p, size_t phase = 0) {
  return (phase - reinterpret_cast<uintptr_t>(p)) & 63;
}

// Where decoded rows lie in their buffer: the first `offset` bytes in, `stride` bytes apart.
struct RowsAt {
  size_t offset = 0, stride = 0;
};

// Checks the bytes, reads the header and the EXIF orientation into *d, and says what they hold.
Status Open(Decoder* d, const uint8_t* data, size_t size, JpegInfo* info);

// Sets the fixed decode recipe and the scale, and says what libjpeg will emit. Returns false
// after a libjpeg error (message in d->err).
bool SetUpDecode(Decoder* d, int scale_denom, Geometry* g);

// The stored window to decode so that the displayed pixels `need` come out exactly as a
// whole-image decode gives them. Where a window edge lies inside the image, the pixels next
// to it can differ from a whole decode: at a cropped column edge the chroma upsampler sees an
// image edge instead of the next samples, and after skipped rows its context rows are not
// those of the rows above. So the window reaches one iMCU past `need` to the left, to the
// right and above (the effect is 1-2 pixels deep), and starts on an iMCU row. Below, rows
// come out in order and nothing later changes them, so it only runs on to an iMCU row
// boundary, where skipping the rest starts cleanly (libjpeg-turbo's skip has mishandled
// starts inside a row group: issue #915).
Window StoredWindow(const PixelRect& need, const Geometry& g, int o);

// Decodes the stored window `want` (at the scale SetUpDecode set) into *pixels and applies
// the EXIF orientation (through *spare, swapped in: an image without orientation is never
// copied). *shown: where the pixels lie in the displayed image at that scale; rows of
// shown->x1 - shown->x0 pixels, placed in *pixels as *at says (see Decompress; `pad_rows` only
// pads an image shown as stored).
Status DecodeOriented(Decoder* d, const Geometry& g, const Window& want, bool pad_rows,
                      std::vector<uint8_t>* pixels, std::vector<uint8_t>* spare,
                      std::vector<uint8_t>* row, PixelRect* shown, RowsAt* at,
                      bool whole_stream = true);

// After jpeg_start_decompress (which has checked the scan's tables): our entropy decoder in
// place of libjpeg's, for the scan's MCU layout (decode_box.cpp). Decompress calls it when
// d->entropy is set.
void InstallPartEntropy(j_decompress_ptr c, PartEntropy* f);

}  // namespace tbljax::jpeg_detail
