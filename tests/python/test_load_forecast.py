"""LoadForecast: the decode batch the goodput policy expects over a request's lifetime."""

import pytest

from specd import _core
from specd.engine.load_forecast import LoadForecast


def flat_target(base=0.020, knee=64, per_token=0.00025):
    """A CostModel that has learned a memory-bound target: flat to the knee, then linear."""
    c = _core.CostModel()
    for _ in range(3):
        for n in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024):
            c.observe(n, base + max(0, n - knee) * per_token)
    return c


def arrive_every(f: LoadForecast, gap: float, n: int, prompt=100, tokens=64, start_id=0):
    for i in range(n):
        f.arrive(start_id + i, prompt, tokens)
        f.tick(gap)


def test_no_rate_before_enough_arrivals_keeps_the_current_batch():
    f = LoadForecast()
    f.queue(0, 64)
    f.arrive(1, 100, 64)
    assert f.rate(0.02) is None
    assert f.batch(3, flat_target()) == 3


def test_a_queue_beyond_the_batch_forecasts_the_batch_limit():
    f = LoadForecast()
    f.queue(5, 48)
    assert f.batch(10, flat_target()) == 48


def test_littles_law_at_light_load():
    # 2 arrivals per busy second, 64 tokens each, 20 ms decode steps, 100-token prompts
    # (their prefill adds 9 ms of target time each): N = 2 * 64 * 0.020 / (1 - 2 * 0.009) ~ 2.6.
    f = LoadForecast()
    f.queue(0, 64)
    arrive_every(f, 0.5, 40)
    assert f.rate(0.02) == pytest.approx(2.0, rel=0.05)
    assert f.batch(1, flat_target()) == 3


def test_prefill_work_beyond_capacity_forecasts_saturation():
    # 25 arrivals per second with 300-token prompts: prefills alone need 25 * 0.075 s > 1 s/s.
    f = LoadForecast()
    f.queue(0, 64)
    arrive_every(f, 0.04, 40, prompt=300)
    assert f.batch(8, flat_target()) == 64


def test_never_below_the_current_batch_and_finished_lengths_replace_the_cap():
    f = LoadForecast()
    f.queue(0, 64)
    arrive_every(f, 0.5, 40, tokens=1000)   # a large max_tokens ...
    long_cap = f.batch(1, flat_target())
    for i in range(40):
        f.finish(i, 16)                      # ... but requests stop after 16 tokens
    assert f.batch(1, flat_target()) < long_cap
    assert f.batch(12, flat_target()) == 12
