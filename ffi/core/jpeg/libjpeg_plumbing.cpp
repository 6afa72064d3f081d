// libjpeg's error and input plumbing (see libjpeg_plumbing.h).
#include "libjpeg_plumbing.h"

#include <cstring>
#include <string>

#include <jerror.h>

namespace tbljax::jpeg_detail {
namespace {

[[noreturn]] void Fail(j_common_ptr cinfo, bool warning) {
  auto* e = reinterpret_cast<ErrorMgr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  e->warning = warning;
  std::longjmp(e->jump, 1);
}

void OnError(j_common_ptr cinfo) { Fail(cinfo, false); }

// libjpeg "warns" about corrupt data and carries on with grey fill; for a dataset that is a
// silently wrong image, so every warning fails the decode. The one exception says nothing
// about the pixels: an unknown JFIF version number.
void OnMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  if (cinfo->err->msg_code == JWRN_JFIF_MAJOR) return;
  Fail(cinfo, true);
}

const JOCTET kEoi[2] = {0xFF, JPEG_EOI};

boolean FillInput(j_decompress_ptr cinfo) {
  auto* s = reinterpret_cast<MemSource*>(cinfo->src);
  s->eof_hit = true;
  s->pub.next_input_byte = kEoi;
  s->pub.bytes_in_buffer = sizeof(kEoi);
  return TRUE;
}

void SkipInput(j_decompress_ptr cinfo, long n) {
  jpeg_source_mgr* src = cinfo->src;
  if (n <= 0) return;
  while (static_cast<size_t>(n) > src->bytes_in_buffer) {
    n -= static_cast<long>(src->bytes_in_buffer);
    FillInput(cinfo);
  }
  src->next_input_byte += n;
  src->bytes_in_buffer -= static_cast<size_t>(n);
}

}  // namespace

void InitErrorMgr(ErrorMgr* e) {
  jpeg_std_error(&e->pub);
  e->pub.error_exit = OnError;
  e->pub.emit_message = OnMessage;
  e->pub.output_message = [](j_common_ptr) {};  // the core never prints
  e->warning = false;
  e->message[0] = '\0';
}

Status DecodeFailure(const ErrorMgr& e, bool input_ended) {
  const char* what = input_ended ? "truncated JPEG (the data ends before the image does): "
                     : e.warning ? "corrupt JPEG data: "
                                 : "cannot decode JPEG: ";
  return DecodeError(what + std::string(e.message));
}

Status CheckJpegMagic(const uint8_t* p, size_t n) {
  if (n == 0 || p == nullptr) return DecodeError("not a JPEG: input is empty (0 bytes)");
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return Status::Ok();
  const char* kind = nullptr;
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) kind = "PNG";
  else if (n >= 6 && (std::memcmp(p, "GIF87a", 6) == 0 || std::memcmp(p, "GIF89a", 6) == 0))
    kind = "GIF";
  else if (n >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0)
    kind = "WebP";
  else if (n >= 4 && (std::memcmp(p, "II*\0", 4) == 0 || std::memcmp(p, "MM\0*", 4) == 0))
    kind = "TIFF";
  else if (n >= 12 && std::memcmp(p + 4, "ftyp", 4) == 0) kind = "ISO-BMFF (HEIF/AVIF)";
  else if (n >= 2 && p[0] == 'B' && p[1] == 'M') kind = "BMP";
  std::string head;
  char hex[4];
  for (size_t i = 0; i < n && i < 4; ++i) {
    std::snprintf(hex, sizeof(hex), i ? " %02x" : "%02x", p[i]);
    head += hex;
  }
  return DecodeError(std::string("not a JPEG") +
                     (kind ? std::string(" (looks like ") + kind + ")" : "") + ": " +
                     std::to_string(n) + " bytes starting " + head);
}

void InitMemSource(MemSource* s, const uint8_t* data, size_t size) {
  s->pub.init_source = [](j_decompress_ptr) {};
  s->pub.fill_input_buffer = FillInput;
  s->pub.skip_input_data = SkipInput;
  s->pub.resync_to_restart = jpeg_resync_to_restart;
  s->pub.term_source = [](j_decompress_ptr) {};
  s->pub.next_input_byte = data;
  s->pub.bytes_in_buffer = size;
  s->eof_hit = false;
}

}  // namespace tbljax::jpeg_detail
