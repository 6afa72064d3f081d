// The JPEG encoder over libjpeg-turbo (EncodeJpeg, decode.h), for making data sets and tests.
// libjpeg's errors leave Compress by longjmp, so it holds only trivially destructible locals.
#include <csetjmp>
#include <cstdlib>
#include <string>

#include "decode.h"
#include "libjpeg_plumbing.h"
#include "names.h"

namespace tbljax {
namespace {

using jpeg_detail::ErrorMgr;
using jpeg_detail::InitErrorMgr;

struct Encoder {
  jpeg_compress_struct cinfo;
  ErrorMgr err;
  bool created = false;
  unsigned char* buf = nullptr;  // malloc'ed by libjpeg's memory destination
  unsigned long len = 0;
  Encoder() { InitErrorMgr(&err); }
  ~Encoder() {
    if (created) jpeg_destroy_compress(&cinfo);
    std::free(buf);
  }
};

bool Compress(Encoder* e, const uint8_t* pixels, int height, int width, int channels,
              ptrdiff_t row_stride, const EncodeOptions& o) {
  if (setjmp(e->err.jump)) return false;
  jpeg_compress_struct* c = &e->cinfo;
  c->err = &e->err.pub;
  jpeg_create_compress(c);
  e->created = true;
  jpeg_mem_dest(c, &e->buf, &e->len);
  c->image_width = static_cast<JDIMENSION>(width);
  c->image_height = static_cast<JDIMENSION>(height);
  c->input_components = channels;
  c->in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(c);
  jpeg_set_quality(c, o.quality, TRUE);
  c->dct_method = JDCT_ISLOW;
  if (channels == 3) {
    const int h = o.subsampling == ChromaSubsampling::k444 ? 1 : 2;
    const int v = o.subsampling == ChromaSubsampling::k420 ? 2 : 1;
    c->comp_info[0].h_samp_factor = h;
    c->comp_info[0].v_samp_factor = v;
    for (int i = 1; i < 3; ++i) c->comp_info[i].h_samp_factor = c->comp_info[i].v_samp_factor = 1;
  }
  c->restart_interval = static_cast<unsigned int>(o.restart_mcus);
  if (o.progressive) jpeg_simple_progression(c);
  jpeg_start_compress(c, TRUE);
  while (c->next_scanline < c->image_height) {
    // libjpeg takes non-const rows but only reads them.
    JSAMPROW r =
        const_cast<JSAMPROW>(pixels + static_cast<ptrdiff_t>(c->next_scanline) * row_stride);
    jpeg_write_scanlines(c, &r, 1);
  }
  jpeg_finish_compress(c);
  return true;
}

}  // namespace

const char* ChromaSubsamplingName(ChromaSubsampling s) {
  switch (s) {
    case ChromaSubsampling::k444: return "444";
    case ChromaSubsampling::k422: return "422";
    case ChromaSubsampling::k420: return "420";
  }
  return "?";
}

Status ParseChromaSubsampling(std::string_view name, ChromaSubsampling* out) {
  return ParseByName(name, kChromaSubsamplings, ChromaSubsamplingName, "subsampling", out);
}

Status EncodeJpeg(const uint8_t* pixels, int height, int width, int channels, ptrdiff_t row_stride,
                  const EncodeOptions& options, std::vector<uint8_t>* out) {
  if (channels != 1 && channels != 3)
    return InvalidArgument("encode_jpeg takes 1 (gray) or 3 (RGB) channels, got " +
                           std::to_string(channels));
  if (height < 1 || width < 1 || height > JPEG_MAX_DIMENSION || width > JPEG_MAX_DIMENSION)
    return InvalidArgument("encode_jpeg: image size " + std::to_string(height) + "x" +
                           std::to_string(width) + " outside [1, " +
                           std::to_string(JPEG_MAX_DIMENSION) + "]");
  if (options.quality < 1 || options.quality > 100)
    return InvalidArgument("encode_jpeg: quality must be in [1, 100], got " +
                           std::to_string(options.quality));
  if (options.restart_mcus < 0 || options.restart_mcus > 65535)
    return InvalidArgument("encode_jpeg: restart_mcus must be in [0, 65535] (0: none), got " +
                           std::to_string(options.restart_mcus));
  Encoder e;
  if (!Compress(&e, pixels, height, width, channels, row_stride, options))
    return InvalidArgument(std::string("cannot encode JPEG: ") + e.err.message);
  out->assign(e.buf, e.buf + e.len);
  return Status::Ok();
}

}  // namespace tbljax
