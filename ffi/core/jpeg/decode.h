// JPEG decode (libjpeg-turbo, accurate ISLOW IDCT, fancy upsampling) to RGB uint8 HWC with
// EXIF orientation applied, decode + resize in one call, and a JPEG encoder for making data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "resize.h"
#include "status.h"

namespace tbljax {

// Where libjpeg's output rows start in the buffers this file decodes into: this many bytes past
// a 64-byte boundary. libjpeg-turbo aligns its own sample rows to 32 bytes; when the rows it
// writes our pixels into were 32-byte aligned as well (where malloc put them: so it depended on
// the memory layout, run by run), its AVX2 fancy upsampler stalled on its loads and a decode
// took 1.10-1.16x the time, a whole one as much as a box (benchmarks/README.md, "Where the
// decoded rows start").
inline constexpr size_t kRowsPhase = 16;

// An RGB uint8 image: rows of width * 3 bytes, no padding, starting `offset` bytes into
// `pixels` (kRowsPhase's, for a decode; 0 for a resize).
struct RgbImage {
  int height = 0, width = 0;
  std::vector<uint8_t> pixels;
  size_t offset = 0;
  const uint8_t* rows() const { return pixels.data() + offset; }
};

// What the header says, before any pixel is decoded. width/height are after orientation.
struct JpegInfo {
  int width = 0, height = 0;
  int components = 0;
  const char* color_space = "";  // stored: "grayscale", "rgb", "ycbcr", "cmyk", "ycck", "unknown"
  int orientation = 1;           // EXIF orientation 1..8 (1 when absent or malformed)
  bool progressive = false;
};

// libjpeg's IDCT that every decode here uses (JDCT_ISLOW), by the name Python reports it.
inline constexpr const char* kJpegIdctName = "islow";

// Images above this many pixels are refused (a 20-byte header could otherwise ask for
// gigabytes). 2^28 is 16384 x 16384.
inline constexpr int64_t kMaxJpegPixels = int64_t{1} << 28;

// DCT-domain downscaling (decoding at 1/2, 1/4 or 1/8 by libjpeg's scaled IDCT) is used
// only when the scaled resize box still has at least this many pixels per output pixel on
// both axes, so the antialiasing filter, not the IDCT, shapes the result. Measured on kodak
// and caltech101 (center_crop and squash, S = 32..224) against full decode + resize: PSNR
// median 48-56 dB per setting, worst image 34 dB (line art at S = 32), and against an
// independent Lanczos reference a median loss of 0.3-0.5 dB. Ratios near 1 lost ~3 dB
// there (two chained low-passes blur), so they are not used. 2.0 is also Pillow's default
// reducing_gap for JPEG draft in thumbnail().
inline constexpr double kDctScaleMinRatio = 2.0;

// The scale denominator (1, 2, 4 or 8) that DecodeResize uses for a box of box_w x box_h
// source pixels resized to out_w x out_h: the largest whose scaled box still covers the
// output by kDctScaleMinRatio.
int ChooseDctScale(double box_w, double box_h, int out_w, int out_h);

// Reads the header and EXIF orientation only.
Status ReadJpegInfo(const uint8_t* data, size_t size, JpegInfo* info);

// Decodes a whole JPEG to RGB with orientation applied. scale_denom 1 (full size), 2, 4 or 8
// decodes at that fraction by DCT scaling (size ceil(dim / scale_denom)).
// Failures are DecodeError with a message: input that is not a JPEG starts "not a JPEG";
// corrupt or truncated data fails even where libjpeg only warns.
Status DecodeJpeg(const uint8_t* data, size_t size, RgbImage* out, int scale_denom = 1);

// Decode + resize with the same pixels whichever entry is used. The output is
// plan.out_h x plan.out_w (see PlanResize: depends only on the oriented size, size, mode).
// Only the pixels the resize reads are transformed (libjpeg crops the columns and skips the
// rows outside them, plus a margin for chroma upsampling): the output bytes are those of a
// whole-image decode, and the whole stream is still entropy-decoded, so damage anywhere fails.
// max_long: the cap on the longer side of 'shorter_side' (see PlanResize; 0: none).
Status DecodeResize(const uint8_t* data, size_t size, int out_size, ResizeMode mode, RgbImage* out,
                    int max_long = 0);

// The hot path for fixed-size modes (center_crop, squash): writes size x size x 3 bytes at
// dst. On failure dst is zero-filled, never left with stale pixels. Thread-safe; decode
// buffers are per thread and reused.
Status DecodeResizeInto(const uint8_t* data, size_t size, int out_size, ResizeMode mode,
                        uint8_t* dst);

// ---- the part of an image one crop box needs (serving compact records, serve_jpeg.h) ----

// What DecodeJpegBox decodes: a crop box of the displayed image and the resize it feeds.
struct JpegBoxRequest {
  int32_t box[4] = {0, 0, 0, 0};   // y0, x0, h, w in the displayed (oriented) image
  int out_h = 0, out_w = 0;        // the size the box is resized to (chooses the DCT scale)
  bool dct_scale = false;          // decode at 1/2, 1/4, 1/8 where ChooseDctScale allows
  int expect_h = 0, expect_w = 0;  // the image size the caller's index says (0: unchecked)
};

// Buffers of DecodeJpegBox, kept by the caller (one per thread) and reused between images.
struct JpegBoxScratch {
  std::vector<uint8_t> pixels, spare, row;
  std::vector<uint8_t> part;          // the header of a JPEG of the box's part (jpeg_restart.h)
  std::vector<size_t> segments;       // where the record's restart segments lie
  std::vector<int16_t> coefficients;  // one MCU row of the part, as our entropy decoder gives it
  std::vector<uint8_t> planes;        // a YCbCr 4:2:0 part's decoded planes (jpeg_color.h)
};

// The decoded part: `height` rows of `width` * 3 bytes, `stride` bytes apart, at `pixels`
// (inside the scratch), holding `box` (y0, x0, h, w, shifted into it). With scale_denom k > 1
// it is the image at 1/k and the box the scaled box rounded outwards to whole pixels.
struct JpegBoxRegion {
  const uint8_t* pixels = nullptr;
  int height = 0, width = 0;
  int64_t stride = 0;  // bytes from one row to the next (at least width * 3)
  int32_t box[4] = {0, 0, 0, 0};
  int scale_denom = 1;
};

// Decodes the pixels of request.box, and only about those. A baseline Huffman record with a
// restart interval R that divides its MCUs per row, without EXIF rotation (compact records:
// tbljax.convert writes restart markers), is cut down to the restart segments covering the box
// plus a margin of one pixel at the decode scale where the box edge is not an image edge (fancy
// chroma upsampling reads one neighbour), and only that part is entropy-decoded, at the same
// scale (jpeg_restart.h), by our own Huffman decoder (jpeg_entropy.h) whose coefficients
// libjpeg turns into pixels (only in the part's iMCU columns that hold the box and its margin;
// for YCbCr 4:2:0 at scale 1, libjpeg's IDCT gives planes and jpeg_color.h makes the box's
// pixels from them); its segment count and marker sequence are checked over the whole record.
// Any other record: columns outside the box are not transformed, rows above it are
// entropy-decoded only, and decoding stops after the box's last iMCU row. Either way damage
// or truncation in data the box does not need (below it; with restart segments, also beside
// or above it) goes unnoticed: those pixels are never served. At scale 1 the region's bytes
// are those of a whole-image decode (StoredWindow's margins); from restart segments they are
// at every scale (those of a whole-image decode at 1/k). A box outside the image is
// InvalidArgument; an image of another size than expect_h x expect_w is Corrupt; bad data is
// DecodeError.
Status DecodeJpegBox(const uint8_t* data, size_t size, const JpegBoxRequest& request,
                     JpegBoxScratch* scratch, JpegBoxRegion* region);

enum class ChromaSubsampling { k444, k422, k420 };
inline constexpr ChromaSubsampling kChromaSubsamplings[] = {
    ChromaSubsampling::k420, ChromaSubsampling::k422, ChromaSubsampling::k444};
const char* ChromaSubsamplingName(ChromaSubsampling s);  // "420", "422", "444"
// By name, or InvalidArgument "subsampling='x' is not one of: 420, 422, 444".
Status ParseChromaSubsampling(std::string_view name, ChromaSubsampling* out);

struct EncodeOptions {
  int quality = 90;  // 1..100
  ChromaSubsampling subsampling = ChromaSubsampling::k420;
  bool progressive = false;
  // A restart marker every this many MCUs (DRI; 0: none). Segments a decoder can take alone:
  // DecodeJpegBox entropy-decodes only those a box needs when this divides the MCUs per row.
  int restart_mcus = 0;
};

// Encodes RGB (channels 3) or grayscale (channels 1) uint8 rows with libjpeg (ISLOW DCT).
Status EncodeJpeg(const uint8_t* pixels, int height, int width, int channels, ptrdiff_t row_stride,
                  const EncodeOptions& options, std::vector<uint8_t>* out);

}  // namespace tbljax
