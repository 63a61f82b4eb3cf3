"""How the engine times its forwards and steps: on the wall clock, or, for simulations, on a
synthetic cost profile. With the synthetic timer, the load benchmark replays the engine's real
scheduling and acceptance decisions against a modelled GPU.

The synthetic profile models a memory-bound step: flat up to a compute knee, then linear.
Its parameters are the benchmark's command-line options. A measured profile
(:class:`MeasuredProfile`) instead interpolates forward times measured on a real GPU
(bench/gpu/profile_forwards.py writes them).

Timers take each forward's ``keys`` as well as its tokens: the attention work, the number
of (query, key) pairs its new tokens attend (a new token at position p attends p + 1 keys
under a causal mask; :func:`causal_keys`). A measured profile uses them to price a forward
of several sequences by what they attend, not as one sequence of as many tokens.

A step's time outside the forwards is the profile's ``step_overhead`` plus, with a
:class:`HostTime`, what depends on the step's shape (:class:`specd.StepShape`): per request,
per drafting request, per draft token and per draft forward. Speculation has host costs of
its own (on an H100 host, 0.16 ms per plain step against 0.98 ms drafting k = 4 at batch 1:
docs/bench/gpu/h100_forward_profile.json); a constant overhead hides them from the policies
being compared.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

import torch

from specd.engine.policy import StepShape


def causal_keys(start: int, count: int) -> int:
    """Keys attended by ``count`` new tokens at positions start .. start + count - 1 of one
    sequence under a causal mask (a tree's nodes attend at most as many)."""
    return count * start + count * (count + 1) // 2


class WallTimer:
    """Real time (with a CUDA synchronisation around device work)."""

    synthetic = False

    def __init__(self, sync_cuda: bool = False):
        self.sync_cuda = sync_cuda
        self._step_start = 0.0

    def _now(self) -> float:
        if self.sync_cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def forward(self, model: str, tokens: int, fn: Callable[[], Any], keys: Optional[int] = None,
                ) -> tuple[Any, float]:
        t0 = self._now()
        result = fn()
        return result, self._now() - t0

    def step_begin(self) -> None:
        self._step_start = time.perf_counter()

    def step_seconds(self, forward_seconds: float, shape: Optional[StepShape] = None) -> float:
        return time.perf_counter() - self._step_start


class EventSpan:
    """A forward's device time between two recorded CUDA events, read when asked (after the
    step's device work: reading it earlier would wait for the GPU)."""

    __slots__ = ("start", "end")

    def __init__(self, start, end):
        self.start, self.end = start, end

    def resolve(self) -> float:
        """Seconds from the start event to the end event (waits for the end event)."""
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3


class EventTimer:
    """Real time of CUDA work without host synchronisation: each forward is bracketed by two
    CUDA events on the current stream and reported as an :class:`EventSpan`, which the engine
    resolves at the end of the step. The host may then queue the next forward while the GPU
    still runs the previous one (the engine's device-resident drafts: the target's verify
    forward is queued behind the draft call). A span counts from when the GPU reached its start
    event, which is when the host recorded it if the GPU was idle (host work before the first
    kernel included, as a wall clock would) or when the previous work ended if it was busy.
    Step time is the host's wall clock (the step ends after the host has read the verify
    forward's results)."""

    synthetic = False

    def __init__(self, device: Optional[torch.device] = None):
        """``device``: the CUDA device whose current stream the forwards run on (None: the
        current device)."""
        self.device = device
        self._step_start = 0.0

    def forward(self, model: str, tokens: int, fn: Callable[[], Any], keys: Optional[int] = None,
                ) -> tuple[Any, EventSpan]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(torch.cuda.current_stream(self.device))
        result = fn()
        end.record(torch.cuda.current_stream(self.device))
        return result, EventSpan(start, end)

    def step_begin(self) -> None:
        self._step_start = time.perf_counter()

    def step_seconds(self, forward_seconds: float, shape: Optional[StepShape] = None) -> float:
        return time.perf_counter() - self._step_start


def resolve_seconds(seconds) -> float:
    """A timer's forward seconds: a number, or a pending span (``resolve()``)."""
    return seconds.resolve() if hasattr(seconds, "resolve") else seconds


@dataclass(frozen=True)
class HostTime:
    """Synthetic host time of a step that depends on its shape (seconds; all 0 by default):
    what the step costs outside the forwards beyond the profile's constant step_overhead."""

    per_request: float = 0.0
    per_drafting_request: float = 0.0
    per_draft_token: float = 0.0
    per_draft_forward: float = 0.0

    def __post_init__(self):
        from specd.errors import InvalidArgumentError

        if not all(x >= 0 for x in (self.per_request, self.per_drafting_request, self.per_draft_token,
                                    self.per_draft_forward)):
            raise InvalidArgumentError(f"host times must be >= 0 seconds, got {self}")

    @staticmethod
    def from_ms(values: Sequence[float]) -> "HostTime":
        """(per request, per drafting request, per draft token, per draft forward) in ms."""
        from specd.errors import InvalidArgumentError

        if len(values) != 4:
            raise InvalidArgumentError("host times: give 4 values in ms (per request, per drafting request, "
                                       f"per draft token, per draft forward), got {len(values)}")
        return HostTime(*(float(v) / 1e3 for v in values))

    def to_ms(self) -> list[float]:
        return [1e3 * x for x in (self.per_request, self.per_drafting_request, self.per_draft_token,
                                  self.per_draft_forward)]

    def seconds(self, shape: Optional[StepShape]) -> float:
        if shape is None:
            return 0.0
        return (self.per_request * shape.requests + self.per_drafting_request * shape.drafting_requests
                + self.per_draft_token * shape.draft_tokens + self.per_draft_forward * shape.draft_forwards)


@dataclass(frozen=True)
class GPUProfile:
    """Synthetic forward time: base + max(0, tokens - knee) * per_token, per model."""

    target_base: float = 0.020      # seconds of a memory-bound target forward
    target_knee: int = 64           # tokens it can process before it turns compute-bound
    target_per_token: float = 0.00025
    draft_base: float = 0.004
    draft_knee: int = 64
    draft_per_token: float = 0.00005
    step_overhead: float = 0.0005   # scheduling, proposing, verifying per step
    host: HostTime = HostTime()     # host time by step shape, on top of step_overhead

    def seconds(self, model: str, tokens: int, keys: Optional[int] = None) -> float:
        """``keys`` is ignored: the knee model has no attention term."""
        if model == "target":
            return self.target_base + max(0, tokens - self.target_knee) * self.target_per_token
        return self.draft_base + max(0, tokens - self.draft_knee) * self.draft_per_token


@dataclass(frozen=True)
class MeasuredProfile:
    """Forward times measured on a GPU, per model, as a function of the forward's tokens and
    attended keys (module docstring). ``step_overhead`` (seconds per step outside the
    forwards) is measured too; ``source`` says where the numbers come from (printed with
    every result). ``host`` adds host time by step shape (:class:`HostTime`; from the profile's
    ``host_ms`` when it has one: bench/gpu/profile_forwards.py fits it from the engine's steps).

    Model: seconds = base(tokens) + per_key * keys.
    - ``per_key``: the attention's time per (query, key) pair, fitted by least squares
      (seconds ~ a + b tokens + per_key keys, per_key >= 0) on the model's single-sequence
      prefill points (batch 1, no cached context; at least three token counts): there the
      keys grow as the square of the tokens, which separates the two terms. Without such
      points, or points that do not say their shape (batch, query, context), per_key is 0.
    - ``base``: each point's time less its attention term, the median where several points
      have the same token count, piecewise-linear between the counts, the first value below
      the smallest count, and the line through the last two beyond the largest (one point:
      that value everywhere).
    Why: a prefill step of the engine holds several prompts, whose attention is each
    prompt's own; interpolating one long sequence's measured time by total tokens charged
    five 200-token prompts as one 1024-token prompt (61 ms on the H100 profile instead of
    about 20).
    A forward timed without ``keys`` gets the measured times as they are (the same
    interpolation over the raw medians)."""

    tokens: Mapping[str, tuple[int, ...]]     # model -> increasing token counts
    seconds_at: Mapping[str, tuple[float, ...]]  # model -> median measured seconds at each count
    step_overhead: float
    source: str = ""
    base_at: Optional[Mapping[str, tuple[float, ...]]] = None  # model -> base seconds at each count
    per_key: Optional[Mapping[str, float]] = None               # model -> attention seconds per key
    host: HostTime = HostTime()                                 # host time by step shape

    @staticmethod
    def from_points(points: Mapping[str, Sequence[Mapping]], step_overhead_ms: float,
                    source: str = "") -> "MeasuredProfile":
        """``points``: model -> [{"tokens": n, "ms": t, "batch": b, "query": q,
        "context": c}, ...] (bench/gpu/profile_forwards.py's "models"; batch, query and
        context are optional); "target" and "draft" are required, with at least one point
        each."""
        from specd.errors import InvalidArgumentError

        tokens, seconds, base, per_key = {}, {}, {}, {}
        for model in ("target", "draft"):
            rows = []  # (tokens, ms, keys or None, single-sequence prefill)
            for p in points.get(model, ()):
                n, ms = int(p["tokens"]), float(p["ms"])
                if n < 1 or not ms > 0:
                    raise InvalidArgumentError(f"GPU profile: {model} point {dict(p)} needs tokens >= 1 and ms > 0")
                keys, prefill = None, False
                if all(f in p for f in ("batch", "query", "context")):
                    b, q, c = int(p["batch"]), int(p["query"]), int(p["context"])
                    if b < 1 or q < 1 or c < 0 or b * q != n:
                        raise InvalidArgumentError(f"GPU profile: {model} point {dict(p)} needs batch x query = "
                                                   "tokens and context >= 0")
                    keys, prefill = b * causal_keys(c, q), b == 1 and c == 0
                rows.append((n, ms, keys, prefill))
            if not rows:
                raise InvalidArgumentError(f"GPU profile: no measured points for the {model} model")
            per_key[model] = _fit_per_key(rows)
            raw, rest = {}, {}
            for n, ms, keys, _ in rows:
                raw.setdefault(n, []).append(ms)
                rest.setdefault(n, []).append(ms - per_key[model] * 1e3 * (keys or 0))
            ns = sorted(raw)
            tokens[model] = tuple(ns)
            seconds[model] = tuple(float(np.median(raw[n])) / 1e3 for n in ns)
            base[model] = tuple(max(0.0, float(np.median(rest[n]))) / 1e3 for n in ns)
        if not step_overhead_ms >= 0:
            raise InvalidArgumentError(f"GPU profile: step overhead must be >= 0 ms, got {step_overhead_ms}")
        return MeasuredProfile(tokens, seconds, step_overhead_ms / 1e3, source, base, per_key)

    @staticmethod
    def load(path) -> "MeasuredProfile":
        """A profile written by bench/gpu/profile_forwards.py."""
        import json

        from specd.errors import InvalidArgumentError

        try:
            with open(path) as f:
                data = json.load(f)
            models, overhead = data["models"], float(data["step_overhead_ms"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidArgumentError(f"cannot read the GPU profile {path}: {type(e).__name__}: {e}") from None
        meta = data.get("meta", {})
        source = f"{path} ({meta.get('device', 'unknown device')}, {meta.get('weights', '')})"
        profile = MeasuredProfile.from_points(models, overhead, source)
        if "host_ms" in data:
            try:
                host = HostTime.from_ms([data["host_ms"][k] for k in _HOST_KEYS])
            except (KeyError, TypeError, ValueError) as e:
                raise InvalidArgumentError(f"GPU profile {path}: host_ms needs {', '.join(_HOST_KEYS)} "
                                           f"(ms): {type(e).__name__}: {e}") from None
            profile = dataclasses.replace(profile, host=host)
        return profile

    def seconds(self, model: str, tokens: int, keys: Optional[int] = None) -> float:
        if keys is None or self.base_at is None or self.per_key is None:
            return _interpolate(self.tokens[model], self.seconds_at[model], tokens)
        return _interpolate(self.tokens[model], self.base_at[model], tokens) + self.per_key[model] * keys


# A profile's "host_ms" fields (HostTime.from_ms order).
_HOST_KEYS = ("per_request", "per_drafting_request", "per_draft_token", "per_draft_forward")


def _fit_per_key(rows) -> float:
    """MeasuredProfile's per_key (seconds) from (tokens, ms, keys, single-sequence prefill) rows."""
    pre = [(n, ms, keys) for n, ms, keys, prefill in rows if prefill]
    if len({n for n, _, _ in pre}) < 3:
        return 0.0
    a = np.array([[1.0, n, keys] for n, _, keys in pre])
    y = np.array([ms for _, ms, _ in pre])
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    return max(0.0, float(coef[2])) / 1e3


def _interpolate(ns: Sequence[int], ts: Sequence[float], tokens: int) -> float:
    """Piecewise-linear in tokens between the counts ``ns``; the first time below, the last
    segment's slope (never negative) beyond; one point: flat."""
    if tokens <= ns[0] or len(ns) == 1:
        return ts[0]
    if tokens >= ns[-1]:
        slope = (ts[-1] - ts[-2]) / (ns[-1] - ns[-2])
        return ts[-1] + max(0.0, slope) * (tokens - ns[-1])
    return float(np.interp(tokens, ns, ts))


class SyntheticTimer:
    """Runs every forward for real (so decisions are real) but reports the profile's times."""

    synthetic = True

    def __init__(self, profile: GPUProfile):
        self.profile = profile

    def forward(self, model: str, tokens: int, fn: Callable[[], Any], keys: Optional[int] = None,
                ) -> tuple[Any, float]:
        return fn(), self.profile.seconds(model, tokens, keys)

    def step_begin(self) -> None:
        pass

    def step_seconds(self, forward_seconds: float, shape: Optional[StepShape] = None) -> float:
        return forward_seconds + self.profile.step_overhead + self.profile.host.seconds(shape)
