// The batch contract shared by every path (see contract.h). Compiled without FMA contraction
// (CMakeLists.txt): the tables are the float64 formula exactly as written.
#include "contract.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "names.h"

namespace tbljax {

// ---------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------

const char* OutDTypeName(OutDType t) {
  switch (t) {
    case OutDType::kUint8: return "uint8";
    case OutDType::kFloat32: return "float32";
    case OutDType::kBfloat16: return "bfloat16";
  }
  return "?";
}

int OutDTypeBytes(OutDType t) {
  switch (t) {
    case OutDType::kUint8: return 1;
    case OutDType::kFloat32: return 4;
    case OutDType::kBfloat16: return 2;
  }
  return 0;
}

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kNHWC: return "NHWC";
    case Layout::kNCHW: return "NCHW";
  }
  return "?";
}

std::string OutDTypeNames() { return JoinNames(kOutDTypes, OutDTypeName); }

Status ParseOutDType(std::string_view name, OutDType* out, const char* arg) {
  return ParseByName(name, kOutDTypes, OutDTypeName, arg, out);
}

Status ParseLayout(std::string_view name, Layout* out, const char* arg) {
  return ParseByName(name, kLayouts, LayoutName, arg, out);
}

// ---------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------

Status CheckNormalization(const double mean[3], const double std[3]) {
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(mean[c]))
      return InvalidArgument("mean[" + std::to_string(c) + "] = " + FormatDouble(mean[c]) +
                             " must be a finite number");
    if (!std::isfinite(std[c]) || !(std[c] > 0.0))
      return InvalidArgument("std[" + std::to_string(c) + "] = " + FormatDouble(std[c]) +
                             " must be a finite number > 0");
  }
  return Status::Ok();
}

double NormalizeValue(int x, double mean, double std) {
  return (static_cast<double>(x) / 255.0 - mean) / std;
}

uint16_t DoubleToBfloat16(double d) {
  // Round to float32 with "round to odd" (truncate, then set the last bit if anything was
  // dropped), then to bfloat16 with ties to even. Round-to-odd keeps enough information for
  // the second rounding to be the correct one-step rounding, as float32 has 16 more bits.
  float r = static_cast<float>(d);  // nearest; step back one ulp if that went past d
  uint32_t bits;
  std::memcpy(&bits, &r, 4);
  if (std::fabs(static_cast<double>(r)) > std::fabs(d)) --bits;  // magnitude step (sign kept)
  float t;
  std::memcpy(&t, &bits, 4);
  if (static_cast<double>(t) != d && !std::isnan(d)) bits |= 1u;
  if (std::isnan(d)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stay a quiet NaN
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

void NormalizeTableF32(const double mean[3], const double std[3], float table[3 * 256]) {
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < 256; ++x)
      table[c * 256 + x] = static_cast<float>(NormalizeValue(x, mean[c], std[c]));
}

void NormalizeTableBf16(const double mean[3], const double std[3], uint16_t table[3 * 256]) {
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < 256; ++x)
      table[c * 256 + x] = DoubleToBfloat16(NormalizeValue(x, mean[c], std[c]));
}

// ---------------------------------------------------------------------------------------
// Argument checks
// ---------------------------------------------------------------------------------------

Status CheckIndices(const int64_t* indices, int64_t batch, int64_t n) {
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t i = indices[b];
    if (i < 0 || i >= n)
      return OutOfRange("indices[" + std::to_string(b) + "] = " + std::to_string(i) +
                        " is out of range for a source of " + std::to_string(n) +
                        " records (allowed 0.." + std::to_string(n - 1) + ")");
  }
  return Status::Ok();
}

namespace {

// kernel.h: per axis, 2 * out * len and 2 * M * (2 * M / out + 2) below 2^31.
bool ResizeFitsInt32(int64_t len, int64_t out) {
  const int64_t m2 = 2 * (len > out ? len : out), limit = int64_t{1} << 31;
  return 2 * out * len < limit && m2 * (m2 / out + 2) < limit;
}

}  // namespace

Status CheckCropBox(int64_t b, const int32_t* c, int64_t H, int64_t W, int64_t oh, int64_t ow) {
  const int64_t y0 = c[0], x0 = c[1], h = c[2], w = c[3];
  // Spelled only for an error: checking a box is on every sample's path.
  const auto box = [&] {
    return "crop[" + std::to_string(b) + "] = (y0=" + std::to_string(y0) +
           ", x0=" + std::to_string(x0) + ", h=" + std::to_string(h) + ", w=" + std::to_string(w) +
           ")";
  };
  if (y0 < 0 || x0 < 0 || h < 1 || w < 1 || y0 + h > H || x0 + w > W)
    return InvalidArgument(box() + " is not a non-empty box inside the " + std::to_string(H) + "x" +
                           std::to_string(W) + " image (need y0 >= 0, x0 >= 0, h >= 1, w >= 1, " +
                           "y0 + h <= " + std::to_string(H) + ", x0 + w <= " + std::to_string(W) +
                           ")");
  if (oh > 0 && ow > 0 && !(ResizeFitsInt32(h, oh) && ResizeFitsInt32(w, ow)))
    return InvalidArgument(box() + " resized to " + std::to_string(oh) + "x" + std::to_string(ow) +
                           " shrinks too much for the exact integer resize (kernel.h: per axis "
                           "2*out*len and 2*M*(2*M/out+2) must stay below 2^31)");
  return Status::Ok();
}

Status CheckCrops(const int32_t* crops, int64_t batch, int64_t H, int64_t W, int64_t oh,
                  int64_t ow) {
  for (int64_t b = 0; b < batch; ++b)
    TBLJAX_RETURN_IF_ERROR(CheckCropBox(b, crops + 4 * b, H, W, oh, ow));
  return Status::Ok();
}

Status CheckOutputSize(bool has_crops, int64_t oh, int64_t ow, int64_t H, int64_t W) {
  if (has_crops || (oh == H && ow == W)) return Status::Ok();
  return InvalidArgument("out is " + std::to_string(oh) + "x" + std::to_string(ow) +
                         " (OHxOW) but the records are " + std::to_string(H) + "x" +
                         std::to_string(W) +
                         ": without crop boxes the output size must equal the source size");
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  // The shortest digits that read back as v (what repr() prints), from "%.*e".
  char buf[40];
  for (int prec = 0; prec < 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // buf is [-]d[.ddd]e(+|-)XX: split it into sign, digits and decimal exponent.
  const char* p = buf;
  std::string sign;
  if (*p == '-') {
    sign = "-";
    ++p;
  }
  std::string digits;
  for (; *p != 'e'; ++p)
    if (*p != '.') digits += *p;
  const int exp = std::atoi(p + 1);
  // repr() writes positional notation for 1e-4 <= |v| < 1e16, else scientific.
  if (exp >= -4 && exp < 16) {
    if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    if (digits.size() <= static_cast<size_t>(exp) + 1)
      return sign + digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    return sign + digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
           digits.substr(static_cast<size_t>(exp) + 1);
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  const int a = exp < 0 ? -exp : exp;
  return sign + mantissa + "e" + (exp < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
}

}  // namespace tbljax
