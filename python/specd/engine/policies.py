"""Finding speculation policies by name: specd's built-ins and any package that registers
one under the ``specd.policies`` entry-point group.

An entry point names a callable that takes the engine's :class:`SpeculationConfig` and
returns a policy object (see specd.engine.policy.SpeculationPolicy). A class whose
``__init__(self, speculation)`` does that qualifies::

    # pyproject.toml of a third-party package
    [project.entry-points."specd.policies"]
    my_policy = "my_package.policies:MyPolicy"

    llm = specd.LLM(target, speculation=specd.SpeculationConfig(method="ngram", policy="my_policy"))
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable

from specd.engine.goodput import GoodputPolicy
from specd.engine.params import SpeculationConfig
from specd.engine.policy import NoSpeculation, SpeculationPolicy, StaticPolicy, SwitchOffPolicy
from specd.errors import InvalidArgumentError

GROUP = "specd.policies"


def none_policy(s: SpeculationConfig) -> SpeculationPolicy:
    return NoSpeculation(s.methods)


def static_policy(s: SpeculationConfig) -> SpeculationPolicy:
    return StaticPolicy(s.k, s.methods)


def switch_off_policy(s: SpeculationConfig) -> SpeculationPolicy:
    return SwitchOffPolicy(s.k, s.switch_off_batch, s.methods)


def goodput_policy(s: SpeculationConfig) -> SpeculationPolicy:
    return GoodputPolicy(s.methods, s.k, s.draft_tree_width)


BUILTIN: dict[str, Callable[[SpeculationConfig], SpeculationPolicy]] = {
    "none": none_policy, "static": static_policy, "switch_off": switch_off_policy, "goodput": goodput_policy}


def available_policies() -> dict[str, Callable[[SpeculationConfig], SpeculationPolicy]]:
    """Built-in policies and those registered by installed packages (which may override)."""
    found = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        found[ep.name] = ep  # loaded lazily by make_policy
    return found


def policy_factory(name: str) -> Callable[[SpeculationConfig], SpeculationPolicy]:
    """The callable that makes policy ``name`` (a plugin's entry point loaded). Looking names
    up reads every installed package's metadata (tens of milliseconds): a caller that makes
    the same policy again (LLM.reset) keeps the factory."""
    found = available_policies()
    if name not in found:
        raise InvalidArgumentError(f"unknown speculation policy {name!r}; available: {sorted(found)}")
    factory = found[name]
    if not callable(factory):  # an entry point
        try:
            factory = factory.load()
        except Exception as e:  # a broken plugin must not look like a specd bug
            raise InvalidArgumentError(f"speculation policy {name!r} could not be loaded: {e}") from e
    return factory


def build_policy(name: str, factory: Callable[[SpeculationConfig], SpeculationPolicy],
                 speculation: SpeculationConfig) -> SpeculationPolicy:
    """A new policy from ``policy_factory(name)``, checked to have the methods the engine calls."""
    policy = factory(speculation)
    for attr in ("decide", "observe", "observe_forward", "forget"):
        if not callable(getattr(policy, attr, None)):
            raise InvalidArgumentError(f"speculation policy {name!r} has no {attr}() method")
    if not hasattr(policy, "methods"):
        policy.methods = speculation.methods
    return policy


def make_policy(name: str, speculation: SpeculationConfig) -> SpeculationPolicy:
    return build_policy(name, policy_factory(name), speculation)
