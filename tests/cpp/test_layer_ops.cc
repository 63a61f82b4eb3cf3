// CPU references of the decoder-layer kernels (rms_norm.h, silu_mul.h, rope_kv_write.h)
// against the rules computed independently in double precision, on random rows with padded
// strides; the residual update; RoPE's K/V rows landing in the right (strided) pages and
// nothing else written; strict slot checks; and the argument validation every launcher uses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "specd/rms_norm.h"
#include "specd/rope_kv_write.h"
#include "specd/silu_mul.h"

namespace specd {
namespace {

std::vector<float> normal_values(std::mt19937& rng, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(RmsNorm, MatchesTheRuleWithAndWithoutResidual) {
  std::mt19937 rng(3);
  for (const bool with_residual : {false, true}) {
    const int32_t tokens = 7, hidden = 96;
    const int64_t xs = hidden + 5, rs = hidden + 2, os = hidden + 3;
    auto x = normal_values(rng, static_cast<std::size_t>(tokens * xs));
    auto residual = normal_values(rng, static_cast<std::size_t>(tokens * rs), 3.0f);
    const auto residual_before = residual;
    const auto w = normal_values(rng, hidden);
    std::vector<float> out(static_cast<std::size_t>(tokens * os), 123.0f);
    RmsNormParams p;
    p.x = x.data();
    p.x_stride = xs;
    p.residual = with_residual ? residual.data() : nullptr;
    p.residual_stride = rs;
    p.weight = w.data();
    p.out = out.data();
    p.out_stride = os;
    p.num_tokens = tokens;
    p.hidden = hidden;
    p.eps = 1e-5f;
    ASSERT_TRUE(rms_norm_cpu(p).ok());
    for (int32_t t = 0; t < tokens; ++t) {
      std::vector<double> r(hidden);
      double sq = 0;
      for (int32_t i = 0; i < hidden; ++i) {
        r[i] = x[t * xs + i] + (with_residual ? residual_before[t * rs + i] : 0.0);
        sq += r[i] * r[i];
        if (with_residual) EXPECT_NEAR(residual[t * rs + i], r[i], 1e-5) << t << " " << i;
      }
      const double inv = 1.0 / std::sqrt(sq / hidden + 1e-5);
      for (int32_t i = 0; i < hidden; ++i)
        EXPECT_NEAR(out[t * os + i], w[i] * r[i] * inv, 1e-4 * (1 + std::fabs(w[i] * r[i] * inv)));
      for (int64_t i = hidden; i < os; ++i) EXPECT_EQ(out[t * os + i], 123.0f);  // padding untouched
      if (!with_residual) EXPECT_EQ(residual, residual_before);
    }
  }
}

TEST(RmsNorm, RejectsBadArguments) {
  float buf[8] = {};
  RmsNormParams p;
  p.x = p.weight = buf;
  p.out = buf + 4;
  p.num_tokens = 1;
  p.hidden = 4;
  p.x_stride = p.out_stride = 4;
  EXPECT_TRUE(validate_rms_norm(p).ok());
  auto bad = p;
  bad.x_stride = 3;
  EXPECT_EQ(validate_rms_norm(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.residual = buf;
  bad.residual_stride = 2;
  EXPECT_EQ(validate_rms_norm(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.eps = -1.0f;
  EXPECT_EQ(validate_rms_norm(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.hidden = 0;
  EXPECT_EQ(validate_rms_norm(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.weight = nullptr;
  EXPECT_EQ(validate_rms_norm(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.dtype = KvDtype::kBFloat16;
  EXPECT_TRUE(validate_rms_norm(bad).ok());  // the kernel takes it
  const Status s = rms_norm_cpu(bad);        // the reference does not
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("float32"), std::string::npos) << s.message();
}

TEST(SiluMul, MatchesTheRule) {
  std::mt19937 rng(5);
  const int32_t tokens = 5, width = 33;
  const int64_t in_stride = 2 * width + 3, out_stride = width + 1;
  const auto in = normal_values(rng, static_cast<std::size_t>(tokens * in_stride), 4.0f);
  std::vector<float> out(static_cast<std::size_t>(tokens * out_stride), 7.0f);
  SiluMulParams p;
  p.gate_up = in.data();
  p.in_stride = in_stride;
  p.out = out.data();
  p.out_stride = out_stride;
  p.num_tokens = tokens;
  p.width = width;
  ASSERT_TRUE(silu_mul_cpu(p).ok());
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t i = 0; i < width; ++i) {
      const double g = in[t * in_stride + i], u = in[t * in_stride + width + i];
      const double want = g / (1 + std::exp(-g)) * u;
      EXPECT_NEAR(out[t * out_stride + i], want, 1e-5 * (1 + std::fabs(want)));
    }
    EXPECT_EQ(out[t * out_stride + width], 7.0f);
  }
  auto bad = p;
  bad.in_stride = 2 * width - 1;
  EXPECT_EQ(validate_silu_mul(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.out = nullptr;
  EXPECT_EQ(validate_silu_mul(bad).code(), StatusCode::kInvalidArgument);
}

struct RopeCase {
  int32_t tokens = 6, q_heads = 4, kv_heads = 2, head_dim = 16;
  PagedKvLayout layout;
  std::vector<float> qkv, cos, sin, q_out, k_cache, v_cache;
  std::vector<int64_t> slots;
  int64_t qkv_stride = 0, cs_stride = 0;

  explicit RopeCase(std::mt19937& rng) {
    layout.num_pages = 4;
    layout.block_size = 4;
    layout.kv_heads = kv_heads;
    layout.head_dim = head_dim;
    layout.page_stride = int64_t{layout.block_size} * kv_heads * head_dim + 7;  // gaps between pages
    qkv_stride = (q_heads + 2 * kv_heads) * head_dim + 2;
    cs_stride = head_dim + 1;
    qkv = normal_values(rng, static_cast<std::size_t>(tokens * qkv_stride));
    cos.resize(static_cast<std::size_t>(tokens * cs_stride));
    sin.resize(cos.size());
    for (int32_t t = 0; t < tokens; ++t)
      for (int32_t d = 0; d < head_dim; ++d) {
        const double angle = (t + 3) * std::pow(10000.0, -2.0 * (d % (head_dim / 2)) / head_dim);
        cos[t * cs_stride + d] = static_cast<float>(std::cos(angle));
        sin[t * cs_stride + d] = static_cast<float>(std::sin(angle));
      }
    q_out.assign(static_cast<std::size_t>(tokens * q_heads * head_dim), 0.0f);
    k_cache.assign(static_cast<std::size_t>(layout.num_pages * layout.page_stride), -9.0f);
    v_cache = k_cache;
    slots = {5, -1, 0, 15, 9, 100};  // -1: not written; 100: past the cache
  }

  RopeKvWriteParams params() {
    RopeKvWriteParams p;
    p.qkv = qkv.data();
    p.qkv_stride = qkv_stride;
    p.cos = cos.data();
    p.sin = sin.data();
    p.cos_sin_stride = cs_stride;
    p.q_out = q_out.data();
    p.q_out_stride = int64_t{q_heads} * head_dim;
    p.q_heads = q_heads;
    p.slot_mapping = slots.data();
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.layout = layout;
    p.num_tokens = tokens;
    return p;
  }

  // rope of head row x (length head_dim) at token t, in double.
  std::vector<double> rope(const float* x, int32_t t) const {
    const int32_t h = head_dim / 2;
    std::vector<double> out(static_cast<std::size_t>(head_dim));
    for (int32_t d = 0; d < head_dim; ++d) {
      const double rot = d < h ? -double{x[d + h]} : double{x[d - h]};
      out[d] = x[d] * double{cos[t * cs_stride + d]} + rot * sin[t * cs_stride + d];
    }
    return out;
  }
};

TEST(RopeKvWrite, RotatesQAndKAndWritesKvAtTheSlots) {
  std::mt19937 rng(9);
  RopeCase c(rng);
  ASSERT_TRUE(rope_kv_write_cpu(c.params()).ok());
  const int32_t d = c.head_dim;
  std::vector<bool> written(c.k_cache.size(), false);
  for (int32_t t = 0; t < c.tokens; ++t) {
    const float* row = c.qkv.data() + t * c.qkv_stride;
    for (int32_t head = 0; head < c.q_heads; ++head) {
      const auto want = c.rope(row + head * d, t);
      for (int32_t i = 0; i < d; ++i) EXPECT_NEAR(c.q_out[(t * c.q_heads + head) * d + i], want[i], 1e-5);
    }
    const int64_t s = c.slots[t];
    if (s < 0 || s >= int64_t{c.layout.num_pages} * c.layout.block_size) continue;
    const int64_t base = (s / c.layout.block_size) * c.layout.page_stride + (s % c.layout.block_size) * c.kv_heads * d;
    for (int32_t head = 0; head < c.kv_heads; ++head) {
      const auto want = c.rope(row + (c.q_heads + head) * d, t);
      for (int32_t i = 0; i < d; ++i) {
        EXPECT_NEAR(c.k_cache[base + head * d + i], want[i], 1e-5);
        EXPECT_EQ(c.v_cache[base + head * d + i], row[(c.q_heads + c.kv_heads + head) * d + i]);
        written[base + head * d + i] = true;
      }
    }
  }
  for (std::size_t i = 0; i < written.size(); ++i)
    if (!written[i]) ASSERT_EQ(c.k_cache[i], -9.0f) << "element " << i << " written without a slot";
}

TEST(RopeKvWrite, StrictChecksSlotsAndValidationNamesTheProblem) {
  std::mt19937 rng(11);
  RopeCase c(rng);
  const Status past = rope_kv_write_cpu(c.params(), /*strict=*/true);
  EXPECT_EQ(past.code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.message().find("rope_kv_write: token 5"), std::string::npos) << past.message();
  c.slots = {1, 2, 1, -1, 3, 4};
  EXPECT_EQ(rope_kv_write_cpu(c.params(), true).code(), StatusCode::kInvalidArgument);
  auto p = c.params();
  p.layout.head_dim = 15;
  EXPECT_NE(validate_rope_kv_write(p).message().find("even"), std::string::npos);
  p = c.params();
  p.qkv_stride = (c.q_heads + 2 * c.kv_heads) * c.head_dim - 1;
  EXPECT_EQ(validate_rope_kv_write(p).code(), StatusCode::kInvalidArgument);
  p = c.params();
  p.cos = nullptr;
  EXPECT_EQ(validate_rope_kv_write(p).code(), StatusCode::kInvalidArgument);
  p = c.params();
  p.dtype = KvDtype::kFloat16;
  EXPECT_EQ(rope_kv_write_cpu(p).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
