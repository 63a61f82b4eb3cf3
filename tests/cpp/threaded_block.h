// ThreadedBlock: the Block concept (cpp/include/specd/detail/serial_block.h) for n CPU
// threads that meet at barriers, to run the kernels' row algorithms with several "threads"
// on a machine without a GPU. It checks what SerialBlock cannot: strided and tiled loops
// over more than one thread, scans and reductions across threads (in an order other than id
// order, as on the GPU), histograms filled concurrently, rank-0 writes followed by syncs,
// and uniform control flow (a collective reached by only some threads deadlocks the test,
// which a timeout then reports).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "specd/detail/sampling_rules.h"

namespace specd::testing {

class ThreadedBlock {
 public:
  struct Shared {
    explicit Shared(int32_t threads)
        : n(threads), d(static_cast<std::size_t>(threads)), i(static_cast<std::size_t>(threads)),
          a(static_cast<std::size_t>(threads)), flag(static_cast<std::size_t>(threads)) {}
    int32_t n;
    std::mutex m;
    std::condition_variable cv;
    int32_t arrived = 0;
    uint64_t generation = 0;
    std::vector<double> d;
    std::vector<int32_t> i;
    std::vector<detail::ArgMax> a;
    std::vector<char> flag;
    std::atomic<uint32_t> count[256];
    std::atomic<uint64_t> mass[256];
  };

  ThreadedBlock(Shared* shared, int32_t rank) : s_(shared), rank_(rank) {}

  int32_t rank() const { return rank_; }
  bool leader() const { return rank_ == 0; }
  int32_t size() const { return s_->n; }
  void sync() {
    std::unique_lock<std::mutex> lock(s_->m);
    const uint64_t generation = s_->generation;
    if (++s_->arrived == s_->n) {
      s_->arrived = 0;
      ++s_->generation;
      s_->cv.notify_all();
    } else {
      s_->cv.wait(lock, [&] { return s_->generation != generation; });
    }
  }

  // Partials are folded from the highest rank down: an order other than SerialBlock's.
  template <class T>
  T sum(T v) {
    return fold(v, [](T x, T y) { return x + y; });
  }
  template <class T>
  T max(T v) {
    return fold(v, [](T x, T y) { return x > y ? x : y; });
  }
  template <class T>
  T min(T v) {
    return fold(v, [](T x, T y) { return x < y ? x : y; });
  }
  detail::ArgMax argmax(detail::ArgMax v) {
    s_->a[static_cast<std::size_t>(rank_)] = v;
    sync();
    detail::ArgMax r = s_->a.back();
    for (int32_t k = s_->n - 2; k >= 0; --k) r = detail::better(r, s_->a[static_cast<std::size_t>(k)]);
    sync();
    return r;
  }
  bool any(bool v) {
    s_->flag[static_cast<std::size_t>(rank_)] = v ? 1 : 0;
    sync();
    bool r = false;
    for (char f : s_->flag) r = r || f != 0;
    sync();
    return r;
  }
  template <class T>
  T exclusive_sum(T v) {
    slots(static_cast<T*>(nullptr))[static_cast<std::size_t>(rank_)] = v;
    sync();
    T r = T(0);
    for (int32_t k = 0; k < rank_; ++k) r += slots(static_cast<T*>(nullptr))[static_cast<std::size_t>(k)];
    sync();
    return r;
  }

  void hist_clear() {
    sync();
    if (rank_ == 0)
      for (int32_t b = 0; b < 256; ++b) {
        s_->count[b].store(0);
        s_->mass[b].store(0);
      }
    sync();
  }
  void hist_add(int32_t bin, uint64_t mass) {
    s_->count[bin].fetch_add(1);
    s_->mass[bin].fetch_add(mass);
  }
  void hist_done() { sync(); }
  uint32_t hist_count(int32_t bin) const { return s_->count[bin].load(); }
  uint64_t hist_mass(int32_t bin) const { return s_->mass[bin].load(); }

 private:
  std::vector<double>& slots(double*) { return s_->d; }
  std::vector<int32_t>& slots(int32_t*) { return s_->i; }

  template <class T, class Op>
  T fold(T v, Op op) {
    std::vector<T>& part = slots(static_cast<T*>(nullptr));
    part[static_cast<std::size_t>(rank_)] = v;
    sync();
    T r = part.back();
    for (int32_t k = s_->n - 2; k >= 0; --k) r = op(r, part[static_cast<std::size_t>(k)]);
    sync();
    return r;
  }

  Shared* s_;
  int32_t rank_;
};

// Runs fn(block) on `threads` threads forming one block.
inline void run_threaded(int32_t threads, const std::function<void(ThreadedBlock&)>& fn) {
  ThreadedBlock::Shared shared(threads);
  std::vector<std::thread> pool;
  for (int32_t t = 0; t < threads; ++t)
    pool.emplace_back([&shared, &fn, t] {
      ThreadedBlock block(&shared, t);
      fn(block);
    });
  for (std::thread& th : pool) th.join();
}

}  // namespace specd::testing
