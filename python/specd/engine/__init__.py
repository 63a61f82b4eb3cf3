"""The speculative continuous-batching engine and its user-facing API."""

from specd.engine.llm import LLM
from specd.engine.logprobs import Logprob
from specd.engine.outputs import RequestMetrics, RequestOutput, StreamChunk
from specd.engine.params import SamplingParams, SpeculationConfig, StructuredOutputsParams
from specd.engine.goodput import GoodputPolicy
from specd.engine.policies import available_policies, make_policy
from specd.engine.policy import (Decision, NoSpeculation, SpeculationPolicy, StaticPolicy, StepRequest, StepShape,
                                 SwitchOffPolicy)

__all__ = ["LLM", "SamplingParams", "SpeculationConfig", "StructuredOutputsParams", "RequestOutput", "RequestMetrics", "StreamChunk", "Logprob",
           "SpeculationPolicy", "StaticPolicy", "NoSpeculation", "SwitchOffPolicy", "GoodputPolicy", "Decision",
           "StepRequest", "StepShape", "available_policies", "make_policy"]
