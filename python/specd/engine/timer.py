"""How the engine times its forwards and steps: on the wall clock, or, for simulations, on a
synthetic cost profile. With the synthetic timer, the load benchmark replays the engine's real
scheduling and acceptance decisions against a modelled GPU.

The synthetic profile models a memory-bound step: flat up to a compute knee, then linear.
Its parameters are the benchmark's command-line options.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

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
