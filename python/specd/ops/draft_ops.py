"""Custom ops of the draft-step-inputs kernel (rule: cpp/include/specd/draft_step_inputs.h):
the inputs of draft forward ``step`` (>= 1) from forward ``step - 1``'s position and sampled
token, on the device, so the draft loop never returns to the host.

``specd::draft_step_inputs`` returns new tensors; ``specd::draft_step_inputs_inplace`` advances
preallocated buffers (positions in place), the form a captured CUDA graph replays.
"""

from typing import Optional

import torch

from specd import _core
from specd.ops._checks import common_device, fail, index, launch, no_kernel_for_device, register_kernels

__all__ = ["draft_step_inputs", "draft_step_inputs_inplace"]


@torch.library.custom_op("specd::draft_step_inputs", mutates_args=())
def draft_step_inputs(block_table: torch.Tensor, positions: torch.Tensor, sampled_tokens: torch.Tensor,
                      block_size: int, num_pages: int, step: int = 1, num_steps: Optional[torch.Tensor] = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of draft forward ``step`` (draft_step_inputs.h), one token per sequence.

    block_table: int32 ``[num_seqs, width]`` (draft model's pages); positions: int64
    ``[num_seqs]`` fed to forward step - 1; sampled_tokens: int64 ``[num_seqs]`` sampled by it;
    num_steps: int32 ``[num_seqs]`` draft tokens per sequence or None (all active).
    Returns (positions, input_ids, slot_mapping: int64 ``[num_seqs]``, kv_lens: int32
    ``[num_seqs]``); a sequence past its num_steps keeps its position and gets slot -1.
    """
    no_kernel_for_device("draft_step_inputs", block_table, positions, sampled_tokens)


def _draft_step_inputs(block_table, positions, sampled_tokens, block_size, num_pages, step=1, num_steps=None):
    device = positions.device
    outs = (torch.empty_like(positions), torch.empty_like(positions), torch.empty_like(positions),
            torch.empty(positions.shape, dtype=torch.int32, device=device))
    _advance("draft_step_inputs", block_table, positions, sampled_tokens, *outs, block_size, num_pages, step,
             num_steps)
    return outs


@draft_step_inputs.register_fake
def _(block_table, positions, sampled_tokens, block_size, num_pages, step=1, num_steps=None):
    return (positions.new_empty(positions.shape), positions.new_empty(positions.shape),
            positions.new_empty(positions.shape), positions.new_empty(positions.shape, dtype=torch.int32))


@torch.library.custom_op("specd::draft_step_inputs_inplace",
                         mutates_args=("positions", "input_ids", "slot_mapping", "kv_lens"))
def draft_step_inputs_inplace(block_table: torch.Tensor, positions: torch.Tensor, sampled_tokens: torch.Tensor,
                              input_ids: torch.Tensor, slot_mapping: torch.Tensor, kv_lens: torch.Tensor,
                              block_size: int, num_pages: int, step: int = 1,
                              num_steps: Optional[torch.Tensor] = None) -> None:
    """``draft_step_inputs`` into preallocated contiguous buffers: ``positions`` (int64
    ``[num_seqs]``) is advanced in place; input_ids, slot_mapping (int64) and kv_lens (int32)
    are overwritten. sampled_tokens must be a different tensor from input_ids."""
    no_kernel_for_device("draft_step_inputs_inplace", block_table, positions, sampled_tokens)


def _draft_step_inputs_inplace(block_table, positions, sampled_tokens, input_ids, slot_mapping, kv_lens,
                               block_size, num_pages, step=1, num_steps=None) -> None:
    _advance("draft_step_inputs_inplace", block_table, positions, sampled_tokens, positions, input_ids,
             slot_mapping, kv_lens, block_size, num_pages, step, num_steps)


@draft_step_inputs_inplace.register_fake
def _(block_table, positions, sampled_tokens, input_ids, slot_mapping, kv_lens, block_size, num_pages, step=1,
      num_steps=None) -> None:
    return None


def _advance(op, block_table, positions, sampled_tokens, positions_out, input_ids, slot_mapping, kv_lens,
             block_size, num_pages, step, num_steps) -> None:
    device = common_device(op, block_table=block_table, positions=positions, sampled_tokens=sampled_tokens,
                           input_ids=input_ids, slot_mapping=slot_mapping, kv_lens=kv_lens, num_steps=num_steps)
    seqs = block_table.shape[0] if block_table.dim() == 2 else -1
    table = index(op, "block_table", block_table, torch.int32, (seqs, -1))
    pos_in = index(op, "positions", positions, torch.int64, (seqs,))
    sampled = index(op, "sampled_tokens", sampled_tokens, torch.int64, (seqs,))
    steps = None if num_steps is None else index(op, "num_steps", num_steps, torch.int32, (seqs,))
    for name, t, dtype in (("positions", positions_out, torch.int64), ("input_ids", input_ids, torch.int64),
                           ("slot_mapping", slot_mapping, torch.int64), ("kv_lens", kv_lens, torch.int32)):
        index(op, name, t, dtype, (seqs,))
        if not t.is_contiguous():
            fail(op, f"{name} must be contiguous (it is written in place)")
    if pos_in.data_ptr() != positions.data_ptr() and positions_out is positions:
        fail(op, "positions must be contiguous (it is advanced in place)")
    if seqs and sampled.data_ptr() == input_ids.data_ptr():
        fail(op, "sampled_tokens and input_ids must be different tensors")
    if block_size < 1 or num_pages < 0 or step < 1:
        fail(op, f"need block_size >= 1, num_pages >= 0 and step >= 1; got {block_size}, {num_pages}, {step}")
    if seqs == 0:
        return
    launch(device, _core.draft_step_inputs_cpu_ptr, "draft_step_inputs_cuda", table.data_ptr(), seqs,
           table.shape[1], table.shape[1], block_size, num_pages, step,
           0 if steps is None else steps.data_ptr(), pos_in.data_ptr(), sampled.data_ptr(),
           positions_out.data_ptr(), input_ids.data_ptr(), slot_mapping.data_ptr(), kv_lens.data_ptr())


register_kernels(draft_step_inputs, _draft_step_inputs)
register_kernels(draft_step_inputs_inplace, _draft_step_inputs_inplace)
