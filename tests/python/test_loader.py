"""specd.models.load_model: Hugging Face safetensors directories and GGUF files, round trips
against the transformers models they were saved from, and every documented error."""

from __future__ import annotations

import dataclasses
import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specd.errors import (IncompatibleModelsError, InvalidArgumentError, ModelLoadError,
                          UnsupportedModelError)
from specd.models import LoadedModel, ModelConfig, check_compatible, load_model
from specd.models.tokenizer_loader import PROBE_TEXTS
from tiny_models import (CODE_SNIPPET, EOS_TOKEN_ID, gguf_name, make_tiny_model, make_tokenizer,
                         random_quant_blocks, write_gguf)

ARCHES = ("llama", "qwen2", "mistral")
QT = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizer_dir):
    """arch -> (directory, transformers model), and a sharded copy under arch + "_sharded"."""
    out = {}
    for i, arch in enumerate(ARCHES):
        d = tmp_path_factory.mktemp(f"loader_{arch}")
        out[arch] = (d, make_tiny_model(d, arch, tokenizer_dir=tiny_tokenizer_dir, seed=20 + i))
        d = tmp_path_factory.mktemp(f"loader_{arch}_sharded")
        out[arch + "_sharded"] = (d, make_tiny_model(d, arch, tokenizer_dir=tiny_tokenizer_dir,
                                                     seed=30 + i, max_shard_size="20KB"))
    return out


def hf_state(model) -> dict[str, torch.Tensor]:
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def raw_tokenizer(model_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))


# ----------------------------------------------------------------------------- HF round trips

@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_hf_round_trip_float32(saved, arch, sharded):
    directory, model = saved[arch + ("_sharded" if sharded else "")]
    assert (directory / "model.safetensors.index.json").exists() == sharded
    loaded = load_model(directory)
    assert isinstance(loaded, LoadedModel) and loaded.format == "hf"
    assert loaded.source == str(directory)
    state = hf_state(model)
    assert set(loaded.weights) == set(state) == set(loaded.config.weight_shapes())
    for name, ref in state.items():
        assert loaded.weights[name].dtype == torch.float32
        assert torch.equal(loaded.weights[name], ref), name

    c, hf = loaded.config, model.config
    assert c.architecture == arch
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 16)
    assert c.attention_bias == (arch == "qwen2")
    assert ("model.layers.0.self_attn.q_proj.bias" in loaded.weights) == (arch == "qwen2")
    assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (10000.0, 1e-6, 512)
    assert c.rope_scaling is None and c.sliding_window is None and not c.tie_word_embeddings
    assert c.bos_token_id == EOS_TOKEN_ID and c.eos_token_ids == (EOS_TOKEN_ID,)
    assert c.kv_bytes_per_token(2) == 2 * 2 * 2 * 16 * 2

    ids = loaded.tokenizer.encode(CODE_SNIPPET, add_special_tokens=False)
    assert ids == raw_tokenizer(directory).encode(CODE_SNIPPET, add_special_tokens=False)
    assert len(ids) > 10 and loaded.tokenizer.decode(ids) == CODE_SNIPPET
    assert loaded.tokenizer.eos_token_id == EOS_TOKEN_ID


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, "bfloat16"])
def test_hf_low_precision(saved, dtype):
    directory, model = saved["qwen2"]
    loaded = load_model(directory, dtype, tokenizer=False)
    want = dtype if isinstance(dtype, torch.dtype) else torch.bfloat16
    assert loaded.tokenizer is None and loaded.dtype == want
    for name, ref in hf_state(model).items():
        assert loaded.weights[name].dtype == want
        assert torch.equal(loaded.weights[name], ref.to(want)), name


def test_hf_tied_embeddings(tmp_path, tiny_tokenizer_dir):
    model = make_tiny_model(tmp_path, "qwen2", tie=True, tokenizer_dir=tiny_tokenizer_dir)
    loaded = load_model(tmp_path, tokenizer=False)
    assert loaded.config.tie_word_embeddings and "lm_head.weight" not in loaded.weights
    assert torch.equal(loaded.lm_head_weight(), model.lm_head.weight.detach())


def test_progress_bar(saved, capsys):
    load_model(saved["llama"][0], tokenizer=False, progress=True)
    assert "tensor" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ config

QWEN25_CODER_15B = {  # config.json of Qwen/Qwen2.5-Coder-1.5B-Instruct (older key style)
    "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 1536, "intermediate_size": 8960,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
    "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_config_real_qwen25():
    c = ModelConfig.from_hf_dict(QWEN25_CODER_15B, {"eos_token_id": [151645, 151643]})
    assert c.architecture == "qwen2" and c.head_dim == 128 and c.attention_bias
    assert c.sliding_window is None  # stated but not applied: use_sliding_window is false
    assert c.rope_theta == 1e6 and c.rope_scaling is None and c.tie_word_embeddings
    assert c.eos_token_ids == (151645, 151643) and c.bos_token_id == 151643
    assert c.kv_bytes_per_token(2) == 28672
    assert c.weight_shapes()["model.layers.0.self_attn.k_proj.weight"] == (256, 1536)


def test_config_defaults_and_variants():
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8}
    c = ModelConfig.from_hf_dict(base)
    assert (c.num_key_value_heads, c.head_dim, c.eos_token_ids, c.bos_token_id) == (8, 8, (), None)
    c = ModelConfig.from_hf_dict({**base, "head_dim": 32, "eos_token_id": [1, 2, 1]})
    assert c.head_dim == 32 and c.eos_token_ids == (1, 2) and c.q_size == 256
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    c = ModelConfig.from_hf_dict({**base, "rope_theta": 5e5, "rope_scaling": llama3})
    assert c.rope_theta == 5e5 and c.rope_scaling == llama3
    c = ModelConfig.from_hf_dict({**base, "rope_parameters": {**llama3, "rope_theta": 5e5}})
    assert c.rope_theta == 5e5 and c.rope_scaling == llama3
    mistral = {**base, "architectures": ["MistralForCausalLM"]}
    assert ModelConfig.from_hf_dict(mistral).sliding_window == 4096  # MistralConfig default
    assert ModelConfig.from_hf_dict({**mistral, "sliding_window": None}).sliding_window is None
    qwen = {**base, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 16}
    assert ModelConfig.from_hf_dict(qwen).sliding_window is None
    assert ModelConfig.from_hf_dict({**qwen, "use_sliding_window": True,
                                     "max_window_layers": 0}).sliding_window == 16
    with pytest.raises(UnsupportedModelError, match="some layers only"):
        ModelConfig.from_hf_dict({**qwen, "use_sliding_window": True, "max_window_layers": 1})


@pytest.mark.parametrize("change, error, fragment", [
    ({"num_key_value_heads": 3}, ModelLoadError, r"num_attention_heads \(8\) must be a multiple"),
    ({"hidden_size": -64, "head_dim": 8}, ModelLoadError, "hidden_size must be a positive"),
    ({"vocab_size": None}, ModelLoadError, "no 'vocab_size'"),
    ({"vocab_size": "many"}, ModelLoadError, "vocab_size must be a positive integer"),
    ({"rms_norm_eps": "tiny"}, ModelLoadError, "wrong type"),
    ({"eos_token_id": 100}, ModelLoadError, r"eos_token_ids 100 is outside the vocabulary \[0, 100\)"),
    ({"hidden_act": "gelu"}, UnsupportedModelError, "hidden_act 'gelu'"),
    ({"attention_bias": True}, UnsupportedModelError, "attention_bias"),
    ({"quantization_config": {"quant_method": "gptq"}}, UnsupportedModelError, "gptq"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, UnsupportedModelError,
     "rope_scaling type 'yarn' is not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, UnsupportedModelError,
     "'dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ModelLoadError, "lacks low_freq"),
    ({"architectures": ["GPT2LMHeadModel"]}, UnsupportedModelError, "'GPT2LMHeadModel'"),
    ({"architectures": [], "model_type": "gemma"}, UnsupportedModelError, "model_type 'gemma'"),
    ({"model_type": "qwen2"}, ModelLoadError, "inconsistent"),
])
def test_config_errors(change, error, fragment):
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8}
    with pytest.raises(error, match=fragment):
        ModelConfig.from_hf_dict({**base, **change})


# ---------------------------------------------------------------------------------- GGUF

def gguf_of(saved, arch, qtype, tmp_path_factory):
    directory, _ = saved[arch]
    out = tmp_path_factory.mktemp(f"gguf_{arch}_{qtype}") / f"tiny-{arch}-{qtype}.gguf"
    return write_gguf(directory, out, qtype)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0"])
def test_gguf_round_trip(saved, arch, qtype, tmp_path_factory):
    directory, model = saved[arch]
    path = gguf_of(saved, arch, qtype, tmp_path_factory)
    loaded = load_model(path, tokenizer=(qtype == "F32"))
    assert loaded.format == "gguf" and loaded.source == str(path)
    assert loaded.config == load_model(directory, tokenizer=False).config
    state = hf_state(model)
    assert set(loaded.weights) == set(state)
    for name, ref in state.items():
        got = loaded.weights[name]
        assert got.dtype == torch.float32 and got.shape == ref.shape, name
        if qtype == "F32" or ref.dim() == 1:  # llama.cpp keeps 1-D tensors in F32
            assert torch.equal(got, ref), name
        elif qtype == "F16":
            assert torch.equal(got, ref.half().float()), name
        elif qtype == "BF16":
            assert torch.equal(got, ref.bfloat16().float()), name
        else:  # Q8_0: exactly what llama.cpp's rounding gives, and close to ref
            q = gguf.quants.quantize(ref.numpy(), QT.Q8_0)
            assert torch.equal(got, torch.from_numpy(gguf.quants.dequantize(q, QT.Q8_0))), name
            step = ref.reshape(-1, 32).abs().amax(1, keepdim=True) / 127
            # half a step, plus the rounding of the step itself to float16
            assert ((got - ref).reshape(-1, 32).abs() <= step * 0.6).all(), name
    if qtype == "F32":
        tok, ref_tok = loaded.tokenizer, raw_tokenizer(directory)
        for text in (CODE_SNIPPET, *PROBE_TEXTS):
            ids = tok.encode(text, add_special_tokens=False)
            assert ids == ref_tok.encode(text, add_special_tokens=False), text
            assert tok.decode(ids) == text
        assert tok.eos_token_id == EOS_TOKEN_ID
        check_compatible(load_model(directory), loaded)


def test_gguf_q_k_permutation_matches_transformers(saved, tmp_path_factory):
    """The loader's reverse permutation equals transformers' GGUF loader's, on the raw file."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    path = gguf_of(saved, "llama", "F32", tmp_path_factory)
    loaded = load_model(path, tokenizer=False)
    proc = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 2})
    raw = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
    for which in ("q", "k"):
        name = f"blk.1.attn_{which}.weight"
        ours = loaded.weights[f"model.layers.1.self_attn.{which}_proj.weight"]
        theirs = proc.process(raw[name], name).weights
        assert torch.equal(ours, torch.from_numpy(np.ascontiguousarray(theirs)))
        assert not torch.equal(ours, torch.from_numpy(raw[name]))  # the permutation is real


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "mixed"])
def test_gguf_k_quants(arch, qtype, tmp_path, tiny_tokenizer_dir):
    """Types gguf-py cannot quantize: random well-formed blocks come back as exactly
    gguf.quants.dequantize of them, under the right name and shape."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    model = make_tiny_model(tmp_path / "hf", arch, hidden_size=256, intermediate=256, layers=1,
                            heads=4, kv_heads=2, tokenizer_dir=tiny_tokenizer_dir)
    cycle = [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.Q4_0, QT.Q5_1, QT.IQ4_NL, QT.F16]
    raw, expected = {}, {}
    matrices = [(name, ref) for name, ref in hf_state(model).items() if ref.dim() == 2]
    for i, (name, ref) in enumerate(matrices):
        t = cycle[i % len(cycle)] if qtype == "mixed" else QT[qtype]
        if t == QT.F16:
            raw[gguf_name(name)] = (ref.numpy().astype(np.float16), t)
            values = ref.half().float().numpy()
        else:
            blocks = random_quant_blocks(t, tuple(ref.shape), seed=i)
            raw[gguf_name(name)] = (blocks, t)
            values = gguf.quants.dequantize(blocks, t)
        # The file holds what it holds; the loader undoes llama.cpp's q/k permutation for llama.
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = 4 if ".q_proj." in name else 2
            values = LlamaTensorProcessor(config={"num_attention_heads": 4,
                                                  "num_key_value_heads": 2}) \
                ._reverse_permute_weights(values, 4, heads)
        expected[name] = torch.from_numpy(np.ascontiguousarray(values))
    assert {t for _, t in raw.values()} == (set(cycle) if qtype == "mixed" else {QT[qtype]})
    path = write_gguf(tmp_path / "hf", tmp_path / "k.gguf", "F32", tensors=raw)
    loaded = load_model(path, tokenizer=False)
    for name, ref in hf_state(model).items():
        got = loaded.weights[name]
        assert got.shape == ref.shape, name
        assert torch.equal(got, expected.get(name, ref)), name
        assert torch.isfinite(got).all()
    bf16 = load_model(path, torch.bfloat16, tokenizer=False)
    for name, ref in expected.items():
        assert torch.equal(bf16.weights[name], ref.to(torch.bfloat16)), name


# ---------------------------------------------------------------------------------- errors

def copy_model(saved, arch, tmp_path, sharded=False):
    src, _ = saved[arch + ("_sharded" if sharded else "")]
    dst = tmp_path / "copy"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_error_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_error_not_a_model(tmp_path):
    (tmp_path / "weights.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
    with pytest.raises(ModelLoadError, match="neither a directory"):
        load_model(tmp_path / "weights.txt")


def test_error_bad_dtype(saved):
    for dtype in (torch.int8, torch.float64, "float64", None):
        with pytest.raises(InvalidArgumentError, match="dtype must be one of"):
            load_model(saved["llama"][0], dtype)


def test_error_unsupported_architecture(saved, tmp_path):
    d = copy_model(saved, "llama", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"],
                                               "model_type": "gpt2"}))
    with pytest.raises(UnsupportedModelError, match="architecture 'GPT2LMHeadModel' is not supported"):
        load_model(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json: cannot read JSON"):
        load_model(d)


def test_error_unsupported_rope_scaling(saved, tmp_path):
    d = copy_model(saved, "llama", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="rope_scaling type 'yarn' is not supported"):
        load_model(d)


def test_error_missing_weights_file(saved, tmp_path):
    d = copy_model(saved, "llama", tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights: expected model.safetensors"):
        load_model(d)
    d = tmp_path / "sharded"
    d.mkdir()
    src = copy_model(saved, "llama", d, sharded=True)
    shard = sorted(src.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=f"{shard.name}: weight file named in"):
        load_model(src)


def test_error_weight_missing(saved, tmp_path):
    d = copy_model(saved, "qwen2", tmp_path)
    state = load_file(str(d / "model.safetensors"))
    del state["model.layers.1.self_attn.k_proj.bias"]
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"tensor model.layers.1.self_attn.k_proj.bias is "
                                             r"missing from model.safetensors"):
        load_model(d)


def test_error_weight_wrong_shape_or_unexpected(saved, tmp_path):
    d = copy_model(saved, "llama", tmp_path)
    state = load_file(str(d / "model.safetensors"))
    good = state["model.layers.0.mlp.up_proj.weight"]
    state["model.layers.0.mlp.up_proj.weight"] = good[:100].contiguous()
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"tensor model.layers.0.mlp.up_proj.weight has shape "
                                             r"\(100, 64\), expected \(128, 64\)"):
        load_model(d)
    state["model.layers.0.mlp.up_proj.weight"] = good
    state["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="does not describe: model.layers.0.self_attn.o_proj.bias"):
        load_model(d)


@pytest.mark.parametrize("damage", ["truncate", "garbage_header"])
def test_error_corrupt_safetensors(saved, tmp_path, damage):
    d = copy_model(saved, "llama", tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\xff" * 64 + data[64:])
    with pytest.raises(ModelLoadError, match="model.safetensors: not a readable safetensors file"):
        load_model(d)


def test_error_missing_tokenizer(saved, tmp_path):
    d = copy_model(saved, "llama", tmp_path)
    (d / "tokenizer.json").unlink()
    (d / "tokenizer_config.json").unlink()
    assert load_model(d, tokenizer=False).tokenizer is None
    with pytest.raises(ModelLoadError, match="could not build the tokenizer"):
        load_model(d)


@pytest.mark.parametrize("cut", [0.5, 0.02])  # in the tensor data; in the metadata
def test_error_truncated_gguf(saved, tmp_path, tmp_path_factory, cut):
    path = gguf_of(saved, "llama", "F16", tmp_path_factory)
    data = path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ModelLoadError, match="cut.gguf: not a readable GGUF file"):
        load_model(bad)
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        load_model(bad)


def test_error_gguf_unsupported(saved, tmp_path):
    directory, _ = saved["llama"]
    path = write_gguf(directory, tmp_path / "a.gguf", "F32", architecture="gpt2")
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'gpt2' is not supported"):
        load_model(path)
    path = write_gguf(directory, tmp_path / "b.gguf", "F32",
                      extra_metadata={"llama.rope.scaling.type": "linear"})
    with pytest.raises(UnsupportedModelError, match="rope_scaling type 'linear'"):
        load_model(path)
    blocks = random_quant_blocks(QT.TQ2_0, (128, 256))  # the type is refused before the shape
    path = write_gguf(directory, tmp_path / "c.gguf", "F32",
                      tensors={"blk.1.ffn_up.weight": (blocks, QT.TQ2_0)})
    with pytest.raises(UnsupportedModelError,
                       match="tensor blk.1.ffn_up.weight has GGML type TQ2_0"):
        load_model(path, tokenizer=False)
    wrong = np.zeros((64, 100), dtype=np.float32)  # HF [out, in] = [64, 100]
    path = write_gguf(directory, tmp_path / "d.gguf", "F32",
                      tensors={"blk.0.ffn_gate.weight": (wrong, QT.F32)})
    with pytest.raises(ModelLoadError, match=r"tensor blk.0.ffn_gate.weight \(model.layers.0.mlp."
                                             r"gate_proj.weight\) has shape \(64, 100\), expected "
                                             r"\(128, 64\)"):
        load_model(path, tokenizer=False)
    path = write_gguf(directory, tmp_path / "e.gguf", "F32",
                      tensors={"blk.2.ffn_up.weight": (np.zeros((128, 64), np.float32), QT.F32)})
    with pytest.raises(ModelLoadError, match="unexpected tensors .* blk.2.ffn_up.weight"):
        load_model(path, tokenizer=False)


# ------------------------------------------------------------------------- compatibility

def test_check_compatible(tiny_llama_dir, tiny_llama_draft_dir, tiny_qwen2_dir,
                          tiny_qwen2_draft_dir, tmp_path, tiny_tokenizer_dir):
    target = load_model(tiny_llama_dir)
    check_compatible(target, load_model(tiny_llama_draft_dir))
    check_compatible(load_model(tiny_qwen2_dir), load_model(tiny_qwen2_draft_dir))
    assert target.config.hidden_size == 64 and load_model(tiny_llama_draft_dir).config.hidden_size == 32

    make_tiny_model(tmp_path / "v300", "llama", vocab_size=300, hidden_size=32, layers=1)
    with pytest.raises(IncompatibleModelsError, match="target vocabulary has 384 entries, draft 300"):
        check_compatible(target, load_model(tmp_path / "v300"))

    # Same vocabulary size, another tokenizer (fewer merges): the probes tell them apart.
    other = tmp_path / "other_tok"
    make_tiny_model(other, "llama", vocab_size=384, hidden_size=32, layers=1,
                    tokenizer_dir=tiny_tokenizer_dir)
    make_tokenizer(other, vocab_size=320)
    with pytest.raises(IncompatibleModelsError, match=r"tokenizers disagree on .*first difference"):
        check_compatible(target, load_model(other))
    check_compatible(target, load_model(other, tokenizer=False))  # nothing to compare


def test_config_is_frozen_and_hashable(saved):
    c = load_model(saved["llama"][0], tokenizer=False).config
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.vocab_size = 1  # type: ignore[misc]
    assert hash(c) == hash(dataclasses.replace(c))
