"""``LlamaModel.logits_dtype``: the dtype of the logits a forward returns. It is float32 on the
CPU and the model's own dtype on a GPU, where a float32 copy would hold the same values at
twice the bytes.

Every consumer of the engine's logits takes 16-bit rows and gives the same results it gives for
those values in float32. The consumers are:
- the greedy argmax and its finiteness check;
- verification from the logits, and from probability rows;
- the root rows' draw;
- the draft model's sampled rows and its tree candidates.

So a bfloat16 model on the CPU generates the same tokens with bfloat16 logits
(``logits_dtype_override``) as with its default float32 logits, greedy and sampled, for every
kind of proposal. GPU (skips without one): the default is the model's dtype, and the graph
runners' outputs equal those with float32 logits.
"""

import pytest
import torch

import specd
from specd.engine.params import SamplingParams
from specd.models.kernel_choice import KernelChoice
from test_engine import prompts_of_mixed_lengths, self_draft

SPECS = {
    "draft chains": dict(method="draft", num_speculative_tokens=3),
    "draft trees": dict(method="draft", num_speculative_tokens=3, draft_tree_width=2),
    "ngram": dict(method="ngram", num_speculative_tokens=3),
    "none": dict(method="none"),
}
PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
    "sampled": SamplingParams(temperature=0.9, top_p=0.95, max_tokens=10, seed=11, ignore_eos=True),
}


@pytest.fixture(scope="module")
def pair(tiny_qwen2_dir, tmp_path_factory):
    return tiny_qwen2_dir, self_draft(tiny_qwen2_dir, tmp_path_factory.mktemp("logits_dtype_draft"))


def generate(llm, prompts, params, logits_dtype, from_logits=True):
    llm.reset()
    llm.engine.verify_from_logits = from_logits
    for model in (llm.target, llm.draft):
        if model is not None:
            model.logits_dtype_override = logits_dtype
    return [o.token_ids for o in llm.generate(prompts, params)]


def test_default_logits_dtype_is_float32_on_the_cpu(pair):
    llm = specd.LLM(str(pair[0]), dtype="bfloat16")
    assert llm.target.dtype == torch.bfloat16 and llm.target.logits_dtype == torch.float32
    llm.target.logits_dtype_override = torch.bfloat16
    assert llm.target.logits_dtype == torch.bfloat16


@pytest.mark.parametrize("kind", sorted(PARAMS))
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_bfloat16_logits_generate_the_float32_logits_tokens(pair, spec, kind):
    target, draft = pair
    llm = specd.LLM(str(target), str(draft) if SPECS[spec]["method"] == "draft" else None,
                    specd.SpeculationConfig(**SPECS[spec]), dtype="bfloat16")
    prompts = prompts_of_mixed_lengths(llm.tokenizer)
    forwards = []
    real = llm.target.forward

    def recorded(*args, **kwargs):
        out = real(*args, **kwargs)
        forwards.append(out.dtype)
        return out

    llm.target.forward = recorded
    want = generate(llm, prompts, PARAMS[kind], None)
    assert set(forwards) == {torch.float32}
    forwards.clear()
    got = generate(llm, prompts, PARAMS[kind], torch.bfloat16)
    assert set(forwards) == {torch.bfloat16}  # the forwards really returned bfloat16 rows
    assert got == want
    if spec != "none":
        assert llm.metrics()["mean_k"] > 0  # drafts were verified from those rows


def test_sampled_rows_path_takes_bfloat16_logits(pair):
    """Verification from probability rows (Engine.verify_from_logits False) and the Gumbel-max
    root draw, with bfloat16 logits."""
    target, draft = pair
    llm = specd.LLM(str(target), str(draft), specd.SpeculationConfig(**SPECS["draft chains"]), dtype="bfloat16",
                    kernels=KernelChoice(draw="gumbel"))
    prompts = prompts_of_mixed_lengths(llm.tokenizer)
    want = generate(llm, prompts, PARAMS["sampled"], None, from_logits=False)
    assert generate(llm, prompts, PARAMS["sampled"], torch.bfloat16, from_logits=False) == want


def test_gpu_graph_runners_default_to_the_model_dtype(pair):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    target, draft = pair
    llm = specd.LLM(str(target), str(draft), specd.SpeculationConfig(**SPECS["draft chains"]), dtype="bfloat16",
                    device="cuda")
    assert llm.target.logits_dtype == torch.bfloat16 and llm.draft.logits_dtype == torch.bfloat16
    prompts = prompts_of_mixed_lengths(llm.tokenizer)
    for kind in sorted(PARAMS):
        want = generate(llm, prompts, PARAMS[kind], torch.float32)
        assert generate(llm, prompts, PARAMS[kind], None) == want, kind
