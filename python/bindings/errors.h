// Turning core Statuses into Python exceptions of specd.errors (one class per StatusCode).
#pragma once

#include <pybind11/pybind11.h>

#include "specd/status.h"

namespace specd::py_bind {

// Raises the specd.errors exception matching status.code() with status.message().
[[noreturn]] void raise_status(const Status& status);

inline void check(const Status& status) {
  if (!status.ok()) raise_status(status);
}

}  // namespace specd::py_bind
