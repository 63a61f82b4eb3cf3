// The CUDA KV write, KV compaction and draft-step-inputs kernels against their CPU references
// on random inputs, byte for byte: every dtype size, padded pages, strided and misaligned new
// rows (all copy units), several layers, -1 and out-of-range slots, invalid paths, inactive
// sequences and the in-place form. Skips, saying why, without a CUDA device (the kernels are
// still compiled and linked); launch-argument validation runs without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kv_test_util.h"
#include "specd/cuda/draft_step_inputs.h"
#include "specd/cuda/kv_compact.h"
#include "specd/cuda/kv_write.h"
#include "specd/draft_step_inputs.h"
#include "specd/kv_compact.h"
#include "specd/kv_write.h"

namespace specd::testing {
namespace {

std::vector<unsigned char> random_bytes(std::mt19937& rng, std::size_t n) {
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

constexpr KvDtype kDtypes[] = {KvDtype::kFloat32, KvDtype::kFloat16, KvDtype::kBFloat16};

TEST(KvWriteCuda, MatchesCpuReference) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  for (int trial = 0; trial < 60; ++trial) {
    const KvDtype dtype = kDtypes[trial % 3];
    const int64_t esize = kv_dtype_size(dtype);
    PagedKvLayout l;
    l.num_pages = 1 + static_cast<int32_t>(rng() % 40);
    l.block_size = 1 + static_cast<int32_t>(rng() % 16);
    l.kv_heads = 1 + static_cast<int32_t>(rng() % 8);
    l.head_dim = trial % 4 == 0 ? 1 + static_cast<int32_t>(rng() % 9) : 64 * (1 + static_cast<int32_t>(rng() % 2));
    l.page_stride = int64_t{l.block_size} * kv_row_elems(l) + (trial % 2 == 0 ? 0 : static_cast<int64_t>(rng() % 9));
    const int32_t tokens = static_cast<int32_t>(rng() % 300);
    const int64_t stride = kv_row_elems(l) + (trial % 3 == 0 ? static_cast<int64_t>(rng() % 5) : 0);
    const int64_t shift = trial % 5 == 0 ? 1 : 0;  // misaligned new rows: a narrower copy unit
    const int64_t num_slots = int64_t{l.num_pages} * l.block_size;
    // Distinct slots (a random subset of the cache), some -1, some past the cache.
    std::vector<int64_t> all(static_cast<std::size_t>(num_slots));
    for (int64_t s = 0; s < num_slots; ++s) all[static_cast<std::size_t>(s)] = s;
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int64_t> slots(static_cast<std::size_t>(tokens));
    for (int32_t t = 0; t < tokens; ++t) {
      const uint32_t kind = rng() % 10;
      slots[static_cast<std::size_t>(t)] = kind == 0 ? -1 : kind == 1 ? num_slots + static_cast<int64_t>(rng() % 3)
                                           : t < num_slots ? all[static_cast<std::size_t>(t)] : -1;
    }
    const std::size_t cache_bytes = static_cast<std::size_t>(l.num_pages * l.page_stride * esize);
    const std::size_t new_bytes = static_cast<std::size_t>((tokens * stride + shift) * esize);
    std::vector<unsigned char> kc = random_bytes(rng, cache_bytes), vc = random_bytes(rng, cache_bytes);
    const std::vector<unsigned char> k = random_bytes(rng, new_bytes), v = random_bytes(rng, new_bytes);

    KvWriteParams p;
    p.k_token_stride = p.v_token_stride = stride;
    p.layout = l;
    p.dtype = dtype;
    p.num_tokens = tokens;
    DeviceBuffer<unsigned char> d_kc(kc), d_vc(vc), d_k(k), d_v(v);
    DeviceBuffer<int64_t> d_slots(slots);
    ASSERT_TRUE(d_kc.get() && d_vc.get() && d_k.get() && d_v.get() && d_slots.get());

    p.k = k.data() + shift * esize;
    p.v = v.data() + shift * esize;
    p.slot_mapping = slots.data();
    p.k_cache = kc.data();
    p.v_cache = vc.data();
    ASSERT_TRUE(kv_write_cpu(p).ok());

    p.k = d_k.get() + shift * esize;
    p.v = d_v.get() + shift * esize;
    p.slot_mapping = d_slots.get();
    p.k_cache = d_kc.get();
    p.v_cache = d_vc.get();
    SPECD_CUDA_OK(cuda::kv_write(p, nullptr));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(d_kc.to_host(), kc) << "trial " << trial;
    EXPECT_EQ(d_vc.to_host(), vc) << "trial " << trial;
  }
}

TEST(KvCompactCuda, MatchesCpuReference) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  for (int trial = 0; trial < 60; ++trial) {
    const KvDtype dtype = kDtypes[trial % 3];
    const int64_t esize = kv_dtype_size(dtype);
    const int32_t seqs = 1 + static_cast<int32_t>(rng() % 20);
    const int32_t bs = 1 + static_cast<int32_t>(rng() % 16);
    const int32_t blocks = 1 + static_cast<int32_t>(rng() % 6);
    const int32_t heads = 1 + static_cast<int32_t>(rng() % 4);
    const int32_t dim = trial % 4 == 0 ? 1 + static_cast<int32_t>(rng() % 9) : 128;
    RandomPagedCache c = random_paged_cache(rng, seqs, blocks, bs, heads, dim, 2,
                                            trial % 2 == 0 ? 0 : static_cast<int32_t>(rng() % 9));
    const int32_t layers = 1 + static_cast<int32_t>(rng() % 4);
    const int64_t layer_stride = c.layout.num_pages * c.layout.page_stride + (trial % 3 == 0 ? 3 : 0);
    const int32_t capacity = blocks * bs;
    const int32_t path_stride = capacity + 1;
    std::vector<int32_t> tree_start, num_accepted, path(static_cast<std::size_t>(seqs * path_stride), -1);
    for (int32_t s = 0; s < seqs; ++s) {
      const int32_t drafts = static_cast<int32_t>(rng() % static_cast<uint32_t>(capacity));
      const std::vector<int32_t> walk = random_path(rng, random_tree(rng, drafts));
      // Mostly in range; sometimes past the table (moves skipped) or an invalid path.
      const uint32_t kind = rng() % 12;
      tree_start.push_back(kind == 0 ? capacity - 1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(capacity - drafts)));
      std::copy(walk.begin(), walk.end(), path.begin() + s * path_stride);
      if (kind == 1 && walk.size() > 1) path[static_cast<std::size_t>(s * path_stride)] = 1;
      num_accepted.push_back(static_cast<int32_t>(walk.size()) - 1);
    }
    const std::size_t cache_bytes = static_cast<std::size_t>(layers * layer_stride * esize);
    std::vector<unsigned char> kc = random_bytes(rng, cache_bytes), vc = random_bytes(rng, cache_bytes);

    KvCompactParams p;
    p.layout = c.layout;
    p.dtype = dtype;
    p.num_layers = layers;
    p.layer_stride = layer_stride;
    p.num_seqs = seqs;
    p.table_width = c.width;
    p.table_stride = c.stride;
    p.path_stride = path_stride;
    DeviceBuffer<unsigned char> d_kc(kc), d_vc(vc);
    DeviceBuffer<int32_t> d_table(c.table), d_start(tree_start), d_path(path), d_n(num_accepted);
    ASSERT_TRUE(d_kc.get() && d_vc.get() && d_table.get() && d_start.get() && d_path.get() && d_n.get());

    p.k_cache = kc.data();
    p.v_cache = vc.data();
    p.block_table = c.table.data();
    p.tree_start = tree_start.data();
    p.path = path.data();
    p.num_accepted = num_accepted.data();
    ASSERT_TRUE(kv_compact_cpu(p).ok());

    p.k_cache = d_kc.get();
    p.v_cache = d_vc.get();
    p.block_table = d_table.get();
    p.tree_start = d_start.get();
    p.path = d_path.get();
    p.num_accepted = d_n.get();
    SPECD_CUDA_OK(cuda::kv_compact(p, nullptr));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(d_kc.to_host(), kc) << "trial " << trial;
    EXPECT_EQ(d_vc.to_host(), vc) << "trial " << trial;
  }
}

TEST(DraftStepInputsCuda, MatchesCpuReference) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(47);
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t seqs = static_cast<int32_t>(rng() % 700);
    const int32_t width = 1 + static_cast<int32_t>(rng() % 8);
    const int32_t stride = width + static_cast<int32_t>(rng() % 2);
    const int32_t bs = 1 + static_cast<int32_t>(rng() % 16);
    const int32_t pages = 1 + static_cast<int32_t>(rng() % 500);
    std::vector<int32_t> table(static_cast<std::size_t>(seqs * stride));
    for (auto& x : table) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(pages + 3)) - 1;  // some -1 / too large
    std::vector<int64_t> positions(static_cast<std::size_t>(seqs)), sampled(positions.size());
    std::vector<int32_t> num_steps(positions.size());
    for (std::size_t s = 0; s < positions.size(); ++s) {
      positions[s] = static_cast<int64_t>(rng() % static_cast<uint32_t>(width * bs + 2)) - 1;
      sampled[s] = static_cast<int64_t>(rng() % 150000);
      num_steps[s] = static_cast<int32_t>(rng() % 6);
    }
    const int32_t step = 1 + static_cast<int32_t>(rng() % 5);
    const bool with_steps = trial % 2 == 0, in_place = trial % 3 == 0;

    DraftStepInputsParams p;
    p.num_seqs = seqs;
    p.table_width = width;
    p.table_stride = stride;
    p.block_size = bs;
    p.num_pages = pages;
    p.step = step;
    std::vector<int64_t> pos_out(positions.size(), -9), ids(positions.size(), -9), slots(positions.size(), -9);
    std::vector<int64_t> pos_io = positions, ids_io = sampled;
    std::vector<int32_t> lens(positions.size(), -9);
    DeviceBuffer<int32_t> d_table(table), d_steps(num_steps), d_lens(lens);
    DeviceBuffer<int64_t> d_pos(positions), d_sampled(sampled), d_pos_out(pos_out), d_ids(ids), d_slots(slots);
    p.block_table = table.data();
    p.num_steps = with_steps ? num_steps.data() : nullptr;
    p.positions_in = in_place ? pos_io.data() : positions.data();
    p.positions_out = in_place ? pos_io.data() : pos_out.data();
    p.sampled_tokens = in_place ? ids_io.data() : sampled.data();
    p.input_ids = in_place ? ids_io.data() : ids.data();
    p.slot_mapping = slots.data();
    p.kv_lens = lens.data();
    ASSERT_TRUE(draft_step_inputs_cpu(p).ok());

    p.block_table = d_table.get();
    p.num_steps = with_steps ? d_steps.get() : nullptr;
    p.positions_in = d_pos.get();
    p.positions_out = in_place ? d_pos.get() : d_pos_out.get();
    p.sampled_tokens = d_sampled.get();
    p.input_ids = in_place ? d_sampled.get() : d_ids.get();
    p.slot_mapping = d_slots.get();
    p.kv_lens = d_lens.get();
    SPECD_CUDA_OK(cuda::draft_step_inputs(p, nullptr));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ((in_place ? d_pos : d_pos_out).to_host(), in_place ? pos_io : pos_out) << "trial " << trial;
    EXPECT_EQ((in_place ? d_sampled : d_ids).to_host(), in_place ? ids_io : ids) << "trial " << trial;
    EXPECT_EQ(d_slots.to_host(), slots) << "trial " << trial;
    EXPECT_EQ(d_lens.to_host(), lens) << "trial " << trial;
  }
}

TEST(KvKernelsCuda, RejectInvalidSizesWithoutLaunching) {
  // Validation happens on the host, so this runs without a device too.
  KvWriteParams w;
  EXPECT_EQ(cuda::kv_write(w, nullptr), cudaErrorInvalidValue);  // block_size 0
  KvCompactParams c;
  c.layout = PagedKvLayout{1, 1, 1, 1, 1};
  c.num_layers = cuda::kKvCompactMaxLayers + 1;
  EXPECT_FALSE(cuda::validate_kv_compact_launch(c).ok());
  EXPECT_EQ(cuda::kv_compact(c, nullptr), cudaErrorInvalidValue);
  DraftStepInputsParams d;
  d.block_size = 1;
  d.step = 0;
  EXPECT_EQ(cuda::draft_step_inputs(d, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace specd::testing
