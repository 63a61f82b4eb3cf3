// Status: how every fallible call of the specd C++ core reports its outcome.
//
// Rules
// - The core never throws and never aborts on bad input: a call that cannot do what it was
//   asked returns a non-OK Status whose message names the argument and the values involved,
//   and leaves the object it was called on unchanged.
// - kOutOfPages is a normal, recoverable answer (the scheduler preempts or shrinks k), not an
//   error of the caller.
// - The Python layer maps each code to one exception class (specd.errors).
#pragma once

#include <sstream>
#include <string>
#include <utility>

namespace specd {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // a value outside its documented range
  kNotFound = 2,            // unknown sequence id (or other handle)
  kAlreadyExists = 3,       // a sequence id that is already live
  kOutOfRange = 4,          // a position/length past what the sequence holds
  kFailedPrecondition = 5,  // the call is valid but not in the object's current state
  kOutOfPages = 6,          // the KV page pool cannot satisfy the request right now
  kInternal = 7,            // a broken invariant: a bug in specd
};

// "OK", "INVALID_ARGUMENT", ... (stable names, used in messages and by the Python layer).
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OUT_OF_PAGES: reserve needs 2 pages, 1 free" (just "OK" when ok()).
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Builders: error_status(StatusCode::kNotFound, "unknown sequence ", id).
template <class... Args>
Status error_status(StatusCode code, const Args&... args) {
  return Status(code, detail::cat(args...));
}

}  // namespace specd

// Return early from the enclosing function when `expr` yields a non-OK Status.
#define SPECD_RETURN_IF_ERROR(expr)            \
  do {                                         \
    ::specd::Status specd_status_ = (expr);    \
    if (!specd_status_.ok()) return specd_status_; \
  } while (0)
