// Python binding of the decoder-layer kernels (RMS norm with the fused residual add, the
// SiLU-gated product, RoPE fused with the KV write): for each, a host-pointer entry point of
// the CPU reference (`*_cpu_ptr`, float32) and, in CUDA builds, the launcher (`*_cuda`, the same
// arguments plus a stream), for the torch custom ops of python/specd/ops/layer_ops.py. Pointers
// are data_ptr() addresses of tensors the caller sized as the rule headers say:
// specd/rms_norm.h, specd/silu_mul.h, specd/rope_kv_write.h.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "cuda_launch.h"
#include "errors.h"
#include "kv_params.h"
#include "specd/rms_norm.h"
#include "specd/rope_kv_write.h"
#include "specd/silu_mul.h"

#ifdef SPECD_WITH_CUDA
#include "specd/cuda/rms_norm.h"
#include "specd/cuda/rope_kv_write.h"
#include "specd/cuda/silu_mul.h"
#endif

namespace py = pybind11;

namespace specd::py_bind {
namespace {

RmsNormParams rms_norm_params(uintptr_t x, int64_t x_stride, uintptr_t residual, int64_t residual_stride,
                              uintptr_t weight, uintptr_t out, int64_t out_stride, int32_t num_tokens,
                              int32_t hidden, double eps, const std::string& dtype) {
  RmsNormParams p;
  p.x = address_ptr<const void>(x);
  p.x_stride = x_stride;
  p.residual = address_ptr<void>(residual);
  p.residual_stride = residual_stride;
  p.weight = address_ptr<const void>(weight);
  p.out = address_ptr<void>(out);
  p.out_stride = out_stride;
  p.num_tokens = num_tokens;
  p.hidden = hidden;
  p.eps = static_cast<float>(eps);
  p.dtype = kv_dtype(dtype);
  check(validate_rms_norm(p));
  return p;
}

SiluMulParams silu_mul_params(uintptr_t gate_up, int64_t in_stride, uintptr_t out, int64_t out_stride,
                              int32_t num_tokens, int32_t width, const std::string& dtype) {
  SiluMulParams p;
  p.gate_up = address_ptr<const void>(gate_up);
  p.in_stride = in_stride;
  p.out = address_ptr<void>(out);
  p.out_stride = out_stride;
  p.num_tokens = num_tokens;
  p.width = width;
  p.dtype = kv_dtype(dtype);
  check(validate_silu_mul(p));
  return p;
}

RopeKvWriteParams rope_kv_write_params(uintptr_t qkv, int64_t qkv_stride, uintptr_t cos, uintptr_t sin,
                                       int64_t cos_sin_stride, uintptr_t q_out, int64_t q_out_stride,
                                       int32_t q_heads, uintptr_t slot_mapping, uintptr_t k_cache,
                                       uintptr_t v_cache, const PagedKvLayout& layout, int32_t num_tokens,
                                       const std::string& dtype) {
  RopeKvWriteParams p;
  p.qkv = address_ptr<const void>(qkv);
  p.qkv_stride = qkv_stride;
  p.cos = address_ptr<const void>(cos);
  p.sin = address_ptr<const void>(sin);
  p.cos_sin_stride = cos_sin_stride;
  p.q_out = address_ptr<void>(q_out);
  p.q_out_stride = q_out_stride;
  p.q_heads = q_heads;
  p.slot_mapping = address_ptr<const int64_t>(slot_mapping);
  p.k_cache = address_ptr<void>(k_cache);
  p.v_cache = address_ptr<void>(v_cache);
  p.layout = layout;
  p.num_tokens = num_tokens;
  p.dtype = kv_dtype(dtype);
  check(validate_rope_kv_write(p));
  return p;
}

}  // namespace

void bind_layer_ops(py::module_& m) {
  m.def(
      "rms_norm_cpu_ptr",
      [](uintptr_t x, int64_t x_stride, uintptr_t residual, int64_t residual_stride, uintptr_t weight,
         uintptr_t out, int64_t out_stride, int32_t num_tokens, int32_t hidden, double eps,
         const std::string& dtype) {
        check(rms_norm_cpu(rms_norm_params(x, x_stride, residual, residual_stride, weight, out, out_stride,
                                           num_tokens, hidden, eps, dtype)));
      },
      py::arg("x_ptr"), py::arg("x_stride"), py::arg("residual_ptr"), py::arg("residual_stride"),
      py::arg("weight_ptr"), py::arg("out_ptr"), py::arg("out_stride"), py::arg("num_tokens"), py::arg("hidden"),
      py::arg("eps"), py::arg("dtype"),
      "rms_norm_cpu (specd/rms_norm.h) on host pointers; residual_ptr 0: no residual add; float32 only.");
  m.def(
      "silu_mul_cpu_ptr",
      [](uintptr_t gate_up, int64_t in_stride, uintptr_t out, int64_t out_stride, int32_t num_tokens,
         int32_t width, const std::string& dtype) {
        check(silu_mul_cpu(silu_mul_params(gate_up, in_stride, out, out_stride, num_tokens, width, dtype)));
      },
      py::arg("gate_up_ptr"), py::arg("in_stride"), py::arg("out_ptr"), py::arg("out_stride"),
      py::arg("num_tokens"), py::arg("width"), py::arg("dtype"),
      "silu_mul_cpu (specd/silu_mul.h) on host pointers; float32 only.");
  m.def(
      "rope_kv_write_cpu_ptr",
      [](uintptr_t qkv, int64_t qkv_stride, uintptr_t cos, uintptr_t sin, int64_t cos_sin_stride, uintptr_t q_out,
         int64_t q_out_stride, int32_t q_heads, uintptr_t slot_mapping, uintptr_t k_cache, uintptr_t v_cache,
         const PagedKvLayout& layout, int32_t num_tokens, const std::string& dtype) {
        check(rope_kv_write_cpu(rope_kv_write_params(qkv, qkv_stride, cos, sin, cos_sin_stride, q_out, q_out_stride,
                                                     q_heads, slot_mapping, k_cache, v_cache, layout, num_tokens,
                                                     dtype),
                                /*strict=*/false));
      },
      py::arg("qkv_ptr"), py::arg("qkv_stride"), py::arg("cos_ptr"), py::arg("sin_ptr"), py::arg("cos_sin_stride"),
      py::arg("q_out_ptr"), py::arg("q_out_stride"), py::arg("q_heads"), py::arg("slot_mapping_ptr"),
      py::arg("k_cache_ptr"), py::arg("v_cache_ptr"), py::arg("layout"), py::arg("num_tokens"), py::arg("dtype"),
      "rope_kv_write_cpu (specd/rope_kv_write.h) on host pointers; float32 only.");
#ifdef SPECD_WITH_CUDA
  m.def(
      "rms_norm_cuda",
      [](uintptr_t x, int64_t x_stride, uintptr_t residual, int64_t residual_stride, uintptr_t weight,
         uintptr_t out, int64_t out_stride, int32_t num_tokens, int32_t hidden, double eps, const std::string& dtype,
         uintptr_t stream) {
        check_launch(cuda::rms_norm(rms_norm_params(x, x_stride, residual, residual_stride, weight, out, out_stride,
                                                    num_tokens, hidden, eps, dtype),
                                    as_stream(stream)),
                     "rms_norm");
      },
      py::arg("x_ptr"), py::arg("x_stride"), py::arg("residual_ptr"), py::arg("residual_stride"),
      py::arg("weight_ptr"), py::arg("out_ptr"), py::arg("out_stride"), py::arg("num_tokens"), py::arg("hidden"),
      py::arg("eps"), py::arg("dtype"), py::arg("stream"),
      "Launch the CUDA RMS norm (specd/rms_norm.h) on device pointers (no host sync).");
  m.def(
      "silu_mul_cuda",
      [](uintptr_t gate_up, int64_t in_stride, uintptr_t out, int64_t out_stride, int32_t num_tokens,
         int32_t width, const std::string& dtype, uintptr_t stream) {
        check_launch(cuda::silu_mul(silu_mul_params(gate_up, in_stride, out, out_stride, num_tokens, width, dtype),
                                    as_stream(stream)),
                     "silu_mul");
      },
      py::arg("gate_up_ptr"), py::arg("in_stride"), py::arg("out_ptr"), py::arg("out_stride"),
      py::arg("num_tokens"), py::arg("width"), py::arg("dtype"), py::arg("stream"),
      "Launch the CUDA SiLU-gated product (specd/silu_mul.h) on device pointers (no host sync).");
  m.def(
      "rope_kv_write_cuda",
      [](uintptr_t qkv, int64_t qkv_stride, uintptr_t cos, uintptr_t sin, int64_t cos_sin_stride, uintptr_t q_out,
         int64_t q_out_stride, int32_t q_heads, uintptr_t slot_mapping, uintptr_t k_cache, uintptr_t v_cache,
         const PagedKvLayout& layout, int32_t num_tokens, const std::string& dtype, uintptr_t stream) {
        check_launch(cuda::rope_kv_write(rope_kv_write_params(qkv, qkv_stride, cos, sin, cos_sin_stride, q_out,
                                                              q_out_stride, q_heads, slot_mapping, k_cache, v_cache,
                                                              layout, num_tokens, dtype),
                                         as_stream(stream)),
                     "rope_kv_write");
      },
      py::arg("qkv_ptr"), py::arg("qkv_stride"), py::arg("cos_ptr"), py::arg("sin_ptr"), py::arg("cos_sin_stride"),
      py::arg("q_out_ptr"), py::arg("q_out_stride"), py::arg("q_heads"), py::arg("slot_mapping_ptr"),
      py::arg("k_cache_ptr"), py::arg("v_cache_ptr"), py::arg("layout"), py::arg("num_tokens"), py::arg("dtype"),
      py::arg("stream"),
      "Launch the CUDA RoPE + KV write (specd/rope_kv_write.h) on device pointers (no host sync).");
#endif
}

}  // namespace specd::py_bind
