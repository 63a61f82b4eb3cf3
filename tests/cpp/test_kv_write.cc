// KV write (CPU reference): a worked example, agreement with a direct model of the layout on
// random inputs (strided new rows, padded pages, -1 slots), 2-byte dtypes copied bit for bit,
// strict mode, and size validation.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "block_manager_test_util.h"
#include "kv_test_util.h"
#include "specd/kv_write.h"

namespace specd::testing {
namespace {

KvWriteParams write_params(RandomPagedCache* c, const std::vector<float>& k, const std::vector<float>& v,
                           int64_t token_stride, const std::vector<int64_t>& slots) {
  KvWriteParams p;
  p.k = k.data();
  p.v = v.data();
  p.k_token_stride = token_stride;
  p.v_token_stride = token_stride;
  p.slot_mapping = slots.data();
  p.k_cache = c->k.data();
  p.v_cache = c->v.data();
  p.layout = c->layout;
  p.num_tokens = static_cast<int32_t>(slots.size());
  return p;
}

TEST(KvWriteCpu, WorkedExample) {
  // 2 pages of 2 slots, 1 head of dim 2, page_stride 5 (one unused element per page).
  PagedKvLayout l{2, 2, 1, 2, 5};
  std::vector<float> kc(10, 0.f), vc(10, 0.f);
  const std::vector<float> k{1, 2, 3, 4, 5, 6}, v{-1, -2, -3, -4, -5, -6};
  const std::vector<int64_t> slots{3, -1, 0};  // token 0 -> page 1 row 1; token 1 skipped
  KvWriteParams p;
  p.k = k.data();
  p.v = v.data();
  p.k_token_stride = p.v_token_stride = 2;
  p.slot_mapping = slots.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.layout = l;
  p.num_tokens = 3;
  SPECD_ASSERT_OK(kv_write_cpu(p, /*strict=*/true));
  EXPECT_EQ(kc, (std::vector<float>{5, 6, 0, 0, 0, 0, 0, 1, 2, 0}));
  EXPECT_EQ(vc, (std::vector<float>{-5, -6, 0, 0, 0, 0, 0, -1, -2, 0}));
}

TEST(KvWriteCpu, MatchesDirectModelOnRandomInputs) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 30; ++trial) {
    const int32_t seqs = 1 + static_cast<int32_t>(rng() % 4);
    const int32_t blocks = 1 + static_cast<int32_t>(rng() % 4);
    const int32_t bs = 1 + static_cast<int32_t>(rng() % 8);
    const int32_t heads = 1 + static_cast<int32_t>(rng() % 3);
    const int32_t dim = 1 + static_cast<int32_t>(rng() % 9);
    RandomPagedCache c = random_paged_cache(rng, seqs, blocks, bs, heads, dim);
    const RandomPagedCache before = c;
    // Every (sequence, position) once, in random order, a third of them as padding.
    std::vector<std::pair<int32_t, int32_t>> targets;
    for (int32_t s = 0; s < seqs; ++s)
      for (int32_t pos = 0; pos < blocks * bs; ++pos) targets.emplace_back(s, pos);
    std::shuffle(targets.begin(), targets.end(), rng);
    const int64_t row = int64_t{heads} * dim, stride = row + static_cast<int64_t>(rng() % 3);
    std::vector<int64_t> slots;
    std::vector<float> k(targets.size() * static_cast<std::size_t>(stride)), v(k.size());
    std::normal_distribution<float> normal;
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (const auto& [s, pos] : targets) {
      const int32_t page = c.table[static_cast<std::size_t>(s * c.stride + pos / bs)];
      slots.push_back(rng() % 3 == 0 ? -1 : int64_t{page} * bs + pos % bs);
    }
    SPECD_ASSERT_OK(kv_write_cpu(write_params(&c, k, v, stride, slots), /*strict=*/true));
    std::vector<float> want_k = before.k, want_v = before.v;
    for (std::size_t t = 0; t < targets.size(); ++t) {
      if (slots[t] < 0) continue;
      const int64_t dst = dense_row(c, targets[t].first, targets[t].second);
      for (int64_t e = 0; e < row; ++e) {
        want_k[static_cast<std::size_t>(dst + e)] = k[t * static_cast<std::size_t>(stride) + static_cast<std::size_t>(e)];
        want_v[static_cast<std::size_t>(dst + e)] = v[t * static_cast<std::size_t>(stride) + static_cast<std::size_t>(e)];
      }
    }
    EXPECT_EQ(c.k, want_k) << "trial " << trial;
    EXPECT_EQ(c.v, want_v) << "trial " << trial;
  }
}

TEST(KvWriteCpu, TwoByteDtypesAreCopiedBitForBit) {
  for (KvDtype dtype : {KvDtype::kFloat16, KvDtype::kBFloat16}) {
    PagedKvLayout l{3, 2, 2, 3, 12};
    std::vector<uint16_t> kc(36, 0xAAAA), vc(36, 0x5555);
    std::vector<uint16_t> k(12), v(12);
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<uint16_t>(0x8000u + i);
      v[i] = static_cast<uint16_t>(0x7C00u + i);
    }
    const std::vector<int64_t> slots{5, 2};
    KvWriteParams p;
    p.k = k.data();
    p.v = v.data();
    p.k_token_stride = p.v_token_stride = 6;
    p.slot_mapping = slots.data();
    p.k_cache = kc.data();
    p.v_cache = vc.data();
    p.layout = l;
    p.dtype = dtype;
    p.num_tokens = 2;
    SPECD_ASSERT_OK(kv_write_cpu(p));
    // slot 5 = page 2 row 1 -> element 2*12 + 6; slot 2 = page 1 row 0 -> element 12.
    for (int e = 0; e < 6; ++e) {
      EXPECT_EQ(kc[static_cast<std::size_t>(30 + e)], k[static_cast<std::size_t>(e)]);
      EXPECT_EQ(vc[static_cast<std::size_t>(30 + e)], v[static_cast<std::size_t>(e)]);
      EXPECT_EQ(kc[static_cast<std::size_t>(12 + e)], k[static_cast<std::size_t>(6 + e)]);
      EXPECT_EQ(vc[static_cast<std::size_t>(12 + e)], v[static_cast<std::size_t>(6 + e)]);
    }
    EXPECT_EQ(kc[0], 0xAAAA);
    EXPECT_EQ(kc[18], 0xAAAA);
  }
}

TEST(KvWriteCpu, StrictReportsSlotsPastTheCacheAndRepeats) {
  PagedKvLayout l{2, 2, 1, 1, 2};
  std::vector<float> kc(4, 0.f), vc(4, 0.f);
  const std::vector<float> k{1, 2}, v{3, 4};
  std::vector<int64_t> slots{4, 0};  // 4 == num_pages * block_size: past the end
  KvWriteParams p;
  p.k = k.data();
  p.v = v.data();
  p.k_token_stride = p.v_token_stride = 1;
  p.slot_mapping = slots.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.layout = l;
  p.num_tokens = 2;
  SPECD_EXPECT_CODE(kv_write_cpu(p, true), kOutOfRange);
  EXPECT_EQ(kc, (std::vector<float>(4, 0.f)));  // nothing written
  SPECD_ASSERT_OK(kv_write_cpu(p, false));      // the kernel's behaviour: skip it
  EXPECT_EQ(kc, (std::vector<float>{2, 0, 0, 0}));
  slots = {1, 1};
  SPECD_EXPECT_CODE(kv_write_cpu(p, true), kInvalidArgument);
}

TEST(KvWriteCpu, ValidatesSizes) {
  KvWriteParams p;
  p.layout = PagedKvLayout{1, 2, 2, 4, 16};
  p.k_token_stride = p.v_token_stride = 8;
  SPECD_ASSERT_OK(validate_kv_write(p));  // no tokens: nothing needed
  p.k_token_stride = 7;
  SPECD_EXPECT_CODE(validate_kv_write(p), kInvalidArgument);
  p.k_token_stride = 8;
  p.layout.page_stride = 15;
  SPECD_EXPECT_CODE(validate_kv_write(p), kInvalidArgument);
  p.layout.page_stride = 16;
  p.num_tokens = 1;  // now the pointers are needed
  SPECD_EXPECT_CODE(validate_kv_write(p), kInvalidArgument);
  p.num_tokens = 0;
  p.dtype = static_cast<KvDtype>(7);
  SPECD_EXPECT_CODE(validate_kv_write(p), kInvalidArgument);
}

TEST(KvLayout, DtypeNamesRoundTrip) {
  for (KvDtype d : {KvDtype::kFloat32, KvDtype::kFloat16, KvDtype::kBFloat16}) {
    KvDtype parsed = KvDtype::kFloat32;
    SPECD_ASSERT_OK(parse_kv_dtype(kv_dtype_name(d), &parsed));
    EXPECT_EQ(parsed, d);
  }
  KvDtype out;
  SPECD_EXPECT_CODE(parse_kv_dtype("float64", &out), kInvalidArgument);
  EXPECT_EQ(kv_dtype_size(KvDtype::kBFloat16), 2);
  EXPECT_EQ(kv_dtype_size(KvDtype::kFloat32), 4);
}

TEST(KvLayout, PagedSlotRule) {
  const std::vector<int32_t> row{4, -1, 9, 2};
  EXPECT_EQ(paged_kv_slot(row.data(), 4, 8, 10, 3), 35);
  EXPECT_EQ(paged_kv_slot(row.data(), 4, 8, 10, 8), -1);   // -1 entry
  EXPECT_EQ(paged_kv_slot(row.data(), 4, 8, 10, 17), 73);
  EXPECT_EQ(paged_kv_slot(row.data(), 4, 8, 9, 17), -1);   // page 9 outside 9 pages
  EXPECT_EQ(paged_kv_slot(row.data(), 3, 8, 10, 24), -1);  // past the width
  EXPECT_EQ(paged_kv_slot(row.data(), 4, 8, 10, -1), -1);
  PagedKvLayout l{10, 8, 2, 4, 100};
  EXPECT_EQ(kv_row_offset(l, 35), 4 * 100 + 3 * 8);
}

}  // namespace
}  // namespace specd::testing
