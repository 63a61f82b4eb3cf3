// Draft step inputs (CPU reference): a worked example across a block boundary, in-place
// buffers, sequences that stopped drafting, the optional kv_lens, a k-step loop against the
// slot-mapping view of the same block table, strict mode and validation.
#include <gtest/gtest.h>

#include <vector>

#include "block_manager_test_util.h"
#include "specd/draft_step_inputs.h"

namespace specd::testing {
namespace {

struct StepBuffers {
  std::vector<int32_t> table;
  int32_t width = 0;
  std::vector<int64_t> positions, sampled, positions_out, input_ids, slots;
  std::vector<int32_t> kv_lens, num_steps;
};

DraftStepInputsParams step_params(StepBuffers* b, int32_t block_size, int32_t num_pages, int32_t step) {
  const auto n = b->positions.size();
  b->positions_out.assign(n, -7);
  b->input_ids.assign(n, -7);
  b->slots.assign(n, -7);
  b->kv_lens.assign(n, -7);
  DraftStepInputsParams p;
  p.block_table = b->table.data();
  p.num_seqs = static_cast<int32_t>(n);
  p.table_width = b->width;
  p.table_stride = b->width;
  p.block_size = block_size;
  p.num_pages = num_pages;
  p.step = step;
  p.num_steps = b->num_steps.empty() ? nullptr : b->num_steps.data();
  p.positions_in = b->positions.data();
  p.sampled_tokens = b->sampled.data();
  p.positions_out = b->positions_out.data();
  p.input_ids = b->input_ids.data();
  p.slot_mapping = b->slots.data();
  p.kv_lens = b->kv_lens.data();
  return p;
}

TEST(DraftStepInputsCpu, WorkedExample) {
  // Block size 4. Seq 0: pages {3, 1}, last position 3 -> next 4 = page 1 row 0 = slot 4.
  // Seq 1: pages {0, 2}, last position 5 -> next 6 = page 2 row 2 = slot 10.
  StepBuffers b;
  b.table = {3, 1, 0, 2};
  b.width = 2;
  b.positions = {3, 5};
  b.sampled = {101, 202};
  SPECD_ASSERT_OK(draft_step_inputs_cpu(step_params(&b, 4, 4, 1), /*strict=*/true));
  EXPECT_EQ(b.positions_out, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(b.input_ids, (std::vector<int64_t>{101, 202}));
  EXPECT_EQ(b.slots, (std::vector<int64_t>{4, 10}));
  EXPECT_EQ(b.kv_lens, (std::vector<int32_t>{5, 7}));
}

TEST(DraftStepInputsCpu, InactiveSequencesKeepTheirPositionAndWriteNothing) {
  StepBuffers b;
  b.table = {0, 1};
  b.width = 1;
  b.positions = {0, 1};
  b.sampled = {5, 6};
  b.num_steps = {2, 3};  // at step 2, seq 0 has finished drafting (2 tokens), seq 1 has not
  SPECD_ASSERT_OK(draft_step_inputs_cpu(step_params(&b, 4, 2, 2), true));
  EXPECT_EQ(b.positions_out, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(b.slots, (std::vector<int64_t>{-1, 6}));
  EXPECT_EQ(b.input_ids, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(b.kv_lens, (std::vector<int32_t>{1, 3}));
}

TEST(DraftStepInputsCpu, InPlaceLoopFollowsTheBlockTable) {
  // Three sequences drafting k = 6 tokens each from different starting positions, with the
  // positions and ids updated in place as a captured graph would; every step's slot must be
  // the slot of the sequence's position under the same table.
  const int32_t bs = 2;
  std::vector<int32_t> table{7, 2, 5, 0, 1, 3, 6, 4, 8, 9, 10, 11};
  const int32_t width = 4;
  std::vector<int64_t> positions{0, 1, 2}, ids{11, 12, 13}, slots(3);
  for (int32_t step = 1; step <= 5; ++step) {
    for (auto& id : ids) id += 100;  // "sampled" in place
    DraftStepInputsParams p;
    p.block_table = table.data();
    p.num_seqs = 3;
    p.table_width = width;
    p.table_stride = width;
    p.block_size = bs;
    p.num_pages = 12;
    p.step = step;
    p.positions_in = positions.data();
    p.positions_out = positions.data();
    p.sampled_tokens = ids.data();
    p.input_ids = ids.data();
    p.slot_mapping = slots.data();
    SPECD_ASSERT_OK(draft_step_inputs_cpu(p, true));
    for (int32_t s = 0; s < 3; ++s) {
      const int64_t pos = s + step;
      EXPECT_EQ(positions[static_cast<std::size_t>(s)], pos);
      EXPECT_EQ(ids[static_cast<std::size_t>(s)], 11 + s + 100 * step);
      EXPECT_EQ(slots[static_cast<std::size_t>(s)],
                int64_t{table[static_cast<std::size_t>(s * width + pos / bs)]} * bs + pos % bs);
    }
  }
}

TEST(DraftStepInputsCpu, StrictReportsUncoveredPositions) {
  StepBuffers b;
  b.table = {0, -1};
  b.width = 2;
  b.positions = {1};  // next position 2 needs the second page, which is -1
  b.sampled = {9};
  SPECD_EXPECT_CODE(draft_step_inputs_cpu(step_params(&b, 2, 1, 1), true), kOutOfRange);
  EXPECT_EQ(b.slots, (std::vector<int64_t>{-7}));  // nothing written
  SPECD_ASSERT_OK(draft_step_inputs_cpu(step_params(&b, 2, 1, 1), false));
  EXPECT_EQ(b.slots, (std::vector<int64_t>{-1}));
  EXPECT_EQ(b.positions_out, (std::vector<int64_t>{2}));
}

TEST(DraftStepInputsCpu, ValidatesSizes) {
  StepBuffers b;
  b.table = {0};
  b.width = 1;
  b.positions = {0};
  b.sampled = {1};
  DraftStepInputsParams p = step_params(&b, 2, 1, 1);
  p.kv_lens = nullptr;  // optional
  SPECD_ASSERT_OK(validate_draft_step_inputs(p));
  p.step = 0;
  SPECD_EXPECT_CODE(validate_draft_step_inputs(p), kInvalidArgument);
  p.step = 1;
  p.block_size = 0;
  SPECD_EXPECT_CODE(validate_draft_step_inputs(p), kInvalidArgument);
  p.block_size = 2;
  p.slot_mapping = nullptr;
  SPECD_EXPECT_CODE(validate_draft_step_inputs(p), kInvalidArgument);
}

}  // namespace
}  // namespace specd::testing
