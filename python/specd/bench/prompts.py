"""The built-in benchmark prompts, made on the spot from the Python standard library source
that every machine has, plus chat questions:

- completion: the first lines of a stdlib function (signature, docstring, some body);
  the model continues the code.
- edit: a whole stdlib function with an instruction to rewrite it (type hints, comments);
  the answer repeats much of the input, where prompt lookup and suffix proposals shine.
- chat: questions about programming, answered in prose.

Edit and chat prompts are wrapped in the tokenizer's chat template when it has one (the
Qwen2.5-Coder *Instruct* models); completion prompts are raw text.
"""

from __future__ import annotations

import colorsys
import fnmatch
import heapq
import inspect
import textwrap
from dataclasses import dataclass

# Pure-Python standard-library functions (C builtins and frozen modules have no source;
# any function whose source cannot be read on a machine is skipped).
_COMPLETION = (textwrap.dedent, heapq.nlargest, fnmatch.translate, colorsys.rgb_to_hls)
_EDIT = (textwrap.indent, colorsys.hls_to_rgb)
_CHAT = ("Explain the difference between a list and a tuple in Python, with a short example.",
         "What is a hash map, and why are lookups in it fast on average?")


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    kind: str   # "completion" | "edit" | "chat"
    text: str   # what the model sees (chat template applied)


def _head(fn, fraction: float = 0.45) -> str:
    lines = inspect.getsource(fn).splitlines(keepends=True)
    return textwrap.dedent("".join(lines[:max(3, int(len(lines) * fraction))]))


def _chat(tokenizer, user: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
    return user + "\n"


def _with_source(functions) -> list:
    out = []
    for f in functions:
        try:
            inspect.getsource(f)
            out.append(f)
        except (OSError, TypeError):
            pass
    return out


def builtin_prompts(tokenizer, quick: bool = False) -> list[BenchPrompt]:
    """The prompts of ``specd bench``: one of each kind (quick: one short completion)."""
    prompts = load_prompts(tokenizer)
    completion, edit, chat = ([p for p in prompts if p.kind == k] for k in ("completion", "edit", "chat"))
    if quick:
        short = [BenchPrompt(f"complete:{f.__qualname__}", "completion", _head(f, 0.6))
                 for f in _with_source((colorsys.rgb_to_hls,))]
        return short or completion[:1]
    return completion[:1] + edit[:1] + chat[:1]


def load_prompts(tokenizer) -> list[BenchPrompt]:
    """Every built-in prompt (completion, edit and chat; 8 where all sources are readable):
    the request mix of ``specd bench load``."""
    completion = [BenchPrompt(f"complete:{f.__qualname__}", "completion", _head(f))
                  for f in _with_source(_COMPLETION)]
    edit = [BenchPrompt(f"edit:{f.__qualname__}", "edit", _chat(tokenizer, (
        "Rewrite this Python function with type hints and a one-line comment before each block. "
        "Keep its behaviour and names.\n\n```python\n" + textwrap.dedent(inspect.getsource(f)) + "```")))
        for f in _with_source(_EDIT)]
    chat = [BenchPrompt(f"chat:{i}", "chat", _chat(tokenizer, q)) for i, q in enumerate(_CHAT)]
    return completion + edit + chat
