"""The errors of a bad Tiny IR program: the spec's validation errors, by the spec's names.

Each carries the offending node's id as ``err.node`` and names it in its message.
"""
from __future__ import annotations

from typing import Optional

from ..errors import TCError


class TinyIRError(TCError, ValueError):
    """A Tiny IR program that is malformed or that tcpy cannot compile (base class)."""

    def __init__(self, node: Optional[str], message: str):
        self.node = node
        where = f"node {node!r}: " if node is not None else ""
        super().__init__(f"Tiny IR {type(self).__name__}: {where}{message}")


class BroadcastMismatch(TinyIRError):
    """Right-aligned broadcasting meets two sizes that differ and are not 1 (or EXPAND cannot
    reach its result shape)."""


class AxisSizeMismatch(TinyIRError):
    """A RESHAPE whose result does not hold the same number of elements as its source."""


class InvalidPermutation(TinyIRError):
    """A PERMUTE whose ``perm`` repeats or misses an axis."""


class AccDtypeMissing(TinyIRError):
    """A REDUCE without its (mandatory) accumulation ``dtype``."""


class ExcessivePiecewise(TinyIRError):
    """Folded PAD/SHRINK/VIEW/RESHAPE maps that split one read into too many pieces (guards and
    floor divisions)."""


class DtypeMismatch(TinyIRError):
    """Operands of different dtypes: Tiny IR forbids implicit casts (insert a CAST)."""
