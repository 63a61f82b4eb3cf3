"""Exceptions raised by specd. Each C++ status code of the core maps to one class here.

All derive from :class:`SpecdError`; where a builtin exception fits, the class also derives
from it (``InvalidArgumentError`` is a ``ValueError``, ``UnknownSequenceError`` a
``KeyError``, ``OutOfRangeError`` an ``IndexError``), so callers can catch either.
``OutOfPagesError`` is a normal, recoverable answer: the KV pool is full right now, nothing
changed, and a scheduler should preempt or speculate less.
"""

from __future__ import annotations


class SpecdError(Exception):
    """Base class of every specd error."""


class InvalidArgumentError(SpecdError, ValueError):
    """A value outside its documented range."""


class UnknownSequenceError(SpecdError, KeyError):
    """A sequence id the block manager does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class SequenceExistsError(SpecdError):
    """A sequence id that is already live."""


class OutOfRangeError(SpecdError, IndexError):
    """A position or length past what the sequence holds (e.g. rollback past its length)."""


class FailedPreconditionError(SpecdError):
    """The call is valid but not in the current state (e.g. commit more than reserved)."""


class OutOfPagesError(SpecdError):
    """The KV page pool cannot satisfy the request now; nothing was changed."""


class InternalError(SpecdError):
    """A broken internal invariant: a bug in specd. Please report it."""


class ModelLoadError(SpecdError):
    """A model could not be loaded: a missing, unreadable or corrupt file, or a weight missing."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture, quantization type or configuration is not supported."""


class IncompatibleModelsError(SpecdError):
    """The target and draft models cannot be paired (different vocabularies or tokenizers)."""


__all__ = [
    "SpecdError",
    "InvalidArgumentError",
    "UnknownSequenceError",
    "SequenceExistsError",
    "OutOfRangeError",
    "FailedPreconditionError",
    "OutOfPagesError",
    "InternalError",
    "ModelLoadError",
    "UnsupportedModelError",
    "IncompatibleModelsError",
]
