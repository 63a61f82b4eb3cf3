// csr_row_of: which row of a CSR offsets array [rows + 1] owns an element, by binary search,
// for host and device code alike (kernels that run one thread block per element use it).
#pragma once

#include <cstdint>

#include "specd/host_device.h"

namespace specd::detail {

// The last row r in [0, rows) with offsets[r] <= index, provided index < offsets[r + 1];
// -1 when no row owns index (index < offsets[0], index >= offsets[rows], or rows <= 0).
// Empty rows own nothing. Expects non-decreasing offsets; on other input it still reads only
// offsets[0..rows] and returns -1 or some row in [0, rows).
SPECD_HOST_DEVICE inline int32_t csr_row_of(const int32_t* offsets, int32_t rows, int64_t index) {
  if (rows <= 0 || index < offsets[0]) return -1;
  int32_t lo = 0, hi = rows;  // invariant: offsets[lo] <= index, and the answer is < hi
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (offsets[mid] <= index) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return index < offsets[lo + 1] ? lo : -1;
}

}  // namespace specd::detail
