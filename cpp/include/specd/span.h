// Span<T>: a non-owning view of a contiguous array (pointer + size), the C++17 stand-in for
// std::span used at the core's boundaries, so callers can pass vectors, numpy buffers or
// pinned host memory without copies.
#pragma once

#include <cstddef>
#include <vector>

namespace specd {

template <class T>
class Span {
 public:
  constexpr Span() = default;
  constexpr Span(T* data, std::size_t size) : data_(data), size_(size) {}
  template <class U, class A>
  Span(const std::vector<U, A>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT: implicit
  template <class U, class A>
  Span(std::vector<U, A>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT: implicit

  constexpr T* data() const { return data_; }
  constexpr std::size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr T& operator[](std::size_t i) const { return data_[i]; }
  constexpr T* begin() const { return data_; }
  constexpr T* end() const { return data_ + size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace specd
