"""Forward times the engine reads after the step (specd.engine.timer.EventTimer on a GPU): a
timer may return a pending span in place of seconds; the engine resolves it only at the end
of the step, after the verify forward was queued, reports the resolved seconds to the policy
and sums them into its timings. GPU: EventTimer's spans are real device times, and the engine
uses it by default on CUDA (skips without a GPU)."""

import pytest
import torch

import specd
from specd.engine.policy import StaticPolicy
from specd.engine.timer import EventTimer, WallTimer
from test_engine import greedy, make_llm, prompts_of_mixed_lengths, self_draft


class _Span:
    def __init__(self, log: list, model: str, seconds: float):
        self.log, self.model, self.seconds = log, model, seconds

    def resolve(self) -> float:
        self.log.append(("resolve", self.model))
        return self.seconds


class DeferringTimer(WallTimer):
    """The wall clock, each forward's seconds returned as a pending span (as EventTimer's)."""

    def __init__(self):
        super().__init__()
        self.log, self.spans = [], []

    def forward(self, model, tokens, fn, keys=None):
        result, seconds = super().forward(model, tokens, fn, keys)
        self.log.append(("forward", model))
        self.spans.append(seconds)
        return result, _Span(self.log, model, seconds)

    def step_begin(self) -> None:
        self.log.append(("step", None))
        super().step_begin()


class Observed(StaticPolicy):
    def __init__(self, k: int):
        super().__init__(k, ("draft",))
        self.forwards = []

    def observe_forward(self, model, tokens, seconds):
        assert isinstance(seconds, float)
        self.forwards.append((model, seconds))


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_llama_dir):
    draft = self_draft(tiny_llama_dir, tmp_path_factory.mktemp("timer_draft"))
    plain = make_llm(tiny_llama_dir)
    prompts = prompts_of_mixed_lengths(plain.tokenizer)
    return tiny_llama_dir, draft, prompts, [o.token_ids for o in plain.generate(prompts, greedy())]


def test_pending_spans_are_resolved_after_the_verify_forward(pair):
    target, draft, prompts, baseline = pair
    timer, policy = DeferringTimer(), Observed(3)
    llm = make_llm(target, draft, "draft", 3, timer=timer, policy=policy)
    assert [o.token_ids for o in llm.generate(prompts, greedy())] == baseline
    # Per step: every forward first (the draft's, then the target's), then their resolution.
    steps, current = [], None
    for event, model in timer.log:
        if event == "step":
            current = []
            steps.append(current)
        else:
            current.append((event, model))
    assert any(("forward", "draft") in s for s in steps)
    for s in steps:
        forwards = [m for e, m in s if e == "forward"]
        assert s == [("forward", m) for m in forwards] + [("resolve", m) for m in forwards]
    # The policy saw every span's seconds, in order; the timings are their sums.
    assert policy.forwards == [(m, t) for (e, m), t in zip([x for s in steps for x in s if x[0] == "forward"],
                                                           timer.spans)]
    t = llm.engine.timings
    assert t.draft_forward_s == pytest.approx(sum(s for m, s in policy.forwards if m == "draft"))
    assert t.target_forward_s == pytest.approx(sum(s for m, s in policy.forwards if m == "target"))
    assert t.draft_forwards == sum(m == "draft" for m, _ in policy.forwards)


def test_gpu_event_timer_times_the_device_work(pair):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: EventTimer records CUDA events")
    target, draft, prompts, _ = pair
    llm = make_llm(target, draft, "draft", 3, device="cuda")
    assert isinstance(llm.engine.timer, EventTimer)
    outs = llm.generate(prompts, greedy())
    t = llm.engine.timings
    assert t.steps > 0 and 0 < t.draft_forward_s and 0 < t.target_forward_s
    assert t.draft_forward_s + t.target_forward_s <= t.step_s
    assert all(o.token_ids for o in outs)
    # a span alone: a kernel of known duration
    timer = EventTimer()
    _, span = timer.forward("target", 1, lambda: torch.cuda._sleep(2_000_000))
    assert span.resolve() > 0
