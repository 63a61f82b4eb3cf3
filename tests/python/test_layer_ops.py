"""The decoder-layer ops (specd.ops.rms_norm / add_rms_norm / silu_mul / rope_kv_write) and the
fused forward built on them (LlamaModel.fused, LLM(fused_layers=...)).

CPU (float32 references): each op against the torch code it replaces (RMSNorm, F.silu * up,
apply_rope + kv_write; RoPE to the bit), argument errors; the fused forward against Hugging
Face's logits (prefill, paged incremental decoding, a token tree, a sliding window) within the
parity tests' 1e-4, with no weight stored twice; the engine's greedy outputs with fused layers
and both graph runners (KernelAttention: the fused RoPE + KV write) equal plain decoding with
fused layers. GPU (skips without one): the CUDA ops against the same torch code in bf16, fp16
and fp32, and a bf16 fused forward close to the torch layers'."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import specd
import specd.ops as ops
from specd import errors
from specd.kv_cache import KVCachePool, KVModel
from specd.models.attention import LayerKV
from specd.models.llama import LlamaModel, RMSNorm
from specd.models.loader import load_model
from specd.models.rope import RotaryEmbedding, apply_rope
from test_engine import prompts_of_mixed_lengths, self_draft
from test_model_parity import TOL, hf_logits, new_pool, run
from tiny_models import load_hf_model, make_tiny_model

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and ops.HAS_CUDA_KERNELS else [])


def torch_rms_norm(x, weight, eps):
    norm = RMSNorm(x.shape[1], eps).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm(x)


def dtypes_for(device):
    return [torch.float32] if device == "cpu" else [torch.float32, torch.float16, torch.bfloat16]


def close(got, want, dtype):
    """Within one unit in the last place of the dtype (relative), plus a small floor."""
    rel = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rel, atol=rel)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_and_residual_add_equal_the_torch_layers(device):
    gen = torch.Generator().manual_seed(0)
    for dtype in dtypes_for(device):
        x = torch.randn(9, 96, generator=gen).to(device, dtype)
        h = torch.randn(9, 96, generator=gen).to(device, dtype) * 3
        w = torch.randn(96, generator=gen).to(device, dtype)
        close(ops.rms_norm(x, w, 1e-5), torch_rms_norm(x, w, 1e-5), dtype)
        residual = x.clone()
        out = ops.add_rms_norm(h, residual, w, 1e-6)
        assert torch.equal(residual, x + h)  # the add in the dtype, as torch adds
        close(out, torch_rms_norm(x + h, w, 1e-6), dtype)
        strided = torch.randn(9, 100, generator=gen).to(device, dtype)[:, :96]  # padded rows
        close(ops.rms_norm(strided, w, 1e-6), torch_rms_norm(strided.contiguous(), w, 1e-6), dtype)
        assert ops.rms_norm(x[:0], w, 1e-6).shape == (0, 96)


@pytest.mark.parametrize("device", DEVICES)
def test_silu_mul_equals_silu_gate_times_up(device):
    gen = torch.Generator().manual_seed(1)
    for dtype in dtypes_for(device):
        gate_up = (torch.randn(7, 2 * 130, generator=gen) * 4).to(device, dtype)
        gate, up = gate_up.chunk(2, dim=-1)
        close(ops.silu_mul(gate_up), F.silu(gate) * up, dtype)


def rope_case(device, dtype, tokens=11, q_heads=4, kv_heads=2, dim=16, seed=2):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, generator=gen).to(device, dtype)
    positions = torch.randint(0, 500, (tokens,), generator=gen).to(device)
    cos, sin = RotaryEmbedding(dim, 10000.0, None, torch.device(device)).cos_sin(positions, dtype)  # [T, 1, D]
    pages, block = 8, 4
    k_cache = torch.full((pages, block, kv_heads, dim), -7.0, device=device, dtype=dtype)
    v_cache = k_cache.clone()
    slots = torch.randperm(pages * block, generator=gen)[:tokens].to(device)
    slots[3] = -1  # not written
    return qkv, cos, sin, k_cache, v_cache, slots


@pytest.mark.parametrize("device", DEVICES)
def test_rope_kv_write_equals_apply_rope_and_kv_write_to_the_bit(device):
    for dtype in dtypes_for(device):
        q_heads, kv_heads, dim = 4, 2, 16
        qkv, cos, sin, k_cache, v_cache, slots = rope_case(device, dtype)
        t = qkv.shape[0]
        q, k, v = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        want_q = apply_rope(q.reshape(t, q_heads, dim), cos, sin)
        want_k, want_v = k_cache.clone(), v_cache.clone()
        ops.kv_write(want_k, want_v, apply_rope(k.reshape(t, kv_heads, dim), cos, sin).contiguous(),
                     v.reshape(t, kv_heads, dim).contiguous(), slots)
        got_q = ops.rope_kv_write(qkv, cos[:, 0], sin[:, 0], k_cache, v_cache, slots, q_heads)
        assert torch.equal(got_q, want_q), dtype
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), dtype
        assert (k_cache.view(-1, kv_heads, dim) == -7).all(-1).all(-1).sum() == k_cache.shape[0] * 4 - (t - 1)


def test_layer_op_errors():
    x = torch.randn(3, 8)
    w = torch.ones(8)
    with pytest.raises(errors.InvalidArgumentError, match="float32 only"):
        ops.rms_norm(x.bfloat16(), w.bfloat16(), 1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="weight must be a \\[8\\]"):
        ops.rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="eps"):
        ops.rms_norm(x, w, -1.0)
    with pytest.raises(errors.InvalidArgumentError, match="residual must be"):
        ops.add_rms_norm(x, torch.zeros(3, 9), w, 1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="2 \\* width"):
        ops.silu_mul(torch.randn(3, 7))
    qkv, cos, sin, k_cache, v_cache, slots = rope_case("cpu", torch.float32)
    with pytest.raises(errors.InvalidArgumentError, match="qkv must have shape"):
        ops.rope_kv_write(qkv, cos[:, 0], sin[:, 0], k_cache, v_cache, slots, 5)  # 5 q heads: wrong row
    with pytest.raises(errors.InvalidArgumentError, match="slot_mapping's 10 rows"):
        ops.rope_kv_write(qkv, cos[:, 0], sin[:, 0], k_cache, v_cache, slots[:10], 4)
    with pytest.raises(errors.InvalidArgumentError, match="cos must have the caches' dtype"):
        ops.rope_kv_write(qkv, cos[:, 0].double(), sin[:, 0], k_cache, v_cache, slots, 4)


# ---- the fused forward ----


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral_window6"])
def parity_pair(request, tmp_path_factory, tiny_tokenizer_dir):
    arch, _, window = request.param.partition("_window")
    overrides = {"sliding_window": int(window)} if window else {}
    directory = tmp_path_factory.mktemp(f"fused_{request.param}")
    make_tiny_model(directory, arch, tokenizer_dir=tiny_tokenizer_dir, lm_head_scale=1.0, seed=5, **overrides)
    ours = LlamaModel.from_loaded(load_model(directory, torch.float32, tokenizer=False))
    ours.fused = True
    ours.source_dir = directory
    return load_hf_model(directory), ours


def test_fused_forward_matches_hf_and_stores_no_weight_twice(parity_pair):
    hf, ours = parity_pair
    keys = set(ours.state_dict())
    rng = np.random.default_rng(6)
    ids = [int(t) for t in rng.integers(0, ours.config.vocab_size, 30)]
    pool = new_pool(ours)  # prefill then paged decoding across 4-token blocks
    got = [run(ours, pool, ids[:9], list(range(9)))]
    for start, end in ((9, 10), (10, 17), (17, 30)):
        got.append(run(ours, pool, ids[start:end], list(range(start, end))))
    assert (torch.cat(got) - hf_logits(hf, ids)).abs().max() <= TOL
    attn, mlp = ours.model.layers[0].self_attn, ours.model.layers[0].mlp
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()
    assert attn.v_proj.weight.data_ptr() > attn.k_proj.weight.data_ptr() > attn.q_proj.weight.data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == mlp.gate_up_weight.untyped_storage().data_ptr()
    assert set(ours.state_dict()) == keys  # the concatenations are not parameters


def test_fused_forward_refuses_capture_time_fusion_and_refuses_cpu_16_bit(tiny_llama_dir):
    with pytest.raises(errors.InvalidArgumentError, match="fused_layers=True on the CPU"):
        specd.LLM(tiny_llama_dir, dtype="bfloat16", fused_layers=True)
    with pytest.raises(errors.InvalidArgumentError, match="fused_layers must be"):
        specd.LLM(tiny_llama_dir, fused_layers="yes")
    llm = specd.LLM(tiny_llama_dir, fused_layers=False)
    assert llm.target.fused is False and not llm.target.uses_fused()
    assert specd.LLM(tiny_llama_dir).target.uses_fused() is False  # default on CPU: the torch layers
    model = LlamaModel.from_loaded(load_model(tiny_llama_dir, torch.float32, tokenizer=False))
    model.fused = True
    assert specd.LLM.from_models(model).target.fused is True  # fused_layers=None keeps the model's own
    assert specd.LLM.from_models(model, fused_layers=False).target.fused is False


def test_fused_weights_follow_replaced_parameters(parity_pair):
    """Weights loaded after a fused forward are used: copied in place (the projections are views
    of the concatenations) or assigned (the next forward concatenates again)."""
    _, ours = parity_pair
    model = LlamaModel.from_loaded(load_model(ours.source_dir, torch.float32, tokenizer=False))
    ids = [int(t) for t in np.random.default_rng(8).integers(0, model.config.vocab_size, 12)]
    model.fused = True
    run(model, new_pool(model), ids, list(range(len(ids))))  # fuses
    for assign, factor in ((False, 1.5), (True, 0.7)):
        state = {k: v.detach().clone() * factor for k, v in model.state_dict().items()}
        model.load_state_dict(state, assign=assign)
        model.fused = True
        got = run(model, new_pool(model), ids, list(range(len(ids))))
        model.fused = False
        want = run(model, new_pool(model), ids, list(range(len(ids))))
        assert (got - want).abs().max() <= TOL, assign


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_engine_with_fused_layers_and_graph_runners_equals_plain_fused_decoding(tiny_qwen2_dir, tmp_path, method):
    draft = self_draft(tiny_qwen2_dir, tmp_path / "draft") if method == "draft" else None
    plain = specd.LLM(tiny_qwen2_dir, fused_layers=True)
    prompts = prompts_of_mixed_lengths(plain.tokenizer)
    params = specd.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = specd.SpeculationConfig(method=method, num_speculative_tokens=3)
    llm = specd.LLM(tiny_qwen2_dir, draft, spec, fused_layers=True, target_graph=True,
                    draft_graph=method == "draft")
    assert llm.target.uses_fused() and (draft is None or llm.draft.uses_fused())
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    torch_layers = specd.LLM(tiny_qwen2_dir, fused_layers=False)
    # Rounding may differ from the torch layers, but on these peaky float32 models not the argmax.
    assert [o.token_ids for o in torch_layers.generate(prompts, params)] == want


def test_gpu_bf16_fused_forward_is_close_to_the_torch_layers(tmp_path, tiny_tokenizer_dir):
    """On CUDA in bf16, the fused forward (with KernelAttention: the fused RoPE + KV write) gives
    the torch layers' logits up to bf16 rounding; the prefill's KV rows agree likewise."""
    if "cuda" not in DEVICES:
        pytest.skip("no CUDA device (or specd built without CUDA kernels)")
    from specd.models.kernel_attention import DeviceAttentionMetadata, KernelAttention

    make_tiny_model(tmp_path, "qwen2", tokenizer_dir=tiny_tokenizer_dir, lm_head_scale=1.0, seed=7)
    model = LlamaModel.from_loaded(load_model(tmp_path, torch.bfloat16, tokenizer=False), "cuda")
    c, dev, n = model.config, torch.device("cuda"), 25
    ids = torch.from_numpy(np.random.default_rng(9).integers(0, c.vocab_size, n)).to(dev)
    table = torch.arange(2, device=dev, dtype=torch.int32).view(1, 2)  # 2 pages of 16 slots
    meta = DeviceAttentionMetadata(torch.arange(n, device=dev), torch.arange(n, device=dev), table,
                                   torch.tensor([0, n], device=dev, dtype=torch.int32),
                                   torch.tensor([n], device=dev, dtype=torch.int32))
    logits, caches = {}, {}
    for fused in (False, True):
        model.fused = fused
        kv = [LayerKV(k=torch.zeros(2, 16, c.num_key_value_heads, c.head_dim, device=dev, dtype=torch.bfloat16),
                      v=torch.zeros(2, 16, c.num_key_value_heads, c.head_dim, device=dev, dtype=torch.bfloat16))
              for _ in range(c.num_hidden_layers)]
        logits[fused] = model(ids, meta, kv, None, backend=KernelAttention())
        caches[fused] = torch.stack([layer.k for layer in kv]).float()
    assert model.uses_fused()
    scale = logits[False].abs().max()
    assert (logits[True] - logits[False]).abs().max() <= 0.05 * scale
    assert (caches[True] - caches[False]).abs().max() <= 0.05 * caches[False].abs().max()
