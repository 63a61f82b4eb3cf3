"""Session-wide tiny models (built once per test session, see tiny_models.py).

Targets have ``lm_head_scale=10`` (peaky distributions, like a trained model); drafts are
smaller (hidden 32, one layer) and share the targets' tokenizer and vocabulary.
"""

from __future__ import annotations

import pytest

from tiny_models import DEFAULT_VOCAB_SIZE, make_tiny_model, make_tokenizer

TARGET_LM_HEAD_SCALE = 10.0


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A directory holding the byte-level BPE tokenizer (384 tokens, ``<|endoftext|>`` = 0)."""
    out = tmp_path_factory.mktemp("tiny_tokenizer")
    make_tokenizer(out, DEFAULT_VOCAB_SIZE)
    return out


def _model_dir(tmp_path_factory, tokenizer_dir, name: str, architecture: str, **kwargs):
    out = tmp_path_factory.mktemp(name)
    make_tiny_model(out, architecture, vocab_size=DEFAULT_VOCAB_SIZE, tokenizer_dir=tokenizer_dir,
                    **kwargs)
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer_dir):
    """Target Llama: hidden 64, 2 layers, 4 heads / 2 kv heads, lm_head x10."""
    return _model_dir(tmp_path_factory, tiny_tokenizer_dir, "tiny_llama", "llama",
                      lm_head_scale=TARGET_LM_HEAD_SCALE, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, tiny_tokenizer_dir):
    """Target Qwen2 (q/k/v biases): hidden 64, 2 layers, 4 heads / 2 kv heads, lm_head x10."""
    return _model_dir(tmp_path_factory, tiny_tokenizer_dir, "tiny_qwen2", "qwen2",
                      lm_head_scale=TARGET_LM_HEAD_SCALE, seed=2)


@pytest.fixture(scope="session")
def tiny_llama_draft_dir(tmp_path_factory, tiny_tokenizer_dir):
    """Draft Llama: hidden 32, 1 layer, 4 heads / 2 kv heads, same vocabulary."""
    return _model_dir(tmp_path_factory, tiny_tokenizer_dir, "tiny_llama_draft", "llama",
                      hidden_size=32, layers=1, intermediate=64, seed=11)


@pytest.fixture(scope="session")
def tiny_qwen2_draft_dir(tmp_path_factory, tiny_tokenizer_dir):
    """Draft Qwen2: hidden 32, 1 layer, 4 heads / 2 kv heads, same vocabulary."""
    return _model_dir(tmp_path_factory, tiny_tokenizer_dir, "tiny_qwen2_draft", "qwen2",
                      hidden_size=32, layers=1, intermediate=64, seed=12)


@pytest.fixture
def checked_steps(monkeypatch):
    """Every Engine.step is followed by check_kv (each running request's KV pages match its
    committed length, no reserved slot left)."""
    from specd.engine import engine as engine_module

    real_step = engine_module.Engine.step

    def step(self):
        out = real_step(self)
        self.check_kv()
        return out
    monkeypatch.setattr(engine_module.Engine, "step", step)
