"""What `specd bench` runs: specd configurations and their HF transformers counterparts on the
same weights, each producing one :class:`Sample` per (prompt, repetition).

Every run is greedy and generates exactly ``max_tokens`` tokens (EOS ignored on both sides),
so runs of different systems do the same amount of work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from specd.engine.llm import LLM
from specd.engine.params import SamplingParams, SpeculationConfig
from specd.models.llama import LlamaModel
from specd.models.loader import LoadedModel, check_compatible


@dataclass(frozen=True)
class BenchConfig:
    system: str          # "specd" | "hf"
    method: str          # specd: none/draft/ngram/suffix; hf: plain/assisted/prompt_lookup
    k: int = 0

    @property
    def label(self) -> str:
        return f"{self.system} {self.method}" + (f" k={self.k}" if self.k else "")

    @property
    def is_plain(self) -> bool:
        return self.method in ("none", "plain")


@dataclass
class Sample:
    tokens: list[int]
    seconds: float
    target_s: float          # in target model forwards
    draft_s: float           # in draft model forwards
    verify_steps: int        # target forwards that decided tokens (HF: target forwards)
    draft_tokens: int = 0    # proposed (specd)
    accepted_tokens: int = 0  # accepted (specd)
    draft_forwards: int = 0


class SpecdRunner:
    """One LLM per configuration, all over one copy of the weights on ``device``. On a GPU each
    LLM captures its CUDA graphs when it is made (untimed), as a server does at start-up."""

    def __init__(self, target: LoadedModel, draft: Optional[LoadedModel], dtype: str, max_tokens: int,
                 device: str = "cpu"):
        self.target, self.draft, self.dtype, self.max_tokens, self.device = target, draft, dtype, max_tokens, device
        if draft is not None:
            check_compatible(target, draft)
        self._target_model = LlamaModel.from_loaded(target, device)
        self._draft_model = LlamaModel.from_loaded(draft, device) if draft is not None else None
        self._llms: dict[BenchConfig, LLM] = {}

    def llm(self, c: BenchConfig) -> LLM:
        if c not in self._llms:
            spec = SpeculationConfig(method=c.method, num_speculative_tokens=max(c.k, 1))
            llm = LLM.from_models(self._target_model, self._draft_model if c.method == "draft" else None, spec,
                                  tokenizer=self.target.tokenizer, device=self.device, max_num_seqs=1)
            llm.capture_cuda_graphs()
            self._llms[c] = llm
        return self._llms[c]

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def run(self, c: BenchConfig, prompt: str, max_tokens: Optional[int] = None) -> Sample:
        llm = self.llm(c)
        llm.engine.timings.reset()
        llm.reset_prefix_cache()  # every repetition prefills its prompt, as on first sight
        start = time.perf_counter()
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens or self.max_tokens, ignore_eos=True)
        out = llm.generate(prompt, params)[0]
        seconds = time.perf_counter() - start
        t, m = llm.engine.timings, out.metrics
        return Sample(out.token_ids, seconds, t.target_forward_s, t.draft_forward_s, m.verify_steps,
                      m.draft_tokens, m.accepted_tokens, t.draft_forwards)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


class _Timed:
    """Wraps a module's forward to add its wall time and call count to a counter (on a GPU
    the forward's work is waited for, so its time is the device's, not the launch's)."""

    def __init__(self, module: torch.nn.Module, device: str = "cpu"):
        self.module, self.seconds, self.calls = module, 0.0, 0
        inner = module.forward

        def forward(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                _sync(device)
                self.seconds += time.perf_counter() - t0
                self.calls += 1
        module.forward = forward

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


class HFRunner:
    """transformers' generate: plain, with ``assistant_model`` (the draft), and with
    ``prompt_lookup_num_tokens``, on models loaded from the same weights as specd's."""

    PROMPT_LOOKUP_TOKENS = 10  # transformers' documented example value

    def __init__(self, target_dir, draft_dir, dtype: str, max_tokens: int, device: str = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch_dtype = getattr(torch, dtype)
        self.max_tokens, self.device = max_tokens, device
        self.tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        self.target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch_dtype).to(device).eval()
        self.draft = (AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch_dtype).to(device).eval()
                      if draft_dir is not None else None)
        for model in (self.target, self.draft):
            if model is not None:
                model.generation_config.eos_token_id = None  # like ignore_eos: exactly max_tokens
                model.generation_config.pad_token_id = self.tokenizer.pad_token_id or 0
        self._target_timer = _Timed(self.target, device)
        self._draft_timer = _Timed(self.draft, device) if self.draft is not None else None

    def run(self, c: BenchConfig, prompt: str, max_tokens: Optional[int] = None) -> Sample:
        ids = torch.tensor([self.tokenizer(prompt)["input_ids"]], device=self.device)
        kwargs = dict(max_new_tokens=max_tokens or self.max_tokens, do_sample=False)
        if c.method == "assisted":
            kwargs["assistant_model"] = self.draft
        elif c.method == "prompt_lookup":
            kwargs["prompt_lookup_num_tokens"] = self.PROMPT_LOOKUP_TOKENS
        self._target_timer.reset()
        if self._draft_timer:
            self._draft_timer.reset()
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(ids, **kwargs)
        _sync(self.device)
        seconds = time.perf_counter() - start
        tokens = out[0, ids.shape[1]:].tolist()
        draft_s = self._draft_timer.seconds if self._draft_timer and c.method == "assisted" else 0.0
        draft_calls = self._draft_timer.calls if self._draft_timer and c.method == "assisted" else 0
        return Sample(tokens, seconds, self._target_timer.seconds, draft_s, self._target_timer.calls,
                      draft_forwards=draft_calls)


@dataclass
class Results:
    """Samples by configuration and prompt: samples[label][prompt_name] = [Sample per rep]."""

    configs: list[BenchConfig]
    prompts: list[str]
    samples: dict[str, dict[str, list[Sample]]] = field(default_factory=dict)

    def add(self, c: BenchConfig, prompt: str, s: Sample) -> None:
        self.samples.setdefault(c.label, {}).setdefault(prompt, []).append(s)
