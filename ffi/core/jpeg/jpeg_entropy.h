// Huffman entropy decoding of a baseline JPEG's restart segments, our own: the DCT coefficients
// of each block, exactly those libjpeg-turbo's decoder produces (the same values, the same
// tolerance of an AC run past the block's end, the same cases it warns about -- which fail
// here). DecodeJpegBox (decode.h) feeds them to libjpeg in place of its own entropy decoder,
// so the dequantization, IDCT, upsampling and colour conversion stay libjpeg-turbo's, and the
// pixels are bit for bit those of a plain libjpeg-turbo decode.
//
// Why our own: compact records carry a restart marker every 2 MCUs, and libjpeg-turbo's fast
// Huffman path gives up at every marker it sees coming and re-decodes that MCU on its slow,
// bit-at-a-time path, so about half of every box went the slow way. Here a segment is first
// unstuffed into a padded buffer (its end known from jpeg_restart.h's walk), so the bit reader
// refills without a branch and a lookup decodes most AC coefficients (code and extra bits) at
// once. Measured in benchmarks/README.md ("the entropy decoder").
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "status.h"

namespace tbljax {

// A DHT table, derived for decoding: counts[l] codes of length l (l = 1..16; counts[0]
// unused), then its symbols in code order.
class HuffmanTable {
 public:
  static constexpr int kLookupBits = 10;
  // InvalidArgument for a table libjpeg would refuse too: more than 256 symbols, code lengths
  // that overflow their length, a DC symbol over 15.
  static Status Build(const uint8_t counts[17], const uint8_t* symbols, bool dc, HuffmanTable* out);
  // Whether `counts` and `symbols` are the ones this table was built from (a record's tables
  // are usually those of the record before: rebuilt only when they change).
  bool Same(const uint8_t counts[17], const uint8_t* symbols, bool dc) const;

  // What decoding reads, together.
  struct Arrays {
    // By the next kLookupBits bits of the stream: length << 8 | symbol of a code at most
    // that long, or 0 (longer: compared with maxcode).
    uint16_t lookup[1 << kLookupBits];
    // By the same bits: a whole symbol whose code and extra bits fit in them (length 0:
    // none). The decoder reads each field with a load of its own, which on x86 costs less than
    // shifting and masking them out of one word. For AC it moves `step` coefficients on and
    // stores `value` in the one before: step is the zero run plus one, and 64 for the end of
    // the block (whose 0 then lands on the last coefficient, still zero, and the block ends),
    // so the end of block and a run of 16 zeros (run 15, value 0) take the same path as any
    // coefficient. For DC, value is the difference.
    // An AC entry may hold the next symbol too, where both fit in the lookup bits and the first
    // does not end the block (half of the AC symbols of q90 photos start such a pair): then
    // step2 and value2 are the second's, `length` covers both and `length1` the first alone.
    // The decoder takes the second only if the block has not ended at the first (its last
    // coefficient). A single symbol has step2 0 and value2 == value (storing it again is
    // harmless) and length1 == length.
    struct FastSymbol {
      uint8_t length;  // code and extra bits (of both, for a pair)
      uint8_t step;
      int16_t value;
      uint8_t length1;  // of the first symbol alone
      uint8_t step2;
      int16_t value2;
    };
    FastSymbol fast[1 << kLookupBits];
    int32_t maxcode[17];    // the largest code of each length (-1: none)
    int32_t valoffset[17];  // symbol index of a code of that length = code + valoffset
    uint8_t symbols[256];
    // The zigzag order by the position after: before[k] is the natural index of the
    // (k - 1)-th coefficient (so a step stores and moves on with one addition), then 63 for the
    // positions an end of block or an AC run past the block reaches (k < 64, plus a step of at
    // most 64: below 128). A copy in every table: the decoding loop reaches it through the
    // table's register, where a table of its own took one more register per symbol (GCC
    // rematerialized its address at every symbol).
    uint8_t before[128];
  };
  const Arrays& arrays() const { return arrays_; }
  // The longest symbol: code length plus extra bits (at most 16 + 15).
  int symbol_bits() const { return symbol_bits_; }

 private:
  static void PairFastSymbols(Arrays* a);
  Arrays arrays_ = {};
  uint8_t counts_[17] = {};
  int num_symbols_ = 0;
  int symbol_bits_ = 0;
  bool dc_ = false;
};

// The layout of one MCU of the scan: which component each of its blocks belongs to and the
// tables that decode it.
struct McuLayout {
  static constexpr int kMaxBlocks = 10;  // D_MAX_BLOCKS_IN_MCU
  int blocks = 0;
  int component[kMaxBlocks] = {};  // index in the scan, for the DC predictor
  const HuffmanTable* dc[kMaxBlocks] = {};
  const HuffmanTable* ac[kMaxBlocks] = {};
  int symbol_bits = 31;  // the longest symbol of its tables (symbol_bits()); 31 until known
};

// The decoding loop of one SIMD target (jpeg_entropy.inc, compiled once per target by
// simd_dispatch.h's driver): kLevel is the target's SimdTarget value.
template <int kLevel>
struct SegmentLoop;

// Decodes restart segments one after another, MCU by MCU, or two segments at once.
class SegmentDecoder {
 public:
  // The decoding loop is the active SIMD target's (simd.h) when the decoder is made.
  explicit SegmentDecoder(const McuLayout& layout);
  // Starts the segment held by bytes [begin, end) of the scan (stuffed, as in the file; fill
  // bytes before the next marker may be included): DC predictors reset, as at a restart.
  void Start(const uint8_t* begin, const uint8_t* end);
  // Decodes the next MCU into blocks[0 .. layout.blocks) (64 coefficients each, natural order;
  // each block is zeroed before its coefficients are stored). DecodeError when a code is not in its
  // table (libjpeg's "bad Huffman code") or the segment's data ends before the MCU does.
  Status DecodeMcu(int16_t* const* blocks);
  // The next MCU of each of n decoders (1 <= n <= kMaxLockstep; the same layout, different
  // segments) at once, their work interleaved: blocks[j] are decoder j's. True when every one
  // decoded its MCU as DecodeMcu would; false when one failed, and then the others may have
  // stopped early too (DecodeMcu on each, from its segment's start, names the first failure).
  static constexpr int kMaxLockstep = 2;
  static bool DecodeMcus(SegmentDecoder* const* decoders, int16_t* const* const* blocks, int n);
  // After the segment's last MCU: DecodeError when a whole byte or more of its data is left
  // over ("extraneous bytes before marker"). Stricter than libjpeg-turbo, which warns only
  // when its bit buffer had not yet reached the marker (4 to 6 stray bytes pass there).
  Status Finish() const;

 private:
  template <int kLevel>
  friend struct SegmentLoop;
  using Loop = bool (*)(SegmentDecoder* const* d, int16_t* const* const* blocks, int n);
  size_t Used() const;  // bits of data_ read so far
  const McuLayout& layout_;
  Loop loop_;                       // DecodeMcus of the active target's SegmentLoop
  std::vector<uint8_t> data_;       // the segment unstuffed, then zero padding
  const uint8_t* begin_ = nullptr;  // data_.data(), for the loops (which call nothing of std::)
  size_t data_bits_ = 0;            // bits of real data in data_
  const uint8_t* next_ = nullptr;   // the byte of the next unread bit
  int used_ = 0;                    // how many of its bits have been read (0-7)
  int32_t last_dc_[4] = {};
  bool bad_code_ = false;  // a code its table does not hold was met
};

}  // namespace tbljax
