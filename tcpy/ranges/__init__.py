"""Range inference: the iteration range of every index variable, output shapes, size preconditions.

Everything is computed with isl (islpy): sets and piecewise quasi-affine bounds whose parameters
are the def's size variables. Bounds are shown to people as sympy expressions printed in TC
syntax (``floor((H - KH)/2)`` prints as ``(H - KH)/2``).

* :mod:`.inference` — TC's rule and tcpy's decisions where TC is silent; :func:`infer` and its
  results (:class:`DefRanges`, bound to concrete sizes as :class:`BoundRanges`).
* :mod:`.convert` — index and size expressions of the AST as isl functions and sets.
* :mod:`.isl_helpers` — spaces, projections, bounds and their values at concrete sizes.
* :mod:`.symbolic` — isl bounds as sympy expressions and TC-style text.
* :mod:`.index_values` — the int32 index results of a statement at concrete sizes: the
  precondition that none overflows.
* :mod:`.report` — :func:`explain`, and the message of a violated size precondition.
"""
from .inference import BoundRanges, DefRanges, Precondition, StmtRanges, VarRange, infer
from .report import explain
from .symbolic import format_expr, format_shape, pw_to_sympy

__all__ = [
    "infer",
    "explain",
    "format_expr",
    "format_shape",
    "pw_to_sympy",
    "DefRanges",
    "BoundRanges",
    "StmtRanges",
    "VarRange",
    "Precondition",
]
