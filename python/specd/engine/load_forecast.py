"""How large the decode batch will be over the next requests' lifetimes: the goodput policy's
view of load, used to judge investments that pay off over many steps (a draft model's
catch-up on a new request's prompt).

Inputs, all measured while serving (nothing to tune):
- the clock: the sum of the engine's step times (forwards plus overhead), so it works on the
  wall clock and on the benchmark's virtual clock alike; idle time is not counted, so
  arrival rates are per busy second, which is what the batch size depends on;
- arrivals: a request counts as arrived when a policy first sees it;
- per arrival, its prompt tokens (the target's prefill work) and the tokens it may still
  generate; per finished request, the tokens it did generate;
- the scheduler's queue: requests waiting beyond the step's batch, and the batch limit.

Forecast (Little's law on the decode batch). With arrival rate lambda, R tokens per request,
a decode step of T(N) seconds at batch N, and a prefill costing P seconds of target time per
request, the steps stretch by 1 / (1 - lambda P) to make room for prefills, and
N = lambda * R * T(N) / (1 - lambda P), solved by fixed-point iteration (costs from plain
decoding, which is the conservative, larger forecast). The forecast is the batch limit when
requests are queued beyond the batch or lambda P >= 1 (prefills alone fill the engine), and is
never below the current batch.
"""

from __future__ import annotations

from collections import deque
from typing import Optional


class LoadForecast:
    WINDOW = 64          # arrivals the rate is measured over
    MIN_ARRIVALS = 3     # fewer: no rate estimate yet
    DECAY = 0.9          # weight kept by the per-request averages

    def __init__(self):
        self.clock = 0.0
        self.arrivals: deque[float] = deque(maxlen=self.WINDOW)
        self.seen: set[int] = set()
        self.prompt_tokens: Optional[float] = None
        self.arrival_tokens: Optional[float] = None   # tokens a request may generate, at arrival
        self.generated_tokens: Optional[float] = None  # tokens finished requests generated
        self.finished = 0
        self.waiting = 0
        self.max_batch: Optional[int] = None

    @classmethod
    def _average(cls, old: Optional[float], value: float) -> float:
        return value if old is None else cls.DECAY * old + (1 - cls.DECAY) * value

    def tick(self, seconds: float) -> None:
        self.clock += max(0.0, seconds)

    def arrive(self, request_id: int, prompt_tokens: int, remaining_tokens: int) -> None:
        if request_id in self.seen:
            return
        self.seen.add(request_id)
        self.arrivals.append(self.clock)
        self.prompt_tokens = self._average(self.prompt_tokens, prompt_tokens)
        self.arrival_tokens = self._average(self.arrival_tokens, min(remaining_tokens, 1 << 20))

    def finish(self, request_id: int, generated: int) -> None:
        if request_id in self.seen:
            self.seen.discard(request_id)
            if generated > 0:
                self.generated_tokens = self._average(self.generated_tokens, generated)
                self.finished += 1

    def queue(self, waiting: int, max_batch: int) -> None:
        """Requests queued beyond this step's batch, and the batch limit."""
        self.waiting, self.max_batch = max(0, waiting), max(1, max_batch)

    def rate(self, step_seconds: float) -> Optional[float]:
        """Arrivals per busy second over the window, or None before MIN_ARRIVALS."""
        if len(self.arrivals) < self.MIN_ARRIVALS:
            return None
        return len(self.arrivals) / max(self.clock - self.arrivals[0], step_seconds, 1e-9)

    def batch(self, current: int, target) -> int:
        """The forecast decode batch (see the module docstring); `target` is the target's CostModel."""
        limit = self.max_batch or max(current, 1)
        if self.waiting > 0:
            return limit
        step = target.predict(max(current, 1))
        lam = self.rate(step)
        if lam is None or not target.has_data:
            return max(current, 1)
        tokens = self.generated_tokens if self.finished >= 4 else self.arrival_tokens
        n = float(max(current, 1))
        for _ in range(32):
            base = int(round(n))
            prefill = max(0.0, target.predict(base + int(self.prompt_tokens or 0)) - target.predict(base))
            busy = lam * prefill
            if busy >= 1.0:
                return limit
            nxt = min(float(limit), lam * (tokens or 1.0) * target.predict(base) / (1.0 - busy))
            if abs(nxt - n) < 0.5:
                n = nxt
                break
            n = nxt
        return int(min(limit, max(current, round(n), 1)))
