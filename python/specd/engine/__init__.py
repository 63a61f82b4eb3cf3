"""The speculative continuous-batching engine and its user-facing API."""

from specd.engine.llm import LLM
from specd.engine.outputs import RequestMetrics, RequestOutput, StreamChunk
from specd.engine.params import SamplingParams, SpeculationConfig
from specd.engine.policy import NoSpeculation, SpeculationPolicy, StaticPolicy

__all__ = ["LLM", "SamplingParams", "SpeculationConfig", "RequestOutput", "RequestMetrics", "StreamChunk",
           "SpeculationPolicy", "StaticPolicy", "NoSpeculation"]
