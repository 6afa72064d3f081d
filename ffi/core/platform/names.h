// Enum values by name: the one way the core turns a name (a layout, a dtype, a resize mode, a
// SIMD target, ...) into its enum and back into messages. Each enum keeps one table of its
// values and one Name() function; these templates do the rest.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "status.h"

namespace tbljax {

// "a, b, c": the names of `values`.
template <class E, size_t N, class NameFn>
std::string JoinNames(const E (&values)[N], NameFn name_of) {
  std::string all;
  for (E v : values) all += (all.empty() ? "" : ", ") + std::string(name_of(v));
  return all;
}

// Sets *out to the value of `values` whose name is `name`; false (and *out untouched) if none.
template <class E, size_t N, class NameFn>
bool FindByName(std::string_view name, const E (&values)[N], NameFn name_of, E* out) {
  for (E v : values) {
    if (name == name_of(v)) {
      *out = v;
      return true;
    }
  }
  return false;
}

// FindByName, or InvalidArgument "<arg>='<name>' is not one of: a, b, c".
template <class E, size_t N, class NameFn>
Status ParseByName(std::string_view name, const E (&values)[N], NameFn name_of, const char* arg,
                   E* out) {
  if (FindByName(name, values, name_of, out)) return Status::Ok();
  return InvalidArgument(std::string(arg) + "='" + std::string(name) +
                         "' is not one of: " + JoinNames(values, name_of));
}

}  // namespace tbljax
