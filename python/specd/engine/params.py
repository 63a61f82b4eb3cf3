"""User-facing parameters: per-request :class:`SamplingParams` and the engine's
:class:`SpeculationConfig`. Invalid values raise ``ValueError`` naming the parameter."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from specd.errors import InvalidArgumentError

METHODS = ("none", "ngram", "suffix", "draft")
MAX_LOGPROBS = 20  # the most alternatives SamplingParams.logprobs may ask for (vLLM's default cap)
MAX_N = 128  # the most completions one SamplingParams may ask for


def _check(ok: bool, name: str, value, rule: str) -> None:
    if not ok:
        raise InvalidArgumentError(f"{name} must be {rule}, got {value!r}")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on a request's output (vLLM's StructuredOutputsParams): exactly one of
    ``json`` (a JSON schema, as a dict or its JSON text), ``json_object`` (any JSON object),
    ``regex`` (a regular expression the whole output matches), ``choice`` (the output is one
    of these strings) or ``grammar`` (an EBNF grammar, xgrammar's syntax, root rule ``root``).
    engine/structured_outputs.py has the rules; it needs the ``xgrammar`` package
    (``pip install specd[structured]``)."""

    json: Union[dict, str, None] = None
    regex: Optional[str] = None
    choice: Optional[Sequence[str]] = None
    grammar: Optional[str] = None
    json_object: bool = False

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        if self.json_object:
            given.append("json_object")
        _check(len(given) == 1, "structured_outputs", self, "given exactly one of json, json_object, regex, "
               "choice or grammar")
        _check(self.json is None or isinstance(self.json, (dict, str)), "structured_outputs.json", self.json,
               "a JSON schema (a dict or a JSON string)")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, str) and value), f"structured_outputs.{name}", value,
                   "a non-empty string")
        if self.choice is not None:
            _check(not isinstance(self.choice, str) and len(self.choice) > 0
                   and all(isinstance(c, str) and c for c in self.choice), "structured_outputs.choice", self.choice,
                   "a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def key(self) -> tuple[str, str]:
        """(kind, text): what is compiled, the compiled grammars' cache key."""
        import json

        if self.json is not None:
            return "json", self.json if isinstance(self.json, str) else json.dumps(self.json, sort_keys=True)
        if self.json_object:
            return "json_object", ""
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(list(self.choice))
        return "grammar", self.grammar


@dataclass
class SamplingParams:
    """How one request is sampled (vLLM-like). ``temperature == 0`` is greedy.

    top_k: 0 (or -1) = off. top_p in (0, 1]. min_p in [0, 1]. max_tokens >= 1 new tokens.
    stop: strings that end the output (not included in the text). stop_token_ids: token ids
    that end it. ignore_eos: keep generating past the EOS token. seed: a per-request seed
    (same seed, same output); None uses the engine's seed and the request's index.
    structured_outputs: a StructuredOutputsParams constraining the output (a JSON schema, a
    regex, a choice, a grammar): the target's rows are masked to the tokens the constraint
    allows, so greedy and sampled decoding, speculative or not, follow it (drafts it rules
    out are rejected).
    n: completions per prompt (vLLM's n), each sampled independently, in
    ``RequestOutput.outputs``; with a seed, completion i is seeded seed + i (so completion 0
    is what n = 1 gives). ``LLM.generate`` takes any n; ``LLM.stream`` and ``add_request``
    take n = 1 (add the completions one by one: ``SamplingParams.completions``).
    logprobs: None = none; n in [0, 20] = per generated token, its log-probability and the n
    most likely tokens' under the target's raw distribution (log-softmax of its logits,
    before temperature and the cuts; engine/logprobs.py has the rules), in
    ``RequestOutput.logprobs`` and ``StreamChunk.logprobs``. prompt_logprobs: the same for
    each prompt token after the first (``RequestOutput.prompt_logprobs``, first entry None).

    Logits processors (vLLM's semantics; engine/logits_processors.py has the rules; they
    change the target distribution that greedy and sampled decoding, speculative or not,
    reproduce): min_tokens: EOS and stop_token_ids cannot come before this many new tokens.
    logit_bias: token id -> bias in [-100, 100] added to its logit. repetition_penalty > 0
    (1 = off): a prompt or output token's logit is divided by it when positive, multiplied
    when not. presence_penalty / frequency_penalty in [-2, 2]: subtracted from an output
    token's logit once / per occurrence.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    stop: Sequence[str] = field(default_factory=tuple)
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    ignore_eos: bool = False
    seed: Optional[int] = None
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    min_tokens: int = 0
    logit_bias: Optional[dict[int, float]] = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    structured_outputs: Optional[StructuredOutputsParams] = None

    def __post_init__(self) -> None:
        _check(isinstance(self.n, int) and not isinstance(self.n, bool) and 1 <= self.n <= MAX_N, "n", self.n,
               f"an int in [1, {MAX_N}]")
        _check(isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
               and self.temperature >= 0, "temperature", self.temperature, "a finite number >= 0")
        if self.top_k == -1:
            self.top_k = 0
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", self.top_k, "an int >= 0 (0 or -1 = off)")
        _check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(isinstance(self.min_p, (int, float)) and 0 <= self.min_p <= 1, "min_p", self.min_p, "in [0, 1]")
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", self.max_tokens, "an int >= 1")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               self.stop_token_ids, "ints >= 0")
        _check(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**64), "seed",
               self.seed, "None or an int in [0, 2**64)")
        _check(self.logprobs is None or (isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool)
                                         and 0 <= self.logprobs <= MAX_LOGPROBS),
               "logprobs", self.logprobs, f"None or an int in [0, {MAX_LOGPROBS}]")
        _check(self.prompt_logprobs is None or (isinstance(self.prompt_logprobs, int)
                                                and not isinstance(self.prompt_logprobs, bool)
                                                and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
               "prompt_logprobs", self.prompt_logprobs, f"None or an int in [0, {MAX_LOGPROBS}]")
        _check(isinstance(self.min_tokens, int) and not isinstance(self.min_tokens, bool)
               and 0 <= self.min_tokens <= self.max_tokens, "min_tokens", self.min_tokens, "an int in [0, max_tokens]")
        _check(self.logit_bias is None or (isinstance(self.logit_bias, dict) and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 and isinstance(b, (int, float))
            and math.isfinite(b) and -100 <= b <= 100 for t, b in self.logit_bias.items())),
               "logit_bias", self.logit_bias, "None or a dict of token ids (ints >= 0) to biases in [-100, 100]")
        _check(isinstance(self.repetition_penalty, (int, float)) and math.isfinite(self.repetition_penalty)
               and self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "a finite number > 0")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and math.isfinite(value) and -2 <= value <= 2, name, value,
                   "in [-2, 2]")
        _check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", self.structured_outputs, "None or a specd.StructuredOutputsParams")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def completions(self) -> list["SamplingParams"]:
        """The parameters of each of the n completions: n = 1, completion i seeded seed + i
        (mod 2**64) when a seed is given."""
        if self.n == 1:
            return [self]
        return [dataclasses.replace(self, n=1, seed=None if self.seed is None else (self.seed + i) % 2**64)
                for i in range(self.n)]

    @property
    def processed(self) -> bool:
        """Whether a logits processor changes this request's target distribution."""
        return bool(self.min_tokens or self.logit_bias or self.penalized or self.structured_outputs is not None)

    @property
    def needs_host_drafts(self) -> bool:
        """Whether its rows depend on the drafted tokens above them in ways worked out on the
        host (penalties, a grammar): its drafts must be on the host before verification."""
        return self.penalized or self.structured_outputs is not None

    @property
    def penalized(self) -> bool:
        """Whether a penalty applies (its rows then depend on the drafted tokens above them)."""
        return bool(self.repetition_penalty != 1 or self.presence_penalty or self.frequency_penalty)


@dataclass
class SpeculationConfig:
    """How the engine speculates.

    method: "none", "ngram" (prompt lookup), "suffix" (suffix index + cache of past outputs),
        "draft" (a draft model, given to LLM as ``draft=``), or several joined by "+" (or a
        list), e.g. "draft+suffix": the goodput policy then picks one per request and step.
    num_speculative_tokens: k, draft tokens per request per step (tree depth for ngram and
        suffix); 0 = no speculation; "auto" = the goodput policy chooses k per request and step
        (up to max_speculative_tokens).
    max_tree_nodes: node budget of ngram/suffix token trees under a static k (None: k), and the
        (largest) node budget of draft-model trees (None: k * draft_tree_width).
    draft_tree_width: 1: the draft model proposes a chain of k tokens. w > 1: it grows a token
        tree of depth k (EAGLE-2 style; cpp/include/specd/draft_tree_builder.h): each draft
        forward expands the w most probable frontier nodes into their w most probable
        children, and the max_tree_nodes nodes of highest path probability are verified
        (as deterministic candidates: lossless for greedy and sampled requests alike). With
        the goodput policy the depth is chosen per request and step, and the node budget
        (up to max_tree_nodes) after the draft grew the tree, from its path probabilities.
    ngram_min / ngram_max / ngram_candidates: prompt-lookup n-gram range and the number of
        distinct continuations merged into the tree.
    policy: "none", "static", "switch_off", "goodput" or a name registered by a plugin
        (entry-point group specd.policies); default: "goodput" for "auto", else "static".
    switch_off_batch: the switch_off policy speculates only while at most this many requests
        run in a step.
    jump_forward_tokens: jump-forward decoding for requests with structured outputs: where
        the policy gives such a request no drafts (always with method "none"), the text its
        grammar forces from here (e.g. the next key of a JSON schema) is verified as a draft
        chain of up to this many tokens (method "forced" in the telemetry). Lossless as any
        draft; 0: off. (With a proposer the forced tokens also lead its drafts, up to k.)
    """

    method: Union[str, Sequence[str]] = "none"
    num_speculative_tokens: Union[int, str] = 4
    max_speculative_tokens: int = 8
    max_tree_nodes: Optional[int] = None
    draft_tree_width: int = 1
    ngram_min: int = 1
    ngram_max: int = 4
    ngram_candidates: int = 1
    policy: Optional[str] = None
    switch_off_batch: int = 4
    jump_forward_tokens: int = 8

    def __post_init__(self) -> None:
        methods = self.method.split("+") if isinstance(self.method, str) else list(self.method)
        _check(len(methods) > 0 and all(m in METHODS for m in methods) and len(set(methods)) == len(methods),
               "method", self.method, f"one or more distinct of {METHODS}")
        _check(methods == ["none"] or "none" not in methods, "method", self.method, "'none' alone or not at all")
        self.methods: tuple[str, ...] = tuple(methods)
        auto = self.num_speculative_tokens == "auto"
        _check(auto or (isinstance(self.num_speculative_tokens, int) and 0 <= self.num_speculative_tokens <= 64),
               "num_speculative_tokens", self.num_speculative_tokens, "an int in [0, 64] or 'auto'")
        _check(isinstance(self.max_speculative_tokens, int) and 1 <= self.max_speculative_tokens <= 64,
               "max_speculative_tokens", self.max_speculative_tokens, "an int in [1, 64]")
        _check(self.max_tree_nodes is None or (isinstance(self.max_tree_nodes, int) and 0 <= self.max_tree_nodes <= 256),
               "max_tree_nodes", self.max_tree_nodes, "None or an int in [0, 256]")
        _check(isinstance(self.draft_tree_width, int) and 1 <= self.draft_tree_width <= 8, "draft_tree_width",
               self.draft_tree_width, "an int in [1, 8]")
        _check(self.draft_tree_width == 1 or "draft" in methods, "draft_tree_width", self.draft_tree_width,
               "1 unless the method includes 'draft'")
        _check(isinstance(self.ngram_min, int) and 1 <= self.ngram_min <= self.ngram_max <= 64,
               "ngram_min/ngram_max", (self.ngram_min, self.ngram_max), "1 <= ngram_min <= ngram_max <= 64")
        _check(isinstance(self.ngram_candidates, int) and self.ngram_candidates >= 1, "ngram_candidates",
               self.ngram_candidates, "an int >= 1")
        _check(isinstance(self.switch_off_batch, int) and self.switch_off_batch >= 1, "switch_off_batch",
               self.switch_off_batch, "an int >= 1")
        _check(isinstance(self.jump_forward_tokens, int) and 0 <= self.jump_forward_tokens <= 64,
               "jump_forward_tokens", self.jump_forward_tokens, "an int in [0, 64]")
        if self.policy is None:
            self.policy = "goodput" if auto and self.k > 0 else ("static" if self.k > 0 else "none")
        _check(isinstance(self.policy, str) and self.policy, "policy", self.policy, "a policy name")


    @property
    def method_name(self) -> str:
        return "+".join(self.methods)

    @property
    def k(self) -> int:
        """The largest k any request may get."""
        if self.methods == ("none",):
            return 0
        return self.max_speculative_tokens if self.num_speculative_tokens == "auto" else self.num_speculative_tokens

    @property
    def planner_node_budgets(self) -> tuple[int, int]:
        """(n-gram/suffix, draft) node budgets as the StepPlanner takes them: -1 where the
        budget of a depth-k proposal is k (draft trees: k * draft_tree_width)."""
        fixed = self.max_tree_nodes if self.max_tree_nodes is not None else -1
        return (-1 if self.policy == "goodput" else fixed), (fixed if self.draft_tree_width > 1 else -1)

    def draft_tree_nodes(self, k: int) -> int:
        """Node budget of a draft-model proposal of depth k: k for chains (the StepPlanner's rule)."""
        fixed = self.planner_node_budgets[1]
        return k if k == 0 or self.draft_tree_width == 1 else fixed if fixed >= 0 else k * self.draft_tree_width

    def tree_nodes(self, k: int) -> int:
        """Node budget of a tree proposal of depth k (ngram/suffix; the StepPlanner's rule)."""
        fixed = self.planner_node_budgets[0]
        return fixed if k > 0 and fixed >= 0 else k
