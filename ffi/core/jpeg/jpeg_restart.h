// Restart segments of a baseline JPEG, found and cut out by byte work alone (no libjpeg): a
// scan written with a restart interval (DRI) is a chain of independent entropy-coded segments
// (each starts with reset DC predictors), so a rectangle of whole segments is itself a valid
// JPEG that decodes to exactly the same blocks. DecodeJpegBox (decode.h) uses this to
// entropy-decode only the part of a compact record that a crop box needs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "status.h"

namespace tbljax {

// Where the parts of a single-scan Huffman JPEG lie, from our own walk over its markers.
struct JpegScanLayout {
  size_t sof = 0;   // offset of the SOF0/SOF1 segment's length field (height at +3, width at +5)
  size_t scan = 0;  // offset of the first byte of entropy-coded data (just after the SOS header)
};

// Walks the markers from SOI to the first SOS. False (not an error: the caller decodes the
// usual way) when the layout is not the plain one: no SOF0/SOF1 before the SOS, a marker
// without a length, a length that runs past the data.
bool FindJpegScan(const uint8_t* data, size_t size, JpegScanLayout* layout);

// Splits the entropy-coded data that starts at layout.scan into its restart segments:
// segment i is bytes [(*bounds)[2i], (*bounds)[2i + 1]) (fill bytes before a marker
// included; the decoder skips them). Stuffed bytes (0xFF 0x00) and fill bytes (0xFF 0xFF)
// are skipped; the data ends at EOI, or where the bytes end.
// *usable is false, and nothing is an error, when another marker sits in the data (the caller
// decodes the usual way, which reports it where it matters). A restart marker out of sequence,
// or a segment count other than `expect_segments`, is DecodeError saying so.
Status FindRestartSegments(const uint8_t* data, size_t size, const JpegScanLayout& layout,
                           int64_t expect_segments, std::vector<size_t>* bounds, bool* usable);

// A part of the image made of whole restart segments: MCU rows [row0, row1), MCU columns
// [col0, col1) of an image of mcus_per_row MCUs per row and one segment every
// `restart_mcus` MCUs (which divides mcus_per_row, col0 and col1 or col1 == mcus_per_row).
// height/width: the part's size in pixels, written into its SOF (at the image's right or
// bottom edge it must end exactly where the image does, so chroma sizes match).
struct JpegPart {
  int row0 = 0, row1 = 0, col0 = 0, col1 = 0;
  int mcus_per_row = 0, restart_mcus = 0;
  int height = 0, width = 0;
};

// Writes into *out the header of a JPEG of the part alone (everything before the entropy-coded
// data, SOF resized, each Huffman table a one-code stub), then EOI: what libjpeg reads of the
// part while DecodeJpegBox's own entropy decoder (jpeg_entropy.h), with the record's own
// tables, gives it the coefficients of the part's segments.
void CutJpegHeader(const uint8_t* data, const JpegScanLayout& layout, const JpegPart& part,
                   std::vector<uint8_t>* out);

}  // namespace tbljax
