"""Torch custom ops (``torch.ops.specd.*``, registered with ``torch.library``) over specd's
kernels, so torch code (the model, the draft loop, torch.compile, CUDA graphs) calls them like
any aten op. Importing this package registers them.

Each op has a CPU implementation (the C++ reference of the rule, on host pointers: caches are
written in place, any KV dtype), a CUDA implementation (the kernel on the current stream, no
host sync; registered only when ``specd._core.built_with_cuda``) and a fake implementation
(shapes only) for torch.compile and graph capture. The device is that of the input tensors;
mixed devices, wrong dtypes or shapes raise :class:`specd.errors.InvalidArgumentError`.

| op | rule header | mutates |
|---|---|---|
| ``kv_write(k_cache, v_cache, k, v, slot_mapping)`` | kv_write.h | caches |
| ``kv_compact(k_cache, v_cache, block_table, tree_start, path, num_accepted)`` | kv_compact.h | caches |
| ``slot_mapping(block_table, seq_index, positions, block_size)`` | kv_slot_mapping.h | - |
| ``draft_step_inputs(block_table, positions, sampled_tokens, block_size, num_pages, step, num_steps)`` | draft_step_inputs.h | - |
| ``draft_step_inputs_inplace(..., positions, sampled_tokens, input_ids, slot_mapping, kv_lens, ...)`` | draft_step_inputs.h | buffers |
| ``tree_attention(q, k_cache, v_cache, block_table, query_start, kv_lens, tree_mask, scale, grouped, tree_lens)`` | tree_attention.h | - |
| ``sample_tokens(logits, params, rng)`` / ``sampling_probs(logits, params)`` / ``sample_tokens_and_probs(logits, params, rng)`` | sampling_batch.h | - |
| ``sample_tokens_and_probs_out(logits, params, rng, probs)`` | sampling_batch.h | probs |
| ``verify_greedy`` / ``verify_greedy_tokens`` / ``verify_stochastic`` / ``verify_stochastic_logits`` | verify_batch.h | - |
| ``rms_norm(x, weight, eps)`` / ``add_rms_norm(x, residual, weight, eps)`` | rms_norm.h | residual |
| ``silu_mul(gate_up)`` | silu_mul.h | - |
| ``rope_kv_write(qkv, cos, sin, k_cache, v_cache, slot_mapping, q_heads)`` | rope_kv_write.h | caches |

Status: the CPU implementations are tested against the references; the CUDA ones against
them on an H100 (docs/benchmarks.md; the layer ops and the attention-width rule in the
second GPU session of 2026-11-22).
"""

from specd.ops._checks import HAS_CUDA_KERNELS, host_call
from specd.ops.attention_ops import tree_attention
from specd.ops.draft_ops import draft_step_inputs, draft_step_inputs_inplace
from specd.ops.kv_ops import kv_compact, kv_write, slot_mapping, stacked_kv
from specd.ops.layer_ops import add_rms_norm, rms_norm, rope_kv_write, silu_mul
from specd.ops.spec_ops import (pack_rng_keys, pack_sampling_params, sample_tokens, sample_tokens_and_probs,
                                sample_tokens_and_probs_out, sampling_probs, verify_greedy, verify_greedy_tokens,
                                verify_stochastic, verify_stochastic_logits)

__all__ = ["HAS_CUDA_KERNELS", "host_call", "kv_write", "kv_compact", "slot_mapping", "stacked_kv", "draft_step_inputs",
           "draft_step_inputs_inplace", "tree_attention", "sample_tokens", "sampling_probs", "sample_tokens_and_probs",
           "sample_tokens_and_probs_out", "verify_greedy",
           "verify_greedy_tokens", "verify_stochastic", "verify_stochastic_logits", "pack_sampling_params", "pack_rng_keys", "rms_norm",
           "add_rms_norm", "silu_mul", "rope_kv_write"]
