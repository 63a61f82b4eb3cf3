"""How the engine times its forwards and steps: on the wall clock, or, for simulations, on a
synthetic cost profile. With the synthetic timer, the load benchmark replays the engine's real
scheduling and acceptance decisions against a modelled GPU.

The synthetic profile models a memory-bound step: flat up to a compute knee, then linear.
Its parameters are the benchmark's command-line options. A measured profile
(:class:`MeasuredProfile`) instead interpolates forward times measured on a real GPU
(bench/gpu/profile_forwards.py writes them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import torch


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

    def forward(self, model: str, tokens: int, fn: Callable[[], Any]) -> tuple[Any, float]:
        t0 = self._now()
        result = fn()
        return result, self._now() - t0

    def step_begin(self) -> None:
        self._step_start = time.perf_counter()

    def step_seconds(self, forward_seconds: float) -> float:
        return time.perf_counter() - self._step_start


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

    def seconds(self, model: str, tokens: int) -> float:
        if model == "target":
            return self.target_base + max(0, tokens - self.target_knee) * self.target_per_token
        return self.draft_base + max(0, tokens - self.draft_knee) * self.draft_per_token


@dataclass(frozen=True)
class MeasuredProfile:
    """Forward times measured on a GPU, per model, as a function of the forward's tokens:
    piecewise-linear between the measured token counts (the median where several shapes had
    the same count), the first time below the smallest count, and the line through the last two
    points beyond the largest (one point: that time everywhere). ``step_overhead`` (seconds per step outside the forwards) is
    measured too. ``source`` says where the numbers come from (printed with every result)."""

    tokens: Mapping[str, tuple[int, ...]]     # model -> increasing token counts
    seconds_at: Mapping[str, tuple[float, ...]]
    step_overhead: float
    source: str = ""

    @staticmethod
    def from_points(points: Mapping[str, Sequence[Mapping]], step_overhead_ms: float,
                    source: str = "") -> "MeasuredProfile":
        """``points``: model -> [{"tokens": n, "ms": t}, ...] (bench/gpu/profile_forwards.py's
        "models"); "target" and "draft" are required, with at least one point each."""
        from specd.errors import InvalidArgumentError

        tokens, seconds = {}, {}
        for model in ("target", "draft"):
            by_tokens: dict[int, list[float]] = {}
            for p in points.get(model, ()):
                n, ms = int(p["tokens"]), float(p["ms"])
                if n < 1 or not ms > 0:
                    raise InvalidArgumentError(f"GPU profile: {model} point {dict(p)} needs tokens >= 1 and ms > 0")
                by_tokens.setdefault(n, []).append(ms)
            if not by_tokens:
                raise InvalidArgumentError(f"GPU profile: no measured points for the {model} model")
            ns = sorted(by_tokens)
            tokens[model] = tuple(ns)
            seconds[model] = tuple(float(np.median(by_tokens[n])) / 1e3 for n in ns)
        if not step_overhead_ms >= 0:
            raise InvalidArgumentError(f"GPU profile: step overhead must be >= 0 ms, got {step_overhead_ms}")
        return MeasuredProfile(tokens, seconds, step_overhead_ms / 1e3, source)

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
        return MeasuredProfile.from_points(models, overhead, source)

    def seconds(self, model: str, tokens: int) -> float:
        ns, ts = self.tokens[model], self.seconds_at[model]
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

    def forward(self, model: str, tokens: int, fn: Callable[[], Any]) -> tuple[Any, float]:
        return fn(), self.profile.seconds(model, tokens)

    def step_begin(self) -> None:
        pass

    def step_seconds(self, forward_seconds: float) -> float:
        return forward_seconds + self.profile.step_overhead
