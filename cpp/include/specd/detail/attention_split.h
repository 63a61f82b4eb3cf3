// Split-KV attention (flash-decoding): a request's KV positions [0, kv_len) are cut into
// contiguous splits, each split's softmax is computed on its own as a partial state, and the
// partial states are merged into the exact attention of the whole range. The CUDA kernel
// specd::cuda::tree_attention_grouped uses these rules; tests check them on the CPU against
// tree_attention_cpu.
//
// Plan (plan_key_split): span = the smallest multiple of `tile` that is >= max(min_keys,
// ceil(kv_len / max_splits)); splits = ceil(kv_len / span), at least 1. Split s covers
// positions [s * span, min(kv_len, (s + 1) * span)): every position in exactly one split, no
// split empty (kv_len 0: one empty split). The plan depends on kv_len alone, so a kernel reads
// it per request on the device and the host sizes its grid by max_splits only.
//
// Partial state of a split, per query row: max m of the visible keys' scores (-inf: none),
// sum l of exp(score - m) (0: none), and acc[d] = sum of exp(score - m) * v[d].
// Merge: M = max of m over the parts with l > 0; each part weighs e^(m - M) (0 for a part
// with l = 0); out[d] = sum weight * acc[d] / sum weight * l, and zeros when no part saw a key.
#pragma once

#include <cmath>
#include <cstdint>

#include "specd/host_device.h"

namespace specd::detail {

struct KeySplit {
  int32_t splits;  // >= 1
  int32_t span;    // keys per split (the last may have fewer)
};

struct KeyRange {
  int32_t begin;
  int32_t end;
};

// min_keys and tile > 0, max_splits >= 1.
SPECD_HOST_DEVICE inline KeySplit plan_key_split(int32_t kv_len, int32_t max_splits, int32_t min_keys, int32_t tile) {
  if (kv_len <= 0) return KeySplit{1, tile};
  const int32_t even = static_cast<int32_t>((int64_t{kv_len} + max_splits - 1) / max_splits);
  const int32_t want = even > min_keys ? even : min_keys;
  const int32_t span = static_cast<int32_t>((int64_t{want} + tile - 1) / tile * tile);
  return KeySplit{static_cast<int32_t>((int64_t{kv_len} + span - 1) / span), span};
}

SPECD_HOST_DEVICE inline KeyRange key_split_range(const KeySplit& plan, int32_t kv_len, int32_t s) {
  const int64_t begin = int64_t{s} * plan.span;
  const int64_t end = begin + plan.span;
  return KeyRange{static_cast<int32_t>(begin < kv_len ? begin : kv_len), static_cast<int32_t>(end < kv_len ? end : kv_len)};
}

// The weight of a part (max m, sum l) in a merge whose overall max is max_all (the largest m
// among parts with l > 0).
SPECD_HOST_DEVICE inline float softmax_part_weight(float m, float l, float max_all) {
  return l > 0.f ? expf(m - max_all) : 0.f;
}

}  // namespace specd::detail
