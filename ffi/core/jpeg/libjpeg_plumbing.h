// libjpeg's error and input plumbing, for every libjpeg call of the codec: an error manager
// that leaves libjpeg's frames by longjmp and fails on its warnings, the failure's Status, a
// check of the bytes before libjpeg sees them, and a memory source that supplies a missing
// final EOI. Private to the jpeg room.
#pragma once
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE

#include <jpeglib.h>

#include "status.h"

namespace tbljax::jpeg_detail {

// libjpeg's errors and warnings end in a longjmp to `jump` with the message in `message`
// (`warning`: it was a warning, which fails a decode all the same, see OnMessage).
struct ErrorMgr {
  jpeg_error_mgr pub;  // first, so a j_common_ptr's err can be cast back to ErrorMgr
  jmp_buf jump;
  bool warning;
  char message[JMSG_LENGTH_MAX];
};

// Sets up *e (jpeg_std_error with our handlers; the core never prints).
void InitErrorMgr(ErrorMgr* e);

// The Status of a decode that libjpeg ended: truncated data (input_ended), a warning, an error.
Status DecodeFailure(const ErrorMgr& e, bool input_ended);

// DecodeError "not a JPEG ..." naming the format where it is a common one, unless the bytes
// start as a JPEG does.
Status CheckJpegMagic(const uint8_t* p, size_t n);

// Reads from memory like jpeg_mem_src, but where the bytes end it supplies an EOI marker
// without a warning and notes it. Data that really is missing still fails: the entropy
// decoder warns ("premature end of data segment") when it needs bits beyond that marker, and
// a multi-scan image is checked after decoding. So a file that lacks only its final EOI
// (complete pixel data) decodes, and a cut-off one does not.
struct MemSource {
  jpeg_source_mgr pub;  // first, so cinfo->src can be cast back
  bool eof_hit;
};

// Points *s at `size` bytes at `data`.
void InitMemSource(MemSource* s, const uint8_t* data, size_t size);

}  // namespace tbljax::jpeg_detail
