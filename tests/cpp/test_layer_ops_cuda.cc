// The CUDA decoder-layer kernels (rms_norm, silu_mul, rope_kv_write) against their rules on
// random inputs in every dtype: RoPE + KV write to the bit (the rule's roundings emulated on the
// host; float32 equals the CPU reference exactly), RMS norm and the SiLU product within one unit
// in the last place of the dtype (the norm's sum order and exp() may differ), the residual
// update, padding strides and slots without a row. Skips, saying why, without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "specd/cuda/rms_norm.h"
#include "specd/cuda/rope_kv_write.h"
#include "specd/cuda/silu_mul.h"
#include "specd/rms_norm.h"
#include "specd/rope_kv_write.h"
#include "specd/silu_mul.h"

namespace specd::testing {
namespace {

constexpr KvDtype kDtypes[] = {KvDtype::kFloat32, KvDtype::kFloat16, KvDtype::kBFloat16};

std::vector<float> normal_values(std::mt19937& rng, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// x rounded to the dtype (nearest even), as a float.
float round_to(float x, KvDtype dtype) {
  if (dtype == KvDtype::kFloat32) return x;
  if (dtype == KvDtype::kFloat16) return __half2float(__float2half_rn(x));
  return __bfloat162float(__float2bfloat16_rn(x));
}

// One unit in the last place of the dtype at |x| (plus a floor for values near zero).
float ulp(float x, KvDtype dtype) {
  const int mantissa = dtype == KvDtype::kFloat32 ? 23 : dtype == KvDtype::kFloat16 ? 10 : 7;
  const float a = std::max(std::fabs(x), 1e-3f);
  return std::ldexp(1.0f, std::ilogb(a) - mantissa);
}

// Device bytes of values rounded to the dtype; `rounded` gets the values held.
struct DeviceArray {
  std::vector<float> rounded;
  DeviceBuffer<unsigned char> buf;
  DeviceArray(const std::vector<float>& values, KvDtype dtype)
      : buf(encode_floats(values, dtype, &rounded)) {}
  std::vector<float> read(KvDtype dtype) const { return decode_floats(buf.to_host(), dtype); }
};

TEST(RmsNormCuda, MatchesTheRuleInEveryDtype) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (int trial = 0; trial < 18; ++trial) {
    const KvDtype dtype = kDtypes[trial % 3];
    const bool with_residual = trial % 2 == 1;
    const int32_t tokens = 1 + static_cast<int32_t>(rng() % 70);
    const int32_t hidden = trial < 6 ? 1 + static_cast<int32_t>(rng() % 300) : 896 * (1 + trial % 2);
    const int64_t xs = hidden + trial % 3, rs = hidden + trial % 2, os = hidden;
    DeviceArray x(normal_values(rng, static_cast<std::size_t>(tokens * xs)), dtype);
    DeviceArray res(normal_values(rng, static_cast<std::size_t>(tokens * rs), 2.0f), dtype);
    DeviceArray w(normal_values(rng, static_cast<std::size_t>(hidden)), dtype);
    DeviceArray out(std::vector<float>(static_cast<std::size_t>(tokens * os), 0.0f), dtype);
    RmsNormParams p;
    p.x = x.buf.get();
    p.x_stride = xs;
    p.residual = with_residual ? res.buf.get() : nullptr;
    p.residual_stride = rs;
    p.weight = w.buf.get();
    p.out = out.buf.get();
    p.out_stride = os;
    p.num_tokens = tokens;
    p.hidden = hidden;
    p.eps = 1e-6f;
    p.dtype = dtype;
    SPECD_CUDA_OK(cuda::rms_norm(p, nullptr));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    const auto got = out.read(dtype), got_res = res.read(dtype);
    for (int32_t t = 0; t < tokens; ++t) {
      std::vector<float> r(static_cast<std::size_t>(hidden));
      double sq = 0;
      for (int32_t i = 0; i < hidden; ++i) {
        r[i] = x.rounded[t * xs + i];
        if (with_residual) {
          r[i] = round_to(r[i] + res.rounded[t * rs + i], dtype);
          ASSERT_EQ(got_res[t * rs + i], r[i]) << "residual, trial " << trial << " t " << t << " i " << i;
        }
        sq += double{r[i]} * r[i];
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(sq / hidden + 1e-6));
      for (int32_t i = 0; i < hidden; ++i) {
        const float want = round_to(w.rounded[i] * round_to(r[i] * inv, dtype), dtype);
        // The normalised value may round the other way (inv's last bits): one ulp of it, times w.
        // float32: inv (1/sqrtf on the device, from a double here) and the two products may
        // each be off by an ulp, so a few float ulps; 16-bit: the term before dominates.
        const float tol = 1.01f * std::fabs(w.rounded[i]) * ulp(r[i] * inv, dtype) + ulp(want, dtype) +
                          4 * ulp(want, KvDtype::kFloat32);
        ASSERT_NEAR(got[t * os + i], want, tol) << "trial " << trial << " t " << t << " i " << i;
      }
    }
    if (!with_residual) EXPECT_EQ(res.read(dtype), res.rounded);
  }
}

TEST(SiluMulCuda, MatchesTheRuleInEveryDtype) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  for (int trial = 0; trial < 12; ++trial) {
    const KvDtype dtype = kDtypes[trial % 3];
    const int32_t tokens = 1 + static_cast<int32_t>(rng() % 40);
    const int32_t width = trial < 6 ? 1 + static_cast<int32_t>(rng() % 700) : 4864;
    const int64_t in_stride = 2 * width + trial % 2, out_stride = width + trial % 3;
    DeviceArray in(normal_values(rng, static_cast<std::size_t>(tokens * in_stride), 3.0f), dtype);
    DeviceArray out(std::vector<float>(static_cast<std::size_t>(tokens * out_stride), 5.0f), dtype);
    SiluMulParams p;
    p.gate_up = in.buf.get();
    p.in_stride = in_stride;
    p.out = out.buf.get();
    p.out_stride = out_stride;
    p.num_tokens = tokens;
    p.width = width;
    p.dtype = dtype;
    SPECD_CUDA_OK(cuda::silu_mul(p, nullptr));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    const auto got = out.read(dtype);
    for (int32_t t = 0; t < tokens; ++t) {
      for (int32_t i = 0; i < width; ++i) {
        const float g = in.rounded[t * in_stride + i], u = in.rounded[t * in_stride + width + i];
        const float silu = round_to(g / (1.0f + std::exp(-g)), dtype);
        const float want = round_to(silu * u, dtype);
        // expf on the device is within 2 ulp of the host's exp: a few float ulps on top.
        const float tol = 1.01f * std::fabs(u) * ulp(silu, dtype) + ulp(want, dtype) + 4 * ulp(want, KvDtype::kFloat32);
        ASSERT_NEAR(got[t * out_stride + i], want, tol) << "trial " << trial << " t " << t << " i " << i;
      }
      for (int64_t i = width; i < out_stride; ++i) ASSERT_EQ(got[t * out_stride + i], 5.0f);
    }
  }
}

TEST(RopeKvWriteCuda, EqualsTheRuleToTheBitInEveryDtype) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  for (int trial = 0; trial < 18; ++trial) {
    const KvDtype dtype = kDtypes[trial % 3];
    const int32_t tokens = 1 + static_cast<int32_t>(rng() % 50);
    const int32_t q_heads = trial < 9 ? 12 : 14, kv_heads = 2, head_dim = trial % 2 ? 64 : 128;
    PagedKvLayout l;
    l.num_pages = 8;
    l.block_size = 8;
    l.kv_heads = kv_heads;
    l.head_dim = head_dim;
    l.page_stride = int64_t{l.block_size} * kv_heads * head_dim + 3 * (trial % 2);
    const int64_t qkv_stride = (q_heads + 2 * kv_heads) * head_dim, cs_stride = head_dim;
    DeviceArray qkv(normal_values(rng, static_cast<std::size_t>(tokens * qkv_stride)), dtype);
    std::vector<float> cos(static_cast<std::size_t>(tokens * cs_stride)), sin(cos.size());
    for (int32_t t = 0; t < tokens; ++t)
      for (int32_t d = 0; d < head_dim; ++d) {
        const double angle = (t * 7 + 1) * std::pow(1e6, -2.0 * (d % (head_dim / 2)) / head_dim);
        cos[t * cs_stride + d] = static_cast<float>(std::cos(angle));
        sin[t * cs_stride + d] = static_cast<float>(std::sin(angle));
      }
    DeviceArray dcos(cos, dtype), dsin(sin, dtype);
    const std::size_t cache_elems = static_cast<std::size_t>(l.num_pages * l.page_stride);
    DeviceArray k_cache(std::vector<float>(cache_elems, -4.0f), dtype), v_cache(std::vector<float>(cache_elems, -4.0f), dtype);
    DeviceArray q_out(std::vector<float>(static_cast<std::size_t>(tokens * q_heads * head_dim), 0.0f), dtype);
    const int64_t num_slots = int64_t{l.num_pages} * l.block_size;
    std::vector<int64_t> slots(static_cast<std::size_t>(tokens));
    std::vector<int64_t> all(static_cast<std::size_t>(num_slots));
    for (int64_t s = 0; s < num_slots; ++s) all[s] = s;
    std::shuffle(all.begin(), all.end(), rng);
    for (int32_t t = 0; t < tokens; ++t) slots[t] = t % 7 == 3 ? -1 : t % 11 == 5 ? num_slots + 2 : all[t];
    DeviceBuffer<int64_t> dslots(slots);
    RopeKvWriteParams p;
    p.qkv = qkv.buf.get();
    p.qkv_stride = qkv_stride;
    p.cos = dcos.buf.get();
    p.sin = dsin.buf.get();
    p.cos_sin_stride = cs_stride;
    p.q_out = q_out.buf.get();
    p.q_out_stride = int64_t{q_heads} * head_dim;
    p.q_heads = q_heads;
    p.slot_mapping = dslots.get();
    p.k_cache = k_cache.buf.get();
    p.v_cache = v_cache.buf.get();
    p.layout = l;
    p.num_tokens = tokens;
    p.dtype = dtype;
    SPECD_CUDA_OK(cuda::rope_kv_write(p, nullptr));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    // The rule on the host, with its roundings.
    std::vector<float> want_q(static_cast<std::size_t>(tokens * q_heads * head_dim));
    std::vector<float> want_k(cache_elems, -4.0f), want_v(cache_elems, -4.0f);
    const int32_t h = head_dim / 2;
    auto rope = [&](const float* x, int32_t t, float* out) {
      const float* c = dcos.rounded.data() + t * cs_stride;
      const float* s = dsin.rounded.data() + t * cs_stride;
      for (int32_t d = 0; d < h; ++d) {
        out[d] = round_to(round_to(x[d] * c[d], dtype) + round_to(-x[d + h] * s[d], dtype), dtype);
        out[d + h] = round_to(round_to(x[d + h] * c[d + h], dtype) + round_to(x[d] * s[d + h], dtype), dtype);
      }
    };
    for (int32_t t = 0; t < tokens; ++t) {
      const float* row = qkv.rounded.data() + t * qkv_stride;
      for (int32_t head = 0; head < q_heads; ++head) rope(row + head * head_dim, t, &want_q[(t * q_heads + head) * head_dim]);
      if (slots[t] < 0 || slots[t] >= num_slots) continue;
      const int64_t dst = (slots[t] / l.block_size) * l.page_stride + (slots[t] % l.block_size) * kv_heads * head_dim;
      for (int32_t head = 0; head < kv_heads; ++head) {
        rope(row + (q_heads + head) * head_dim, t, &want_k[dst + head * head_dim]);
        for (int32_t d = 0; d < head_dim; ++d)
          want_v[dst + head * head_dim + d] = row[(q_heads + kv_heads + head) * head_dim + d];
      }
    }
    ASSERT_EQ(q_out.read(dtype), want_q) << "trial " << trial;
    ASSERT_EQ(k_cache.read(dtype), want_k) << "trial " << trial;
    ASSERT_EQ(v_cache.read(dtype), want_v) << "trial " << trial;
    if (dtype == KvDtype::kFloat32) {  // and the CPU reference, to the bit
      std::vector<float> cpu_q(want_q.size()), cpu_k(cache_elems, -4.0f), cpu_v(cache_elems, -4.0f);
      RopeKvWriteParams c = p;
      c.qkv = qkv.rounded.data();
      c.cos = dcos.rounded.data();
      c.sin = dsin.rounded.data();
      c.q_out = cpu_q.data();
      c.slot_mapping = slots.data();
      c.k_cache = cpu_k.data();
      c.v_cache = cpu_v.data();
      ASSERT_TRUE(rope_kv_write_cpu(c).ok());
      EXPECT_EQ(cpu_q, want_q);
      EXPECT_EQ(cpu_k, want_k);
    }
  }
}

TEST(LayerOpsCuda, InvalidLaunchArgumentsAreRefusedWithoutLaunching) {
  RmsNormParams n;
  n.num_tokens = 1;
  n.hidden = 0;
  EXPECT_EQ(cuda::rms_norm(n, nullptr), cudaErrorInvalidValue);
  SiluMulParams s;
  s.num_tokens = 1;
  s.width = 4;
  s.in_stride = 3;
  EXPECT_EQ(cuda::silu_mul(s, nullptr), cudaErrorInvalidValue);
  RopeKvWriteParams r;
  r.num_tokens = 1;
  EXPECT_EQ(cuda::rope_kv_write(r, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace specd::testing
