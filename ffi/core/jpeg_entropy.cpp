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

// The zigzag order, and 16 more entries for an AC run that runs past the block (corrupt data):
// libjpeg writes such a coefficient at the last position, so do we.
constexpr uint8_t kNaturalOrder[64 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
    40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
    29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

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
        t->symbol_bits_ = std::max(t->symbol_bits_, l + (dc ? symbols[p] : symbols[p] & 15));
        if (l > kLookup) continue;
        const int sym = symbols[p], spare = kLookup - l;
        const int first = code << spare, fill = 1 << spare;
        for (int j = 0; j < fill; ++j) a.lookup[first + j] = static_cast<uint16_t>(l << 8 | sym);
        // A whole symbol in the lookup bits: its code, then s extra bits (a DC difference
        // is a symbol of run 0 that does not end a block).
        const int run = dc ? 0 : sym >> 4, s = dc ? sym : sym & 15;
        if (l + s > kLookup || (!dc && s == 0 && run != 0 && run != 15)) continue;
        const int advance = !dc && s == 0 && run == 0 ? 64 : 1;  // end of block, or the next
        for (int j = 0; j < fill; ++j) {
          const uint32_t extra = s ? static_cast<uint32_t>(j >> (spare - s)) & ((1u << s) - 1) : 0;
          const int32_t v = s ? Extend(extra, s) : 0;
          a.fast[first + j] = static_cast<int32_t>(static_cast<uint32_t>(v) << 16 | advance << 8 |
                                                   run << 4 | (l + s));
        }
      }
      a.maxcode[l] = code - 1;
    }
    if (code >= (int32_t{1} << l))
      return InvalidArgument("bad Huffman table: the codes overflow length " + std::to_string(l));
    code <<= 1;
  }
  return Status::Ok();
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
  next_ = data_.data();
  bits_ = 0;
  count_ = 0;
  std::fill(std::begin(last_dc_), std::end(last_dc_), 0);
  bad_code_ = false;
}

namespace {

// One segment's reading state, kept in registers while blocks are decoded.
struct BitCursor {
  uint64_t bits;  // the next bits of the stream, first bit highest
  int count;      // how many of them are valid
  const uint8_t* next;

  // After a refill at least 56 bits are valid: one code and its extra bits (31 at most). The
  // bits past `count` are the stream's next ones already, so OR-ing them in again is a no-op
  // (the branch-free refill of F. Giesen's "Reading bits in far too many ways").
  void Refill() {
    bits |= LoadBigEndian64(next) >> count;
    next += (63 - count) >> 3;
    count |= 56;
  }
  uint32_t Take(int n) {
    const uint32_t v = static_cast<uint32_t>(bits >> (64 - n));
    bits <<= n;
    count -= n;
    return v;
  }
};

// One block's decoding: DC first, then AC steps until the block ends.
struct BlockState {
  // k at or past this: a code its table does not hold was met (in k, not a flag of its own: the
  // lockstep loop's state has to fit in registers). A valid block ends below: 63 + 15 + 64.
  static constexpr int kBad = 1 << 10;
  int16_t* block;
  int k;
  bool bad() const { return k >= kBad; }
};

// A symbol by its code (one the lookup does not hold whole); -1 for a code not in the table.
inline int SlowSymbol(BitCursor& c, const HuffmanTable::Arrays& t) {
  const uint16_t e = t.lookup[c.bits >> (64 - kLookup)];
  if (e != 0) {
    c.Take(e >> 8);
    return e & 0xFF;
  }
  const uint32_t code16 = static_cast<uint32_t>(c.bits >> 48);
  int l = kLookup + 1;
  while (l <= 16 && static_cast<int32_t>(code16 >> (16 - l)) > t.maxcode[l]) ++l;
  if (l > 16) return -1;
  const int index = static_cast<int>(code16 >> (16 - l)) + t.valoffset[l];
  c.Take(l);
  return t.symbols[index];
}

// The DC difference (after a refill: the caller's).
inline void DecodeDc(BitCursor& c, const HuffmanTable::Arrays& dc, int32_t* last_dc,
                     BlockState& b) {
  int32_t diff;
  if (const int32_t e = dc.fast[c.bits >> (64 - kLookup)]; e != 0) {
    diff = e >> 16;
    c.Take(e & 15);
  } else {
    const int s = SlowSymbol(c, dc);
    if (s < 0) {
      b.k = BlockState::kBad;
      return;
    }
    diff = s ? Extend(c.Take(s), s) : 0;
  }
  // Wrapping like libjpeg's int on malformed data, without the undefined behaviour.
  *last_dc = static_cast<int32_t>(static_cast<uint32_t>(*last_dc) + static_cast<uint32_t>(diff));
  ZeroBlock(b.block);  // here, not in a pass before: it is in cache
  b.block[0] = static_cast<int16_t>(*last_dc);
  b.k = 1;
}

// One AC symbol (after a refill: the caller's); false once the block has ended (or a code was
// bad).
inline bool StepAc(BitCursor& c, const HuffmanTable::Arrays& ac, BlockState& b) {
  const int32_t e = ac.fast[c.bits >> (64 - kLookup)];
  if (e != 0) {  // 96% of AC symbols (code + extra bits <= 10)
    b.k += (e >> 4) & 15;
    b.block[kNaturalOrder[b.k]] = static_cast<int16_t>(e >> 16);
    c.Take(e & 15);
    b.k += (e >> 8) & 0x7F;
    return b.k < 64;
  }
  const int rs = SlowSymbol(c, ac);
  if (rs < 0) {
    b.k = BlockState::kBad;
    return false;
  }
  const int run = rs >> 4, size = rs & 15;
  if (size != 0) {
    b.k += run;
    b.block[kNaturalOrder[b.k]] = static_cast<int16_t>(Extend(c.Take(size), size));
    ++b.k;
  } else {
    b.k = run == 15 ? b.k + 16 : 64;  // a run of 16 zeros, or the end of the block
  }
  return b.k < 64;
}

}  // namespace

size_t SegmentDecoder::Used() const {
  return static_cast<size_t>(next_ - data_.data()) * 8 - static_cast<size_t>(count_);
}

// N segments' MCUs in lockstep. Each segment is one serial chain (bits -> lookup -> bits), so
// one stream leaves most of the core idle; N independent chains overlap in it. Unrolled over N,
// the cursors stay in registers. N = 4 measured 4-6% slower than 2 on a whole box decode (AMD
// Zen 4: benchmarks/README.md, "Four segments in lockstep").
// kTwo: two symbols per refill, for tables whose longest symbol (code and extra bits) is at most
// 28 bits, so that two fit in the 56 a refill leaves (every table libjpeg writes: 16 + 10). A
// fast symbol costs ~35 instructions, a third of them the refill, and decoding is bound by
// their number more than by the chain's latency (benchmarks/README.md, "Per-record costs").
template <int N, bool kTwo>
bool SegmentDecoder::Lockstep(SegmentDecoder* const* d, int16_t* const* const* blocks) {
  const McuLayout& layout = d[0]->layout_;
  BitCursor c[N];
#pragma GCC unroll 4
  for (int j = 0; j < N; ++j) c[j] = BitCursor{d[j]->bits_, d[j]->count_, d[j]->next_};
  // One AC symbol; with kTwo a refill comes before every other symbol (`fresh`: just refilled).
  const auto step = [](BitCursor& cur, const HuffmanTable::Arrays& ac, BlockState& b, bool fresh) {
    if (!kTwo || !fresh) cur.Refill();
    return StepAc(cur, ac, b);
  };
  bool bad = false;
  for (int i = 0; i < layout.blocks && !bad; ++i) {
    const HuffmanTable::Arrays& dc = layout.dc[i]->arrays();
    const HuffmanTable::Arrays& ac = layout.ac[i]->arrays();
    const int comp = layout.component[i];
    BlockState b[N];
    bool on[N], all = true;
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) {
      b[j] = BlockState{blocks[j][i], 0};
      c[j].Refill();
      DecodeDc(c[j], dc, &d[j]->last_dc_[comp], b[j]);
      on[j] = b[j].k < 64 && step(c[j], ac, b[j], kTwo);  // with the DC's refill
      all = all && on[j];
    }
    // All N blocks step together while none has ended, then the others finish alone.
    while (all) {
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) on[j] = step(c[j], ac, b[j], false);
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) all = all && on[j];
      if (!kTwo || !all) break;
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) on[j] = step(c[j], ac, b[j], true);
#pragma GCC unroll 4
      for (int j = 0; j < N; ++j) all = all && on[j];
    }
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) {
      while (on[j]) {
        on[j] = step(c[j], ac, b[j], false);
        if (kTwo && on[j]) on[j] = step(c[j], ac, b[j], true);
      }
      d[j]->bad_code_ = d[j]->bad_code_ || b[j].bad();
      // A bad code, or past the data's end: stop before the padding runs out (checked below).
      bad = bad || b[j].bad() ||
            static_cast<size_t>(c[j].next - d[j]->data_.data()) * 8 > d[j]->data_bits_ + 64;
    }
  }
  bool ok = !bad;
#pragma GCC unroll 4
  for (int j = 0; j < N; ++j) {
    d[j]->bits_ = c[j].bits;
    d[j]->count_ = c[j].count;
    d[j]->next_ = c[j].next;
    ok = ok && d[j]->Used() <= d[j]->data_bits_;
  }
  return ok;
}

Status SegmentDecoder::DecodeMcu(int16_t* const* blocks) {
  SegmentDecoder* self = this;
  DecodeMcus(&self, &blocks, 1);
  if (bad_code_) return DecodeError("corrupt JPEG data: bad Huffman code");
  if (Used() > data_bits_) return DecodeError("corrupt JPEG data: premature end of data segment");
  return Status::Ok();
}

bool SegmentDecoder::DecodeMcus(SegmentDecoder* const* d, int16_t* const* const* blocks, int n) {
  static_assert(kMaxLockstep == 2, "a Lockstep<N> for each N up to kMaxLockstep");
  // Two symbols fit in the bits a refill leaves (56) when neither is longer than half of them.
  if (d[0]->layout_.symbol_bits <= 28)
    return n == 2 ? Lockstep<2, true>(d, blocks) : Lockstep<1, true>(d, blocks);
  return n == 2 ? Lockstep<2, false>(d, blocks) : Lockstep<1, false>(d, blocks);
}

Status SegmentDecoder::Finish() const {
  const size_t used = Used();
  if (data_bits_ - used >= 8)
    return DecodeError("corrupt JPEG data: " + std::to_string((data_bits_ - used) / 8) +
                       " extraneous bytes before marker");
  return Status::Ok();
}

}  // namespace tbljax
