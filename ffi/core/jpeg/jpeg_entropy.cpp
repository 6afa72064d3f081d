// Huffman decoding of baseline restart segments (see jpeg_entropy.h). The rules follow the
// JPEG standard's Annex C and F.2.2 as libjpeg-turbo applies them (jdhuff.c): canonical codes,
// the DC difference added to the component's predictor and stored as a 16-bit value, an AC
// run that passes the 64th coefficient landing on the last one.
#include "jpeg_entropy.h"

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tbljax {

namespace {

// The zigzag order. Past it (Arrays::before), every position is the last one: libjpeg writes
// a coefficient whose AC run runs past the block (corrupt data) there, so do we.
constexpr uint8_t kNaturalOrder[64] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48,
    41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23,
    30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

// A block's codes and extra bits take at most 64 * (16 + 15) bits: the reader may run that far
// past the data's end before the check after the block (which lets 8 bytes pass), plus the 8
// bytes a refill loads.
constexpr size_t kPadding = 64 * 31 / 8 + 64;

// The value of `bits` extra bits of magnitude category s (F.2.2.1's EXTEND).
inline int32_t Extend(uint32_t bits, int s) {
  return bits < (1u << (s - 1)) ? static_cast<int32_t>(bits) - (1 << s) + 1
                                : static_cast<int32_t>(bits);
}

inline uint64_t LoadBigEndian64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

constexpr int kLookup = HuffmanTable::kLookupBits;

// A block's 64 coefficients set to zero by eight 16-byte stores. GCC makes the plain
// memset(block, 0, 128) `rep stosq`, whose start-up cost is paid at every block: on an Intel
// Xeon (AVX-512) host the stores made a whole box decode 0.95x the time (benchmarks/README.md,
// "Per-record costs on the Intel host").
inline void ZeroBlock(int16_t* block) {
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(block) + i, zero);
#else
  std::memset(block, 0, 64 * sizeof(int16_t));
#endif
}

}  // namespace

// ---------------------------------------------------------------- tables -----------------

Status HuffmanTable::Build(const uint8_t counts[17], const uint8_t* symbols, bool dc,
                           HuffmanTable* t) {
  *t = HuffmanTable();
  Arrays& a = t->arrays_;
  int n = 0;
  for (int l = 1; l <= 16; ++l) n += counts[l];
  if (n > 256) return InvalidArgument("bad Huffman table: " + std::to_string(n) + " symbols");
  std::memcpy(t->counts_, counts, 17);
  std::memcpy(a.symbols, symbols, static_cast<size_t>(n));
  std::memcpy(a.before + 1, kNaturalOrder, sizeof(kNaturalOrder));
  std::fill(std::begin(a.before) + 65, std::end(a.before), uint8_t{63});
  t->num_symbols_ = n;
  t->dc_ = dc;
  if (dc)
    for (int i = 0; i < n; ++i)
      if (symbols[i] > 15)
        return InvalidArgument("bad Huffman table: DC symbol " + std::to_string(symbols[i]));
  // Canonical codes, length by length; a length whose codes overflow it is refused (so is an
  // all-ones code, as libjpeg does).
  int32_t code = 0;
  int p = 0;
  for (int l = 1; l <= 16; ++l) {
    if (counts[l] == 0) {
      a.maxcode[l] = -1;
    } else {
      a.valoffset[l] = p - code;
      for (int i = 0; i < counts[l]; ++i, ++p, ++code) {
        // Checked before the code fills its lookup entries, which it would overrun: the
        // record's tables reach here unchecked (libjpeg builds only the part's stubs).
        if (code >= (int32_t{1} << l))
          return InvalidArgument("bad Huffman table: the codes overflow length " +
                                 std::to_string(l));
        t->symbol_bits_ = std::max(t->symbol_bits_, l + (dc ? symbols[p] : symbols[p] & 15));
        if (l > kLookup) continue;
        const int sym = symbols[p], spare = kLookup - l;
        const int first = code << spare, fill = 1 << spare;
        for (int j = 0; j < fill; ++j) a.lookup[first + j] = static_cast<uint16_t>(l << 8 | sym);
        // A whole symbol in the lookup bits: its code, then s extra bits (a DC difference
        // is a symbol of run 0 that does not end a block).
        const int run = dc ? 0 : sym >> 4, s = dc ? sym : sym & 15;
        if (l + s > kLookup || (!dc && s == 0 && run != 0 && run != 15)) continue;
        const int step = !dc && s == 0 && run == 0 ? 64 : run + 1;  // end of block, or the run
        for (int j = 0; j < fill; ++j) {
          const uint32_t extra = s ? static_cast<uint32_t>(j >> (spare - s)) & ((1u << s) - 1) : 0;
          const auto value = static_cast<int16_t>(s ? Extend(extra, s) : 0);
          a.fast[first + j] = {static_cast<uint8_t>(l + s),
                               static_cast<uint8_t>(step),
                               value,
                               static_cast<uint8_t>(l + s),
                               0,
                               value};
        }
      }
      a.maxcode[l] = code - 1;
    }
    if (code >= (int32_t{1} << l))
      return InvalidArgument("bad Huffman table: the codes overflow length " + std::to_string(l));
    code <<= 1;
  }
  if (!dc) PairFastSymbols(&a);
  return Status::Ok();
}

// Where the bits after an AC entry's symbol hold the next symbol whole, the entry takes it as
// its second (FastSymbol). Built from the single entries: the next symbol is the one the
// lookup finds at the bits that follow the first, zeros shifted in behind, when its length fits
// in the bits that are really there. An end of block ends the block: nothing pairs after it.
void HuffmanTable::PairFastSymbols(Arrays* a) {
  constexpr uint32_t kMask = (1u << kLookupBits) - 1;
  Arrays::FastSymbol single[1 << kLookupBits];
  std::memcpy(single, a->fast, sizeof(single));
  for (uint32_t i = 0; i <= kMask; ++i) {
    const Arrays::FastSymbol& f = single[i];
    if (f.length == 0 || f.step == 64) continue;
    const Arrays::FastSymbol& g = single[(i << f.length) & kMask];
    if (g.length == 0 || f.length + g.length > kLookupBits) continue;
    a->fast[i].length = static_cast<uint8_t>(f.length + g.length);
    a->fast[i].step2 = g.step;
    a->fast[i].value2 = g.value;
  }
}

bool HuffmanTable::Same(const uint8_t counts[17], const uint8_t* symbols, bool dc) const {
  if (dc != dc_ || std::memcmp(counts + 1, counts_ + 1, 16) != 0) return false;
  return std::memcmp(symbols, arrays_.symbols, static_cast<size_t>(num_symbols_)) == 0;
}

// ---------------------------------------------------------------- segments ---------------

void SegmentDecoder::Start(const uint8_t* begin, const uint8_t* end) {
  // Unstuff: FF 00 is a data byte FF (libjpeg also takes FF FF .. FF 00 as one); a run of FFs
  // that reaches the end is fill before the marker.
  data_.resize(static_cast<size_t>(end - begin) + kPadding);
  uint8_t* out = data_.data();
  const uint8_t* p = begin;
  while (p < end) {
    const void* ff = std::memchr(p, 0xFF, static_cast<size_t>(end - p));
    const uint8_t* stop = ff ? static_cast<const uint8_t*>(ff) : end;
    std::memcpy(out, p, static_cast<size_t>(stop - p));
    out += stop - p;
    p = stop;
    if (p == end) break;
    while (p < end && *p == 0xFF) ++p;
    if (p == end) break;  // fill
    *out++ = 0xFF;        // p is at the 00 (FindRestartSegments let no other byte through)
    ++p;
  }
  data_bits_ = static_cast<size_t>(out - data_.data()) * 8;
  std::memset(out, 0, kPadding);
  begin_ = next_ = data_.data();
  used_ = 0;
  std::fill(std::begin(last_dc_), std::end(last_dc_), 0);
  bad_code_ = false;
}

size_t SegmentDecoder::Used() const {
  return static_cast<size_t>(next_ - data_.data()) * 8 + static_cast<size_t>(used_);
}

// The decoding loop, once per target (jpeg_entropy.inc): for the baseline ISA, and on x86 for
// the avx2 target, whose BMI2 shifts take their count in any register where the baseline's
// must move it to cl first: one in every few instructions of the loop is a shift. No copy of
// its own for avx512, which runs avx2's.
}  // namespace tbljax

#define TBLJAX_SIMD_INC "jpeg_entropy.inc"
#define TBLJAX_SIMD_TOP 1
#include "simd_dispatch.h"

namespace tbljax {
namespace entropy_detail {
TBLJAX_SIMD_EXPORT(DecodeMcus);
}  // namespace entropy_detail

SegmentDecoder::SegmentDecoder(const McuLayout& layout)
    : layout_(layout), loop_(TBLJAX_SIMD_DISPATCH(entropy_detail::DecodeMcus)) {}

Status SegmentDecoder::DecodeMcu(int16_t* const* blocks) {
  SegmentDecoder* self = this;
  DecodeMcus(&self, &blocks, 1);
  if (bad_code_) return DecodeError("corrupt JPEG data: bad Huffman code");
  if (Used() > data_bits_) return DecodeError("corrupt JPEG data: premature end of data segment");
  return Status::Ok();
}

bool SegmentDecoder::DecodeMcus(SegmentDecoder* const* d, int16_t* const* const* blocks, int n) {
  return d[0]->loop_(d, blocks, n);
}

Status SegmentDecoder::Finish() const {
  const size_t used = Used();
  if (data_bits_ - used >= 8)
    return DecodeError("corrupt JPEG data: " + std::to_string((data_bits_ - used) / 8) +
                       " extraneous bytes before marker");
  return Status::Ok();
}

}  // namespace tbljax
