"""specd: a speculative-decoding runtime (C++/CUDA core, thin Python layer).

:class:`LLM` generates text from real models (Hugging Face directories or GGUF files),
speculatively and losslessly, for many concurrent requests::

    llm = specd.LLM(target="model_dir_or.gguf", draft="draft_dir_or.gguf")
    outs = llm.generate(["def fib(n):"], specd.SamplingParams(temperature=0.0, max_tokens=64))

Underneath, the model-free core of speculation:

- the KV-cache layer: :class:`BlockManager` (paged KV allocator with lookahead slots,
  commit/rollback and copy-on-write fork, for target and draft models in one page pool) and
  :func:`slot_mapping`;
- model-free proposers (:class:`NgramProposer`, :class:`SuffixProposer`);
- token trees (:class:`TokenTree`, :class:`DraftTreeBuilder`), the sampling rules
  (:func:`sampling_probs`) and lossless verification (:func:`verify_greedy`, :func:`verify`).

See docs/api.md.
"""

from __future__ import annotations

from specd import errors
from specd._core import __version__
from specd.errors import (
    FailedPreconditionError,
    IncompatibleModelsError,
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    OutOfPagesError,
    OutOfRangeError,
    SequenceExistsError,
    SpecdError,
    UnknownSequenceError,
    UnsupportedModelError,
)
from specd.kv import BlockManager, Reservation, SeqKvInfo, kv_bytes_per_token, slot_mapping
from specd.engine import (
    LLM,
    Decision,
    Logprob,
    GoodputPolicy,
    NoSpeculation,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
    SpeculationConfig,
    SpeculationPolicy,
    StructuredOutputsParams,
    StaticPolicy,
    StepRequest,
    StepShape,
    StreamChunk,
    SwitchOffPolicy,
    available_policies,
    make_policy,
)
from specd.models import KernelChoice, LoadedModel, ModelConfig, check_compatible, load_model
from specd.proposers import NgramProposer, Proposals, Proposer, SuffixProposer
from specd.verification import (
    DraftTreeBuilder,
    TokenTree,
    VerifyOutput,
    philox_uniform,
    sample,
    sampling_probs,
    verify,
    verify_greedy,
    verify_greedy_tokens,
)


def built_with_cuda() -> bool:
    """True when this build of specd contains the CUDA kernels."""
    from specd import _core

    return bool(_core.built_with_cuda)


def cuda_available() -> bool:
    """True when the CUDA kernels are built in and a CUDA device is usable now."""
    from specd import _core

    return bool(_core.built_with_cuda) and _core.cuda_device_count() > 0


__all__ = [
    "__version__",
    "errors",
    "LLM",
    "SamplingParams",
    "SpeculationConfig",
    "StructuredOutputsParams",
    "RequestOutput",
    "RequestMetrics",
    "StreamChunk",
    "Logprob",
    "SpeculationPolicy",
    "StaticPolicy",
    "NoSpeculation",
    "SwitchOffPolicy",
    "GoodputPolicy",
    "Decision",
    "StepRequest",
    "StepShape",
    "available_policies",
    "make_policy",
    "load_model",
    "LoadedModel",
    "ModelConfig",
    "KernelChoice",
    "check_compatible",
    "BlockManager",
    "Reservation",
    "SeqKvInfo",
    "kv_bytes_per_token",
    "slot_mapping",
    "TokenTree",
    "DraftTreeBuilder",
    "Proposer",
    "NgramProposer",
    "SuffixProposer",
    "Proposals",
    "VerifyOutput",
    "sampling_probs",
    "verify_greedy",
    "verify_greedy_tokens",
    "verify",
    "sample",
    "philox_uniform",
    "built_with_cuda",
    "cuda_available",
    *errors.__all__,
]
