// Status: how the framework-free core reports failure. The core never throws, aborts or
// prints; each front end (nanobind, XLA FFI) turns a Status into its own idiom.
#pragma once
#include <string>
#include <utility>

namespace tbljax {

enum class Code : int {
  kOk = 0,
  kInvalidArgument = 1,  // caller passed something wrong        -> ValueError
  kOutOfRange = 2,       // an index outside [0, N)                -> IndexError
  kIOError = 3,          // the OS said no (open, mmap, write)     -> OSError
  kCorrupt = 4,          // a file's bytes break the format        -> tbljax.CorruptFileError
  kDecodeError = 5,      // an image could not be decoded          -> tbljax.DecodeError
  kUnimplemented = 6,    // a valid request we do not serve        -> NotImplementedError
  kCancelled = 7,        // stopped on request                     -> KeyboardInterrupt
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
inline Status IOError(std::string m) { return {Code::kIOError, std::move(m)}; }
inline Status Corrupt(std::string m) { return {Code::kCorrupt, std::move(m)}; }
inline Status DecodeError(std::string m) { return {Code::kDecodeError, std::move(m)}; }

#define TBLJAX_RETURN_IF_ERROR(expr) \
  do {                               \
    ::tbljax::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

}  // namespace tbljax
