// Worked examples for BlockManager: block sizes, reservations at / before / across block
// boundaries, commit, rollback, fork with copy-on-write, capacity, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "block_manager_test_util.h"

namespace specd::testing {
namespace {

using Slots = std::vector<int64_t>;

TEST(BlockManagerConfig, BlockSizePerModelFromPageBytes) {
  // page 48 bytes: target 6 B/token -> 8 tokens, draft 4 B/token -> 12 tokens.
  auto bm = make_manager(10, 8, {6, 4});
  EXPECT_EQ(bm->block_size(0), 8);
  EXPECT_EQ(bm->block_size(1), 12);
  EXPECT_EQ(bm->model_index("draft"), 1);
  EXPECT_EQ(bm->model_index("nope"), -1);
  // block_align rounds down: draft 12 -> 8 with align 8; 48/5 = 9 -> 8.
  auto aligned = make_manager(10, 8, {6, 5}, 8);
  EXPECT_EQ(aligned->block_size(1), 8);
}

TEST(BlockManagerConfig, RejectsInvalidConfigs) {
  std::unique_ptr<BlockManager> bm;
  BlockManagerConfig c{64, 4, {{"target", 8}}, 1};
  SPECD_ASSERT_OK(BlockManager::create(c, &bm));
  auto bad = c;
  bad.page_bytes = 0;
  SPECD_EXPECT_CODE(BlockManager::create(bad, &bm), kInvalidArgument);
  bad = c;
  bad.num_pages = -1;
  SPECD_EXPECT_CODE(BlockManager::create(bad, &bm), kInvalidArgument);
  bad = c;
  bad.models.clear();
  SPECD_EXPECT_CODE(BlockManager::create(bad, &bm), kInvalidArgument);
  bad = c;
  bad.models.push_back({"target", 4});  // duplicate name
  SPECD_EXPECT_CODE(BlockManager::create(bad, &bm), kInvalidArgument);
  bad = c;
  bad.models[0].kv_bytes_per_token = 65;  // a page holds no token
  SPECD_EXPECT_CODE(BlockManager::create(bad, &bm), kInvalidArgument);
  bad = c;
  bad.block_align = 16;  // 8 tokens fit, rounded down to 0
  SPECD_EXPECT_CODE(BlockManager::create(bad, &bm), kInvalidArgument);
}

TEST(BlockManagerReserve, FromEmptyWithinOneBlock) {
  auto bm = make_manager(8);  // block 4
  SPECD_ASSERT_OK(bm->add_sequence(7));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(7, 0, 3, &r));
  EXPECT_EQ(r.slots, (Slots{0, 1, 2}));  // page 0 is handed out first
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(info_of(*bm, 7).reserved, 3);
  EXPECT_EQ(info_of(*bm, 7).committed, 0);
  EXPECT_EQ(bm->num_free_pages(), 7);
}

TEST(BlockManagerReserve, JustBeforeBoundaryStaysInPage) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 3));  // positions 0..2 in page 0
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 1, &r));  // position 3: last slot of page 0
  EXPECT_EQ(r.slots, (Slots{3}));
  EXPECT_EQ(bm->num_used_pages(), 1);
}

TEST(BlockManagerReserve, ExactlyAtBoundaryAllocatesNewPage) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 4));  // page 0 full
  EXPECT_EQ(bm->num_used_pages(), 1);
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 1, &r));
  EXPECT_EQ(r.slots, (Slots{4}));  // page 1, offset 0
  EXPECT_EQ(pages_of(*bm, 1), (std::vector<int32_t>{0, 1}));
}

TEST(BlockManagerReserve, AcrossOneBoundary) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 3));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 3, &r));  // positions 3 | 4 5
  EXPECT_EQ(r.slots, (Slots{3, 4, 5}));
  EXPECT_EQ(info_of(*bm, 1).num_pages, 2);
}

TEST(BlockManagerReserve, SpanningSeveralBlocks) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(bm->add_sequence(2));
  SPECD_ASSERT_OK(grow(*bm, 1, 2));  // seq 1 takes page 0
  SPECD_ASSERT_OK(grow(*bm, 2, 1));  // seq 2 takes page 1, so seq 1's pages are not contiguous
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 11, &r));  // positions 2..12: pages 0 | 2 | 3 | 4
  EXPECT_EQ(pages_of(*bm, 1), (std::vector<int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(r.slots, (Slots{2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16}));
  // The same slots are what slots() reports for those positions.
  std::vector<int64_t> again;
  SPECD_ASSERT_OK(bm->slots(1, 0, 2, 13, &again));
  EXPECT_EQ(again, r.slots);
}

TEST(BlockManagerReserve, ZeroSlotsIsANoOp) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  Reservation r;
  r.slots = {99};  // results are cleared first
  SPECD_ASSERT_OK(bm->reserve(1, 0, 0, &r));
  EXPECT_TRUE(r.slots.empty());
  EXPECT_EQ(bm->num_used_pages(), 0);
  SPECD_ASSERT_OK(bm->commit(1, 0, 0));
}

TEST(BlockManagerCommit, PartialCommitFreesRejectedPages) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 3));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 9, &r));  // positions 3..11: 3 pages
  EXPECT_EQ(bm->num_used_pages(), 3);
  SPECD_ASSERT_OK(bm->commit(1, 0, 2));  // accept positions 3, 4
  EXPECT_EQ(info_of(*bm, 1).committed, 5);
  EXPECT_EQ(info_of(*bm, 1).reserved, 0);
  EXPECT_EQ(bm->num_used_pages(), 2);  // the page of positions 8..11 is free again
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerCommit, CommitMoreThanReservedFails) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 2, &r));
  SPECD_EXPECT_CODE(bm->commit(1, 0, 3), kFailedPrecondition);
  SPECD_EXPECT_CODE(bm->commit(1, 0, -1), kInvalidArgument);
  EXPECT_EQ(info_of(*bm, 1).reserved, 2);  // unchanged
  SPECD_ASSERT_OK(bm->commit(1, 0, 2));
  SPECD_EXPECT_CODE(bm->commit(1, 0, 1), kFailedPrecondition);  // nothing reserved now
}

TEST(BlockManagerReserve, SecondReservationNeedsCommitOrRollback) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 2, &r));
  SPECD_EXPECT_CODE(bm->reserve(1, 0, 1, &r), kFailedPrecondition);
  SPECD_EXPECT_CODE(bm->reserve(1, 0, -2, &r), kInvalidArgument);
  SPECD_ASSERT_OK(bm->rollback(1, 0, 0));  // cancels the reservation
  SPECD_ASSERT_OK(bm->reserve(1, 0, 1, &r));
}

TEST(BlockManagerRollback, IntoTheMiddleOfABlockAndToZero) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 10));  // 3 pages: 4 + 4 + 2
  EXPECT_EQ(bm->num_used_pages(), 3);
  SPECD_ASSERT_OK(bm->rollback(1, 0, 6));  // middle of page 1
  EXPECT_EQ(info_of(*bm, 1).committed, 6);
  EXPECT_EQ(info_of(*bm, 1).num_pages, 2);
  EXPECT_EQ(bm->num_used_pages(), 2);
  // Growing again reuses the kept page: position 6 lands in page 1 at offset 2.
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 1, &r));
  EXPECT_EQ(r.slots, (Slots{int64_t{pages_of(*bm, 1)[1]} * 4 + 2}));
  SPECD_ASSERT_OK(bm->rollback(1, 0, 4));  // drops the reservation and page 1
  EXPECT_EQ(info_of(*bm, 1).num_pages, 1);
  SPECD_ASSERT_OK(bm->rollback(1, 0, 0));
  EXPECT_EQ(info_of(*bm, 1).num_pages, 0);
  EXPECT_EQ(bm->num_free_pages(), 8);
  EXPECT_TRUE(bm->contains(1));  // rollback to zero keeps the (empty) sequence
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerRollback, PastLengthAndNegativeFail) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 5));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 3, &r));
  SPECD_EXPECT_CODE(bm->rollback(1, 0, 6), kOutOfRange);  // reserved slots are not length
  SPECD_EXPECT_CODE(bm->rollback(1, 0, -1), kInvalidArgument);
  EXPECT_EQ(info_of(*bm, 1).reserved, 3);
}

TEST(BlockManagerFork, SharesPagesAndCopiesPartialBlockOnWrite) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 6));  // pages 0 (full) and 1 (2 tokens)
  SPECD_ASSERT_OK(bm->fork(1, 2));
  EXPECT_EQ(pages_of(*bm, 2), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(bm->page_refcount(0), 2);
  EXPECT_EQ(bm->page_refcount(1), 2);
  EXPECT_EQ(bm->num_used_pages(), 2);  // sharing costs nothing

  // The child writes position 6, inside shared page 1: it gets a copy first.
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(2, 0, 3, &r));
  ASSERT_EQ(r.copies.size(), 1u);
  const PageCopy c = r.copies[0];
  EXPECT_EQ(c.model, 0);
  EXPECT_EQ(c.src_page, 1);
  EXPECT_EQ(c.num_tokens, 2);
  EXPECT_EQ(pages_of(*bm, 2), (std::vector<int32_t>{0, c.dst_page, pages_of(*bm, 2)[2]}));
  EXPECT_EQ(r.slots[0], int64_t{c.dst_page} * 4 + 2);
  EXPECT_EQ(bm->page_refcount(1), 1);  // parent's page is its own again
  EXPECT_EQ(bm->page_refcount(0), 2);  // the full page stays shared

  // The parent now writes into page 1 without a copy.
  SPECD_ASSERT_OK(bm->reserve(1, 0, 1, &r));
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(r.slots, (Slots{1 * 4 + 2}));
  SPECD_ASSERT_OK(bm->check_invariants());

  SPECD_ASSERT_OK(bm->free_sequence(1));
  EXPECT_EQ(bm->page_refcount(0), 1);  // still used by the child
  SPECD_ASSERT_OK(bm->free_sequence(2));
  EXPECT_EQ(bm->num_free_pages(), 8);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerFork, AtABlockBoundaryNoCopyIsNeeded) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 8));
  SPECD_ASSERT_OK(bm->fork(1, 2));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(2, 0, 2, &r));
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(info_of(*bm, 2).num_pages, 3);
}

TEST(BlockManagerFork, RollbackIntoSharedPageThenWriteCopies) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 8));  // two full pages
  SPECD_ASSERT_OK(bm->fork(1, 2));
  SPECD_ASSERT_OK(bm->rollback(1, 0, 5));  // keeps pages 0 and 1 (ceil(5 / 4) = 2)
  EXPECT_EQ(bm->page_refcount(1), 2);
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 1, &r));  // position 5 lies in page 1, shared with the child
  ASSERT_EQ(r.copies.size(), 1u);
  EXPECT_EQ(r.copies[0].src_page, 1);
  EXPECT_EQ(r.copies[0].num_tokens, 1);
  EXPECT_EQ(pages_of(*bm, 2), (std::vector<int32_t>{0, 1}));  // child untouched
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerFork, Errors) {
  auto bm = make_manager(8);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(bm->add_sequence(2));
  SPECD_EXPECT_CODE(bm->fork(3, 4), kNotFound);
  SPECD_EXPECT_CODE(bm->fork(1, 2), kAlreadyExists);
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 1, &r));
  SPECD_EXPECT_CODE(bm->fork(1, 5), kFailedPrecondition);
  EXPECT_FALSE(bm->contains(5));
}

TEST(BlockManagerCapacity, OutOfPagesIsRecoverableAndChangesNothing) {
  auto bm = make_manager(3);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(bm->add_sequence(2));
  SPECD_ASSERT_OK(grow(*bm, 1, 10));  // 3 pages: pool full
  Reservation r;
  SPECD_EXPECT_CODE(bm->reserve(2, 0, 1, &r), kOutOfPages);
  EXPECT_EQ(info_of(*bm, 2).reserved, 0);
  EXPECT_EQ(bm->num_free_pages(), 0);
  // Seq 1 still fits its own partial page: 2 more slots in page 2.
  SPECD_ASSERT_OK(bm->reserve(1, 0, 2, &r));
  SPECD_ASSERT_OK(bm->rollback(1, 0, 10));
  SPECD_EXPECT_CODE(bm->reserve(1, 0, 3, &r), kOutOfPages);  // would need a 4th page
  // Preempt seq 1; seq 2 proceeds.
  SPECD_ASSERT_OK(bm->free_sequence(1));
  SPECD_ASSERT_OK(bm->reserve(2, 0, 12, &r));
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerCapacity, CopyOnWritePageIsCounted) {
  auto bm = make_manager(2);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 6));  // 2 pages, the second partial
  SPECD_ASSERT_OK(bm->fork(1, 2));
  Reservation r;
  SPECD_EXPECT_CODE(bm->reserve(2, 0, 1, &r), kOutOfPages);  // needs a copy of page 1
  EXPECT_EQ(pages_of(*bm, 2), (std::vector<int32_t>{0, 1}));
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerModels, TargetAndDraftShareOnePool) {
  // page 48 bytes: target block 8 tokens, draft block 12 tokens.
  auto bm = make_manager(6, 8, {6, 4});
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 17, 0));  // target: 3 pages
  SPECD_ASSERT_OK(grow(*bm, 1, 17, 1));  // draft: 2 pages
  EXPECT_EQ(bm->num_used_pages(), 5);
  EXPECT_EQ(info_of(*bm, 1, 0).num_pages, 3);
  EXPECT_EQ(info_of(*bm, 1, 1).num_pages, 2);
  // Draft slots use the draft's block size.
  std::vector<int64_t> s;
  SPECD_ASSERT_OK(bm->slots(1, 1, 12, 13, &s));
  EXPECT_EQ(s, (Slots{int64_t{pages_of(*bm, 1, 1)[1]} * 12}));
  // Admission accounts for both models: 1 page left.
  EXPECT_TRUE(bm->can_admit(std::vector<int64_t>{8, 0}));
  EXPECT_TRUE(bm->can_admit(std::vector<int64_t>{0, 12}));
  EXPECT_FALSE(bm->can_admit(std::vector<int64_t>{8, 1}));
  EXPECT_FALSE(bm->can_admit(std::vector<int64_t>{1, 0}, /*headroom_pages=*/1));
  // The draft cannot take the target's last page and then some.
  Reservation r;
  SPECD_EXPECT_CODE(bm->reserve(1, 1, 20, &r), kOutOfPages);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerErrors, UnknownSequenceAndModel) {
  auto bm = make_manager(4, 4, {6, 4});
  Reservation r;
  SeqKvInfo info;
  SPECD_EXPECT_CODE(bm->reserve(9, 0, 1, &r), kNotFound);
  SPECD_EXPECT_CODE(bm->commit(9, 0, 0), kNotFound);
  SPECD_EXPECT_CODE(bm->rollback(9, 0, 0), kNotFound);
  SPECD_EXPECT_CODE(bm->free_sequence(9), kNotFound);
  SPECD_EXPECT_CODE(bm->info(9, 0, &info), kNotFound);
  SPECD_ASSERT_OK(bm->add_sequence(9));
  SPECD_EXPECT_CODE(bm->add_sequence(9), kAlreadyExists);
  SPECD_EXPECT_CODE(bm->reserve(9, 2, 1, &r), kInvalidArgument);
  SPECD_EXPECT_CODE(bm->reserve(9, -1, 1, &r), kInvalidArgument);
  std::vector<int64_t> s;
  SPECD_EXPECT_CODE(bm->slots(9, 0, 0, 1, &s), kOutOfRange);
}

TEST(BlockManagerBatch, ReserveBatchConcatenatesSlots) {
  auto bm = make_manager(8);
  for (SeqId s : {10, 11, 12}) SPECD_ASSERT_OK(bm->add_sequence(s));
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve_batch(0, std::vector<SeqId>{10, 11, 12}, std::vector<int32_t>{2, 0, 5}, &r));
  ASSERT_EQ(r.slots.size(), 7u);
  std::vector<int64_t> s10, s12;
  SPECD_ASSERT_OK(bm->slots(10, 0, 0, 2, &s10));
  SPECD_ASSERT_OK(bm->slots(12, 0, 0, 5, &s12));
  EXPECT_EQ(Slots(r.slots.begin(), r.slots.begin() + 2), s10);
  EXPECT_EQ(Slots(r.slots.begin() + 2, r.slots.end()), s12);
  SPECD_ASSERT_OK(bm->commit_batch(0, std::vector<SeqId>{10, 11, 12}, std::vector<int32_t>{1, 0, 5}));
  EXPECT_EQ(info_of(*bm, 10).committed, 1);
  EXPECT_EQ(info_of(*bm, 12).committed, 5);
}

TEST(BlockManagerBatch, AllOrNothing) {
  auto bm = make_manager(4);
  for (SeqId s : {1, 2}) SPECD_ASSERT_OK(bm->add_sequence(s));
  Reservation r;
  // Unknown sequence in the middle: nothing reserved.
  SPECD_EXPECT_CODE(bm->reserve_batch(0, std::vector<SeqId>{1, 5, 2}, std::vector<int32_t>{1, 1, 1}, &r), kNotFound);
  EXPECT_EQ(bm->num_used_pages(), 0);
  // Duplicates are rejected.
  SPECD_EXPECT_CODE(bm->reserve_batch(0, std::vector<SeqId>{1, 1}, std::vector<int32_t>{1, 1}, &r), kInvalidArgument);
  // Too many pages in total: nothing reserved, although the first alone would fit.
  SPECD_EXPECT_CODE(bm->reserve_batch(0, std::vector<SeqId>{1, 2}, std::vector<int32_t>{8, 12}, &r), kOutOfPages);
  EXPECT_EQ(bm->num_used_pages(), 0);
  EXPECT_EQ(info_of(*bm, 1).reserved, 0);
  // Length mismatch.
  SPECD_EXPECT_CODE(bm->reserve_batch(0, std::vector<SeqId>{1, 2}, std::vector<int32_t>{1}, &r), kInvalidArgument);
  // commit_batch validates everything first.
  SPECD_ASSERT_OK(bm->reserve_batch(0, std::vector<SeqId>{1, 2}, std::vector<int32_t>{3, 3}, &r));
  SPECD_EXPECT_CODE(bm->commit_batch(0, std::vector<SeqId>{1, 2}, std::vector<int32_t>{2, 4}), kFailedPrecondition);
  EXPECT_EQ(info_of(*bm, 1).committed, 0);
  EXPECT_EQ(info_of(*bm, 1).reserved, 3);
  SPECD_EXPECT_CODE(bm->commit_batch(0, std::vector<SeqId>{2, 2}, std::vector<int32_t>{1, 1}), kInvalidArgument);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerBatch, SiblingsWritingOneSharedPageNeedOneCopyLess) {
  auto bm = make_manager(4);
  SPECD_ASSERT_OK(bm->add_sequence(1));
  SPECD_ASSERT_OK(grow(*bm, 1, 6));  // pages 0 (full), 1 (2 tokens)
  SPECD_ASSERT_OK(bm->fork(1, 2));
  SPECD_ASSERT_OK(bm->fork(1, 3));  // page 1 has 3 sharers; 2 pages are free
  EXPECT_EQ(bm->num_free_pages(), 2);
  Reservation r;
  // All three write into page 1: two copies, the last writer keeps the page. Fits exactly.
  SPECD_ASSERT_OK(bm->reserve_batch(0, std::vector<SeqId>{1, 2, 3}, std::vector<int32_t>{1, 1, 1}, &r));
  ASSERT_EQ(r.copies.size(), 2u);
  EXPECT_EQ(bm->num_free_pages(), 0);
  EXPECT_EQ(pages_of(*bm, 3)[1], 1);  // the last writer kept the original page
  EXPECT_EQ(bm->page_refcount(1), 1);
  std::vector<int64_t> distinct(r.slots);
  std::sort(distinct.begin(), distinct.end());
  EXPECT_EQ(std::unique(distinct.begin(), distinct.end()), distinct.end());
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerExport, CsrPaddedAndLengths) {
  auto bm = make_manager(8);
  for (SeqId s : {1, 2, 3}) SPECD_ASSERT_OK(bm->add_sequence(s));
  SPECD_ASSERT_OK(grow(*bm, 1, 5));  // pages 0, 1
  SPECD_ASSERT_OK(grow(*bm, 2, 4));  // page 2 (full)
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 4, &r));  // positions 5..8: page 1 and new page 3
  const std::vector<SeqId> ids{1, 2, 3};
  BlockTableCsr csr;
  SPECD_ASSERT_OK(bm->export_csr(0, ids, &csr));
  EXPECT_EQ(csr.indptr, (std::vector<int32_t>{0, 3, 4, 4}));
  EXPECT_EQ(csr.indices, (std::vector<int32_t>{0, 1, 3, 2}));
  EXPECT_EQ(csr.last_page_len, (std::vector<int32_t>{1, 4, 0}));  // 9 = 4 + 4 + 1; 4 = full
  std::vector<int32_t> table;
  int32_t width = 0;
  SPECD_ASSERT_OK(bm->export_padded(0, ids, 0, -1, &table, &width));
  EXPECT_EQ(width, 3);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 1, 3, 2, -1, -1, -1, -1, -1}));
  SPECD_ASSERT_OK(bm->export_padded(0, std::vector<SeqId>{2}, 4, 0, &table, &width));
  EXPECT_EQ(table, (std::vector<int32_t>{2, 0, 0, 0}));
  SPECD_EXPECT_CODE(bm->export_padded(0, ids, 2, 0, &table, &width), kInvalidArgument);
  std::vector<int32_t> lens;
  SPECD_ASSERT_OK(bm->export_kv_lens(0, ids, &lens));
  EXPECT_EQ(lens, (std::vector<int32_t>{9, 4, 0}));
  SPECD_EXPECT_CODE(bm->export_csr(0, std::vector<SeqId>{1, 42}, &csr), kNotFound);
}

TEST(BlockManagerStatus, MessagesNameTheProblem) {
  auto bm = make_manager(1);
  SPECD_ASSERT_OK(bm->add_sequence(5));
  Reservation r;
  const Status s = bm->reserve(5, 0, 9, &r);
  EXPECT_EQ(s.code(), StatusCode::kOutOfPages);
  EXPECT_NE(s.message().find("3 page(s)"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1 free"), std::string::npos) << s.message();
  EXPECT_EQ(s.to_string().rfind("OUT_OF_PAGES: ", 0), 0u);
  EXPECT_EQ(Status::Ok().to_string(), "OK");
}

}  // namespace
}  // namespace specd::testing
