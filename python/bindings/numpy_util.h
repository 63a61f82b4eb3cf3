// Handing C++ vectors to numpy without copying: the vector is moved to the heap and owned by
// a capsule that is the array's base, so the array stays valid however long Python keeps it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

#include "specd/span.h"

namespace specd::py_bind {

template <class T>
pybind11::array_t<T> to_numpy(std::vector<T>&& values, std::vector<pybind11::ssize_t> shape = {}) {
  auto* owned = new std::vector<T>(std::move(values));
  pybind11::capsule base(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  if (shape.empty()) shape.push_back(static_cast<pybind11::ssize_t>(owned->size()));
  return pybind11::array_t<T>(shape, owned->data(), base);
}

// A 1-D, C-contiguous array of T made from any array-like (converted only when needed).
template <class T>
using InArray = pybind11::array_t<T, pybind11::array::c_style | pybind11::array::forcecast>;

template <class T>
Span<const T> as_span(const InArray<T>& a, const char* name) {
  if (a.ndim() != 1)
    throw pybind11::value_error(std::string(name) + " must be one-dimensional, got " +
                                std::to_string(a.ndim()) + " dimensions");
  return Span<const T>(a.data(), static_cast<std::size_t>(a.size()));
}

}  // namespace specd::py_bind
