// The one size every room agrees on: the largest image side the core handles, here below the
// file format (which stores sides as u16) and the resize (which refuses larger outputs), so
// neither has to include the other for it.
#pragma once
#include <cstdint>

namespace tbljax {

// The largest width or height of an image anywhere in the core: a TBL index stores sides as
// u16 (tbl::kMaxSide), and the resize makes nothing larger (kMaxResizeSize).
inline constexpr uint32_t kMaxImageSide = 0xFFFF;

}  // namespace tbljax
