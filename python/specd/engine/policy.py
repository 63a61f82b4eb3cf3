"""Speculation policies: how many draft tokens (k) each running request gets this step.

A policy sees the requests about to run and returns a k per request; the engine caps it by
what the request may still emit and by the context limit, and 0 means plain decoding. The
adaptive goodput controller (issue 6) plugs in here; this milestone ships the static ones.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from specd.engine.request import Request


class SpeculationPolicy(Protocol):
    def draft_tokens(self, requests: Sequence[Request], k_max: int) -> list[int]:
        """k in [0, k_max] for each request."""

    def observe(self, request: Request, proposed: int, accepted: int) -> None:
        """Feedback after a verify step (used by adaptive policies)."""


class NoSpeculation:
    def draft_tokens(self, requests: Sequence[Request], k_max: int) -> list[int]:
        return [0] * len(requests)

    def observe(self, request: Request, proposed: int, accepted: int) -> None:
        pass


class StaticPolicy:
    """The same k for every request and step."""

    def __init__(self, k: int):
        self.k = k

    def draft_tokens(self, requests: Sequence[Request], k_max: int) -> list[int]:
        return [min(self.k, k_max)] * len(requests)

    def observe(self, request: Request, proposed: int, accepted: int) -> None:
        pass
