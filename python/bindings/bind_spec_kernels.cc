// Python binding of the batched sampling and verification kernels (specd/sampling_batch.h,
// specd/verify_batch.h; kernels in cuda/include/specd/cuda/{sampling,verify}.h), for the torch
// custom ops (python/specd/ops). Every function takes pointers as ints: *_cpu host pointers
// (the CPU versions, one thread), *_cuda device pointers plus the caller's stream (the kernels,
// no host sync). The two forms take the same arguments, so one argument builder in Python
// serves both devices. This file only converts and exports; the rules are in the headers.
//
// Packed per-row structs (built by the caller, e.g. specd.ops.pack_sampling_params, on the
// rows' device; the static_asserts below pin the layouts to these words):
//   SamplingParams: 4 x int64 words per row: [temperature (float64 bits), top_k (int32 in the
//                   low half, high half 0), top_p (float64 bits), min_p (float64 bits)]
//   RngKey:         3 x int64 words per row: [seed (uint64 bits), request | step << 32,
//                   position (low half, high half 0)]
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_launch.h"
#include "errors.h"
#include "specd/sampling.h"
#include "specd/sampling_batch.h"
#include "specd/verify.h"
#include "specd/verify_batch.h"

#ifdef SPECD_WITH_CUDA
#include "specd/cuda/runtime.h"
#include "specd/cuda/sampling.h"
#include "specd/cuda/verify.h"
#endif

namespace py = pybind11;

namespace specd::py_bind {
namespace {

static_assert(sizeof(SamplingParams) == 32 && offsetof(SamplingParams, temperature) == 0 &&
                  offsetof(SamplingParams, top_k) == 8 && offsetof(SamplingParams, top_p) == 16 &&
                  offsetof(SamplingParams, min_p) == 24,
              "SamplingParams no longer matches the packed 4-word layout of specd.ops");
static_assert(sizeof(RngKey) == 24 && offsetof(RngKey, seed) == 0 && offsetof(RngKey, request) == 8 &&
                  offsetof(RngKey, step) == 12 && offsetof(RngKey, position) == 16,
              "RngKey no longer matches the packed 3-word layout of specd.ops");

template <class T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

[[noreturn]] void invalid(const std::string& message) {
  raise_status(Status(StatusCode::kInvalidArgument, message));
}

LogitRows logit_rows(uintptr_t data, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride) {
  LogitRows l;
  l.data = ptr<const void>(data);
  if (dtype == "float32") {
    l.dtype = LogitsDtype::kFloat32;
  } else if (dtype == "float16") {
    l.dtype = LogitsDtype::kFloat16;
  } else if (dtype == "bfloat16") {
    l.dtype = LogitsDtype::kBFloat16;
  } else {
    invalid("logits dtype must be 'float32', 'float16' or 'bfloat16', got '" + dtype + "'");
  }
  l.rows = rows;
  l.vocab = vocab;
  l.stride = stride;
  return l;
}

DraftSampling draft_sampling(const std::string& name) {
  if (name == "without_replacement") return DraftSampling::kWithoutReplacement;
  if (name == "independent") return DraftSampling::kIndependent;
  invalid("draft_sampling must be 'without_replacement' or 'independent', got '" + name + "'");
}

TreeBatchView trees(uintptr_t node_offsets, uintptr_t parents, uintptr_t tokens, int32_t batch,
                    int32_t num_nodes) {
  TreeBatchView t;
  t.node_offsets = ptr<const int32_t>(node_offsets);
  t.parents = ptr<const int32_t>(parents);
  t.tokens = ptr<const int32_t>(tokens);
  t.batch = batch;
  t.num_nodes = num_nodes;
  return t;
}

VerifyOutputs outputs(uintptr_t tokens, uintptr_t path, uintptr_t num_accepted, uintptr_t status,
                      int32_t stride) {
  VerifyOutputs o;
  o.tokens = ptr<int32_t>(tokens);
  o.path = ptr<int32_t>(path);
  o.num_accepted = ptr<int32_t>(num_accepted);
  o.status = ptr<int32_t>(status);
  o.stride = stride;
  return o;
}

ProbRows prob_rows(uintptr_t data, int32_t rows, int32_t vocab, int64_t stride) {
  ProbRows p;
  p.data = ptr<const float>(data);
  p.rows = rows;
  p.vocab = vocab;
  p.stride = stride;
  return p;
}

DrawRule draw_rule(bool gumbel) { return gumbel ? DrawRule::kGumbelMax : DrawRule::kInverseCdf; }

#ifdef SPECD_WITH_CUDA
cuda::RowSplit row_split(bool cluster) {
  return cluster ? cuda::RowSplit::kCluster : cuda::RowSplit::kOneBlock;
}
#endif

// Argument names shared by the CPU and CUDA forms.
#define SPECD_LOGITS_ARGS py::arg("logits_ptr"), py::arg("dtype"), py::arg("rows"), py::arg("vocab"), py::arg("stride")
#define SPECD_TREE_ARGS \
  py::arg("node_offsets_ptr"), py::arg("parents_ptr"), py::arg("tokens_ptr"), py::arg("batch"), py::arg("num_nodes")
#define SPECD_OUT_ARGS                                                                            \
  py::arg("out_tokens_ptr"), py::arg("out_path_ptr"), py::arg("num_accepted_ptr"), py::arg("status_ptr"), \
      py::arg("out_stride")

// verify_stochastic's StochasticRowOptions (verify_batch.h) from pointers, 0 for none.
StochasticRowOptions row_options(uintptr_t draft_index, uintptr_t target_totals, uintptr_t draft_totals) {
  return StochasticRowOptions{ptr<const int32_t>(draft_index), ptr<const double>(target_totals),
                              ptr<const double>(draft_totals)};
}

#define SPECD_ROW_OPTION_ARGS \
  py::arg("draft_index_ptr") = 0, py::arg("target_totals_ptr") = 0, py::arg("draft_totals_ptr") = 0

}  // namespace

void bind_spec_kernels(py::module_& m) {
  m.def(
      "sample_tokens_batch_cpu",
      [](uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t params, uintptr_t rng, uintptr_t tokens, uintptr_t status, bool gumbel) {
        check(sample_tokens_cpu(logit_rows(logits, dtype, rows, vocab, stride), ptr<const SamplingParams>(params),
                                ptr<const RngKey>(rng), ptr<int32_t>(tokens), ptr<int32_t>(status), draw_rule(gumbel)));
      },
      SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("rng_ptr"), py::arg("tokens_ptr"), py::arg("status_ptr"),
      py::arg("gumbel") = false,
      "sample_tokens_cpu (specd/sampling_batch.h) on host pointers: logits [rows, stride], packed "
      "SamplingParams [rows, 4] and RngKey [rows, 3] words, int32 tokens and status [rows] out; "
      "gumbel: DrawRule::kGumbelMax instead of the inverse-CDF draw.");
  m.def(
      "sampling_probs_batch_cpu",
      [](uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t params, uintptr_t probs, uintptr_t status, uintptr_t totals) {
        check(sampling_probs_batch_cpu(logit_rows(logits, dtype, rows, vocab, stride),
                                       ptr<const SamplingParams>(params), ptr<float>(probs), ptr<int32_t>(status),
                                       ptr<double>(totals)));
      },
      SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("probs_ptr"), py::arg("status_ptr"), py::arg("totals_ptr") = 0,
      "sampling_probs_batch_cpu on host pointers: float32 probs [rows, vocab] and int32 status out; "
      "totals_ptr (0: none): float64 [rows], each row's total (sampling_batch.h).");
  m.def(
      "sample_tokens_and_probs_batch_cpu",
      [](uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t params, uintptr_t rng, uintptr_t tokens, uintptr_t probs, uintptr_t status, bool gumbel,
         uintptr_t totals) {
        check(sample_tokens_and_probs_cpu(logit_rows(logits, dtype, rows, vocab, stride),
                                          ptr<const SamplingParams>(params), ptr<const RngKey>(rng),
                                          ptr<int32_t>(tokens), ptr<float>(probs), ptr<int32_t>(status),
                                          draw_rule(gumbel), ptr<double>(totals)));
      },
      SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("rng_ptr"), py::arg("tokens_ptr"), py::arg("probs_ptr"),
      py::arg("status_ptr"), py::arg("gumbel") = false, py::arg("totals_ptr") = 0,
      "sample_tokens_and_probs_cpu (specd/sampling_batch.h) on host pointers (gumbel: DrawRule::kGumbelMax): int32 tokens [rows], "
      "float32 probs [rows, vocab] and int32 status out.");
  m.def(
      "verify_greedy_batch_cpu",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t target, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted, uintptr_t status, int32_t out_stride) {
        check(verify_greedy_batch_cpu(trees(offsets, parents, tokens, batch, num_nodes),
                                      logit_rows(target, dtype, rows, vocab, stride),
                                      outputs(out_tokens, out_path, num_accepted, status, out_stride)));
      },
      SPECD_TREE_ARGS, py::arg("target_ptr"), py::arg("dtype"), py::arg("rows"), py::arg("vocab"),
      py::arg("stride"), SPECD_OUT_ARGS,
      "verify_greedy_batch_cpu (specd/verify_batch.h) on host pointers.");
  m.def(
      "verify_greedy_tokens_batch_cpu",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t target_tokens, uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted,
         uintptr_t status, int32_t out_stride) {
        check(verify_greedy_tokens_batch_cpu(trees(offsets, parents, tokens, batch, num_nodes),
                                             ptr<const int32_t>(target_tokens),
                                             outputs(out_tokens, out_path, num_accepted, status, out_stride)));
      },
      SPECD_TREE_ARGS, py::arg("target_tokens_ptr"), SPECD_OUT_ARGS,
      "verify_greedy_tokens_batch_cpu (specd/verify_batch.h) on host pointers.");
  m.def(
      "verify_stochastic_batch_cpu",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t target, int32_t rows, int32_t vocab, int64_t target_stride, uintptr_t draft,
         int32_t draft_rows, int64_t draft_stride, const std::string& sampling, uintptr_t rng,
         uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted, uintptr_t status, int32_t out_stride,
         uintptr_t draft_index, uintptr_t target_totals, uintptr_t draft_totals) {
        const ProbRows d = prob_rows(draft, draft_rows, vocab, draft_stride);
        check(verify_stochastic_batch_cpu(trees(offsets, parents, tokens, batch, num_nodes),
                                          prob_rows(target, rows, vocab, target_stride), draft ? &d : nullptr,
                                          draft_sampling(sampling), ptr<const RngKey>(rng),
                                          outputs(out_tokens, out_path, num_accepted, status, out_stride),
                                          row_options(draft_index, target_totals, draft_totals)));
      },
      SPECD_TREE_ARGS, py::arg("target_ptr"), py::arg("rows"), py::arg("vocab"), py::arg("target_stride"),
      py::arg("draft_ptr"), py::arg("draft_rows"), py::arg("draft_stride"), py::arg("draft_sampling"),
      py::arg("rng_ptr"), SPECD_OUT_ARGS, SPECD_ROW_OPTION_ARGS,
      "verify_stochastic_batch_cpu (specd/verify_batch.h) on host pointers; float32 probability "
      "rows; draft_ptr 0: no draft rows (deterministic proposals); the StochasticRowOptions as "
      "pointers (0: none): int32 draft_index [num_nodes], float64 target/draft totals [rows].");
  m.def(
      "verify_stochastic_logits_batch_cpu",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride, uintptr_t params,
         uintptr_t draft, int32_t draft_rows, int64_t draft_stride, const std::string& sampling, uintptr_t rng,
         uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted, uintptr_t status, int32_t out_stride,
         uintptr_t draft_index, uintptr_t draft_totals, uintptr_t target_index) {
        const ProbRows d = prob_rows(draft, draft_rows, vocab, draft_stride);
        check(verify_stochastic_logits_batch_cpu(
            trees(offsets, parents, tokens, batch, num_nodes),
            TargetLogits{logit_rows(logits, dtype, rows, vocab, stride), ptr<const SamplingParams>(params),
                         ptr<const int32_t>(target_index)},
            draft ? &d : nullptr, draft_sampling(sampling), ptr<const RngKey>(rng),
            outputs(out_tokens, out_path, num_accepted, status, out_stride), row_options(draft_index, 0, draft_totals)));
      },
      SPECD_TREE_ARGS, SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("draft_ptr"), py::arg("draft_rows"),
      py::arg("draft_stride"), py::arg("draft_sampling"), py::arg("rng_ptr"), SPECD_OUT_ARGS,
      py::arg("draft_index_ptr") = 0, py::arg("draft_totals_ptr") = 0, py::arg("target_index_ptr") = 0,
      "verify_stochastic_logits_batch_cpu (specd/verify_batch.h) on host pointers: the target's "
      "logits rows, each request's packed SamplingParams [batch] and optionally each node's row "
      "(int32 target_index [num_nodes], TargetLogits::row_index); draft rows and options as "
      "verify_stochastic_batch_cpu's.");

#ifdef SPECD_WITH_CUDA
  m.def(
      "sample_tokens_batch_cuda",
      [](uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t params, uintptr_t rng, uintptr_t tokens, uintptr_t status, uintptr_t stream, bool cluster,
         bool gumbel) {
        const LogitRows l = logit_rows(logits, dtype, rows, vocab, stride);
        check(validate_sample_tokens(l, ptr<const SamplingParams>(params), ptr<const RngKey>(rng),
                                     ptr<int32_t>(tokens), ptr<int32_t>(status)));
        check_launch(cuda::sample_tokens(l, ptr<const SamplingParams>(params), ptr<const RngKey>(rng),
                                         ptr<int32_t>(tokens), ptr<int32_t>(status), as_stream(stream),
                                         row_split(cluster), draw_rule(gumbel)),
                     "sample_tokens");
      },
      SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("rng_ptr"), py::arg("tokens_ptr"), py::arg("status_ptr"),
      py::arg("stream"), py::arg("cluster") = false, py::arg("gumbel") = false,
      "Launch the CUDA sample_tokens kernel on device pointers (no host sync); cluster: a "
      "thread-block cluster per row (specd/cuda/row_split.h, RowSplit); gumbel: DrawRule::kGumbelMax.");
  m.def(
      "sampling_probs_batch_cuda",
      [](uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t params, uintptr_t probs, uintptr_t status, uintptr_t stream, bool cluster, uintptr_t totals) {
        const LogitRows l = logit_rows(logits, dtype, rows, vocab, stride);
        check(validate_sampling_probs_batch(l, ptr<const SamplingParams>(params), ptr<const float>(probs),
                                            ptr<const int32_t>(status)));
        check_launch(cuda::sampling_probs_batch(l, ptr<const SamplingParams>(params), ptr<float>(probs),
                                                ptr<int32_t>(status), as_stream(stream), row_split(cluster),
                                                ptr<double>(totals)),
                     "sampling_probs_batch");
      },
      SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("probs_ptr"), py::arg("status_ptr"), py::arg("stream"),
      py::arg("cluster") = false, py::arg("totals_ptr") = 0,
      "Launch the CUDA sampling_probs_batch kernel on device pointers (no host sync); cluster: as "
      "sample_tokens_batch_cuda.");
  m.def(
      "sample_tokens_and_probs_batch_cuda",
      [](uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t params, uintptr_t rng, uintptr_t tokens, uintptr_t probs, uintptr_t status, uintptr_t stream,
         bool cluster, bool gumbel, uintptr_t totals) {
        const LogitRows l = logit_rows(logits, dtype, rows, vocab, stride);
        check(validate_sample_tokens_and_probs(l, ptr<const SamplingParams>(params), ptr<const RngKey>(rng),
                                               ptr<const int32_t>(tokens), ptr<const float>(probs),
                                               ptr<const int32_t>(status)));
        check_launch(cuda::sample_tokens_and_probs(l, ptr<const SamplingParams>(params), ptr<const RngKey>(rng),
                                                   ptr<int32_t>(tokens), ptr<float>(probs), ptr<int32_t>(status),
                                                   as_stream(stream), row_split(cluster), draw_rule(gumbel),
                                                   ptr<double>(totals)),
                     "sample_tokens_and_probs");
      },
      SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("rng_ptr"), py::arg("tokens_ptr"), py::arg("probs_ptr"),
      py::arg("status_ptr"), py::arg("stream"), py::arg("cluster") = false, py::arg("gumbel") = false,
      py::arg("totals_ptr") = 0,
      "Launch the CUDA sample_tokens_and_probs kernel on device pointers (no host sync); cluster and "
      "gumbel: as sample_tokens_batch_cuda.");
  m.def("sampling_clusters_available", &cuda::sampling_clusters_available,
        "Whether the clustered sampling kernels run on the current CUDA device (sm_90+ with cluster "
        "launch; elsewhere cluster=True falls back to one block per row).");
  m.def(
      "verify_greedy_batch_cuda",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t target, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride,
         uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted, uintptr_t status, int32_t out_stride,
         uintptr_t stream, bool cluster) {
        const TreeBatchView t = trees(offsets, parents, tokens, batch, num_nodes);
        const LogitRows l = logit_rows(target, dtype, rows, vocab, stride);
        const VerifyOutputs o = outputs(out_tokens, out_path, num_accepted, status, out_stride);
        check(validate_verify_greedy(t, l, o));
        check_launch(cuda::verify_greedy_batch(t, l, o, as_stream(stream), row_split(cluster)), "verify_greedy_batch");
      },
      SPECD_TREE_ARGS, py::arg("target_ptr"), py::arg("dtype"), py::arg("rows"), py::arg("vocab"),
      py::arg("stride"), SPECD_OUT_ARGS, py::arg("stream"), py::arg("cluster") = false,
      "Launch the CUDA greedy verification kernel on device pointers (no host sync); cluster: a "
      "thread-block cluster per request (specd/cuda/row_split.h, RowSplit).");
  m.def(
      "verify_greedy_tokens_batch_cuda",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t target_tokens, uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted,
         uintptr_t status, int32_t out_stride, uintptr_t stream) {
        const TreeBatchView t = trees(offsets, parents, tokens, batch, num_nodes);
        const VerifyOutputs o = outputs(out_tokens, out_path, num_accepted, status, out_stride);
        check(validate_verify_greedy_tokens(t, ptr<const int32_t>(target_tokens), o));
        check_launch(cuda::verify_greedy_tokens_batch(t, ptr<const int32_t>(target_tokens), o, as_stream(stream)),
                     "verify_greedy_tokens_batch");
      },
      SPECD_TREE_ARGS, py::arg("target_tokens_ptr"), SPECD_OUT_ARGS, py::arg("stream"),
      "Launch the CUDA greedy-tokens verification kernel on device pointers (no host sync).");
  m.def(
      "verify_stochastic_batch_cuda",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t target, int32_t rows, int32_t vocab, int64_t target_stride, uintptr_t draft,
         int32_t draft_rows, int64_t draft_stride, const std::string& sampling, uintptr_t rng,
         uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted, uintptr_t status, int32_t out_stride,
         uintptr_t stream, bool cluster, uintptr_t draft_index, uintptr_t target_totals, uintptr_t draft_totals) {
        const TreeBatchView t = trees(offsets, parents, tokens, batch, num_nodes);
        const ProbRows target_rows = prob_rows(target, rows, vocab, target_stride);
        const ProbRows d = prob_rows(draft, draft_rows, vocab, draft_stride);
        const DraftSampling s = draft_sampling(sampling);
        const VerifyOutputs o = outputs(out_tokens, out_path, num_accepted, status, out_stride);
        const StochasticRowOptions options = row_options(draft_index, target_totals, draft_totals);
        check(validate_verify_stochastic(t, target_rows, draft ? &d : nullptr, s, ptr<const RngKey>(rng), o, options));
        check_launch(cuda::verify_stochastic_batch(t, target_rows, draft ? &d : nullptr, s, ptr<const RngKey>(rng),
                                                   o, as_stream(stream), row_split(cluster), options),
                     "verify_stochastic_batch");
      },
      SPECD_TREE_ARGS, py::arg("target_ptr"), py::arg("rows"), py::arg("vocab"), py::arg("target_stride"),
      py::arg("draft_ptr"), py::arg("draft_rows"), py::arg("draft_stride"), py::arg("draft_sampling"),
      py::arg("rng_ptr"), SPECD_OUT_ARGS, py::arg("stream"), py::arg("cluster") = false, SPECD_ROW_OPTION_ARGS,
      "Launch the CUDA stochastic verification kernel on device pointers (no host sync); cluster: a "
      "thread-block cluster per request (specd/cuda/row_split.h, RowSplit).");
  m.def(
      "verify_stochastic_logits_batch_cuda",
      [](uintptr_t offsets, uintptr_t parents, uintptr_t tokens, int32_t batch, int32_t num_nodes,
         uintptr_t logits, const std::string& dtype, int32_t rows, int32_t vocab, int64_t stride, uintptr_t params,
         uintptr_t draft, int32_t draft_rows, int64_t draft_stride, const std::string& sampling, uintptr_t rng,
         uintptr_t out_tokens, uintptr_t out_path, uintptr_t num_accepted, uintptr_t status, int32_t out_stride,
         uintptr_t stream, bool cluster, uintptr_t draft_index, uintptr_t draft_totals, uintptr_t target_index) {
        const TreeBatchView t = trees(offsets, parents, tokens, batch, num_nodes);
        const TargetLogits target{logit_rows(logits, dtype, rows, vocab, stride), ptr<const SamplingParams>(params),
                                  ptr<const int32_t>(target_index)};
        const ProbRows d = prob_rows(draft, draft_rows, vocab, draft_stride);
        const DraftSampling s = draft_sampling(sampling);
        const VerifyOutputs o = outputs(out_tokens, out_path, num_accepted, status, out_stride);
        const StochasticRowOptions options = row_options(draft_index, 0, draft_totals);
        check(validate_verify_stochastic_logits(t, target, draft ? &d : nullptr, s, ptr<const RngKey>(rng), o, options));
        check_launch(cuda::verify_stochastic_logits_batch(t, target, draft ? &d : nullptr, s, ptr<const RngKey>(rng), o,
                                                          as_stream(stream), row_split(cluster), options),
                     "verify_stochastic_logits_batch");
      },
      SPECD_TREE_ARGS, SPECD_LOGITS_ARGS, py::arg("params_ptr"), py::arg("draft_ptr"), py::arg("draft_rows"),
      py::arg("draft_stride"), py::arg("draft_sampling"), py::arg("rng_ptr"), SPECD_OUT_ARGS, py::arg("stream"),
      py::arg("cluster") = false, py::arg("draft_index_ptr") = 0, py::arg("draft_totals_ptr") = 0,
      py::arg("target_index_ptr") = 0,
      "Launch the CUDA stochastic verification kernel from the target's logits on device pointers "
      "(no host sync); cluster: a thread-block cluster per request.");
  m.def("verify_clusters_available", &cuda::verify_clusters_available,
        "Whether the clustered stochastic verification kernel runs on the current CUDA device.");
#endif
}

#undef SPECD_LOGITS_ARGS
#undef SPECD_TREE_ARGS
#undef SPECD_OUT_ARGS

}  // namespace specd::py_bind
