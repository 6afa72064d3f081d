// The TBL file's checksums (tbl_format.h): zlib's CRC-32 and CRC-16/MODBUS by slicing-by-8
// tables, and the CRC-16 of longer data by carry-less multiplication where the active SIMD
// target has it (crc.inc).
#include <array>
#include <cstring>

#include "tbl_format.h"

namespace tbljax::tbl {
namespace crc_detail {
namespace {

// Slicing-by-8 tables for a reflected CRC: t[k][b] is the CRC of byte b followed by k zeros.
template <typename T>
struct CrcTables {
  std::array<std::array<T, 256>, 8> t{};
  explicit CrcTables(T poly) {
    for (uint32_t b = 0; b < 256; ++b) {
      T c = static_cast<T>(b);
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? static_cast<T>((c >> 1) ^ poly) : static_cast<T>(c >> 1);
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t b = 0; b < 256; ++b)
        t[k][b] = static_cast<T>((t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff]);
  }
  T Update(T crc, const uint8_t* p, size_t n) const {
    while (n >= 8) {
      uint64_t x;
      std::memcpy(&x, p, 8);  // little-endian hosts only (x86-64, aarch64)
      x ^= crc;
      crc = static_cast<T>(t[7][x & 0xff] ^ t[6][(x >> 8) & 0xff] ^ t[5][(x >> 16) & 0xff] ^
                           t[4][(x >> 24) & 0xff] ^ t[3][(x >> 32) & 0xff] ^
                           t[2][(x >> 40) & 0xff] ^ t[1][(x >> 48) & 0xff] ^ t[0][x >> 56]);
      p += 8;
      n -= 8;
    }
    while (n--) crc = static_cast<T>((crc >> 8) ^ t[0][(crc ^ *p++) & 0xff]);
    return crc;
  }
};

const CrcTables<uint32_t>& Crc32Tables() {
  static const CrcTables<uint32_t> tables(0xEDB88320u);
  return tables;
}
const CrcTables<uint16_t>& Crc16Tables() {
  static const CrcTables<uint16_t> tables(0xA001u);
  return tables;
}

}  // namespace

// The tables' CRC-16/MODBUS from `crc` over n bytes: how crc.inc's copies reach the tables
// (a plain function compiled outside any target region).
uint16_t Crc16TablesUpdate(uint16_t crc, const uint8_t* p, size_t n) {
  return Crc16Tables().Update(crc, p, n);
}

// x^(n-1) mod P, P = x^16 + x^15 + x^2 + 1, as a reflected 64-bit operand (x^d at bit 63 - d).
// n - 1 because a carry-less product of two reflected operands comes out one bit low.
constexpr uint64_t FoldConstant(int n) {
  uint32_t r = 1;
  for (int i = 0; i < n - 1; ++i) {
    r <<= 1;
    if (r & 0x10000) r ^= 0x18005;
  }
  uint64_t k = 0;
  for (int d = 0; d < 16; ++d)
    if ((r >> d) & 1) k |= uint64_t{1} << (63 - d);
  return k;
}

}  // namespace crc_detail
}  // namespace tbljax::tbl

#define TBLJAX_SIMD_INC "crc.inc"
#define TBLJAX_SIMD_TOP 1
#include "simd_dispatch.h"

namespace tbljax::tbl {
namespace crc_detail {
TBLJAX_SIMD_EXPORT(Crc16Modbus64);
}  // namespace crc_detail

uint32_t Crc32(const uint8_t* data, size_t n, uint32_t crc) {
  return ~crc_detail::Crc32Tables().Update(~crc, data, n);
}

uint16_t Crc16Modbus(const uint8_t* data, size_t n) {
  if (n < 64) return crc_detail::Crc16TablesUpdate(0xFFFF, data, n);
  return TBLJAX_SIMD_DISPATCH(crc_detail::Crc16Modbus64)(data, n);
}

}  // namespace tbljax::tbl
