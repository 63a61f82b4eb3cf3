// Slot mapping (CPU reference): worked examples, the -1 cases, strict mode, and agreement
// with BlockManager's own slots for random sequences exported as a padded table.
#include <gtest/gtest.h>

#include <random>

#include "block_manager_test_util.h"
#include "specd/kv_slot_mapping.h"

namespace specd::testing {
namespace {

SlotMappingParams params(const std::vector<int32_t>& table, int32_t rows, int32_t width,
                         const std::vector<int32_t>& seqs, const std::vector<int32_t>& pos,
                         std::vector<int64_t>* out, int32_t block_size) {
  out->assign(seqs.size(), 12345);
  SlotMappingParams p;
  p.block_table = table.data();
  p.seq_index = seqs.data();
  p.positions = pos.data();
  p.slots = out->data();
  p.num_seqs = rows;
  p.table_width = width;
  p.table_stride = width;
  p.num_tokens = static_cast<int32_t>(seqs.size());
  p.block_size = block_size;
  return p;
}

TEST(SlotMappingCpu, WorkedExample) {
  // Two sequences, block size 4: seq 0 -> pages {5, 2}, seq 1 -> page {7} (padded with -1).
  const std::vector<int32_t> table{5, 2, 7, -1};
  const std::vector<int32_t> seqs{0, 0, 0, 1, 1, -1, 1, 2};
  const std::vector<int32_t> pos{0, 3, 4, 2, 4, 0, -1, 0};
  std::vector<int64_t> out;
  SPECD_ASSERT_OK(slot_mapping_cpu(params(table, 2, 2, seqs, pos, &out, 4)));
  // pos 0 -> 5*4; pos 3 -> 5*4+3; pos 4 -> page 2 -> 8; seq 1 pos 2 -> 30; seq 1 pos 4 hits
  // the -1 pad; padding token; negative position; row 2 does not exist.
  EXPECT_EQ(out, (std::vector<int64_t>{20, 23, 8, 30, -1, -1, -1, -1}));
}

TEST(SlotMappingCpu, StrictReportsUncoveredTokensButNotPadding) {
  const std::vector<int32_t> table{5, 2};
  std::vector<int64_t> out;
  const std::vector<int32_t> ok_seqs{0, -1}, ok_pos{7, 100};
  SPECD_ASSERT_OK(slot_mapping_cpu(params(table, 1, 2, ok_seqs, ok_pos, &out, 4), /*strict=*/true));
  EXPECT_EQ(out, (std::vector<int64_t>{11, -1}));
  const std::vector<int32_t> bad_seqs{0, 0}, bad_pos{7, 8};
  const Status s = slot_mapping_cpu(params(table, 1, 2, bad_seqs, bad_pos, &out, 4), /*strict=*/true);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("token 1"), std::string::npos) << s.message();
}

TEST(SlotMappingCpu, ValidatesSizes) {
  const std::vector<int32_t> table{0}, seqs{0}, pos{0};
  std::vector<int64_t> out;
  auto p = params(table, 1, 1, seqs, pos, &out, 0);
  EXPECT_EQ(slot_mapping_cpu(p).code(), StatusCode::kInvalidArgument);
  p.block_size = 4;
  p.table_stride = 0;  // smaller than width
  EXPECT_EQ(slot_mapping_cpu(p).code(), StatusCode::kInvalidArgument);
  p.table_stride = 1;
  p.slots = nullptr;
  EXPECT_EQ(slot_mapping_cpu(p).code(), StatusCode::kInvalidArgument);
}

TEST(SlotMappingCpu, AgreesWithBlockManagerSlots) {
  std::mt19937 rng(7);
  auto bm = make_manager(64, 4, {6, 4});
  std::vector<SeqId> ids;
  for (SeqId s = 0; s < 8; ++s) {
    SPECD_ASSERT_OK(bm->add_sequence(s));
    ids.push_back(s);
    for (ModelIndex m = 0; m < 2; ++m) {
      SPECD_ASSERT_OK(grow(*bm, s, static_cast<int32_t>(rng() % 13), m));
      Reservation r;
      SPECD_ASSERT_OK(bm->reserve(s, m, static_cast<int32_t>(rng() % 6), &r));
    }
  }
  for (ModelIndex m = 0; m < 2; ++m) {
    std::vector<int32_t> table, lens;
    int32_t width = 0;
    SPECD_ASSERT_OK(bm->export_padded(m, ids, 0, -1, &table, &width));
    SPECD_ASSERT_OK(bm->export_kv_lens(m, ids, &lens));
    std::vector<int32_t> seqs, pos;
    std::vector<int64_t> want;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::vector<int64_t> s;
      SPECD_ASSERT_OK(bm->slots(ids[i], m, 0, lens[i], &s));
      for (int32_t p = 0; p < lens[i]; ++p) {
        seqs.push_back(static_cast<int32_t>(i));
        pos.push_back(p);
      }
      want.insert(want.end(), s.begin(), s.end());
    }
    std::vector<int64_t> got;
    auto p = params(table, static_cast<int32_t>(ids.size()), width, seqs, pos, &got, bm->block_size(m));
    SPECD_ASSERT_OK(slot_mapping_cpu(p, /*strict=*/true));
    EXPECT_EQ(got, want) << "model " << m;
  }
}

}  // namespace
}  // namespace specd::testing
