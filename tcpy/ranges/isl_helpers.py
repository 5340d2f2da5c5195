"""Small isl operations range inference is built from.

Spaces whose parameters are the def's size variables, a bound's value at concrete sizes,
projections, and the bounds and simplest forms of piecewise quasi-affine functions.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import islpy as isl

CTX = isl.DEFAULT_CONTEXT
SET = isl.dim_type.set
PARAM = isl.dim_type.param


def param_space(params) -> isl.Space:
    """The parameter space of the size variables ``params``."""
    return isl.Space.create_from_names(CTX, set=[], params=list(params)).params()


def value_at(pa: Optional[isl.PwAff], point: isl.Point) -> Optional[int]:
    """The value of ``pa`` at concrete sizes; None where it is undefined (an empty range)."""
    if pa is None:
        return None
    value = pa.eval(point)
    return None if value.is_nan() else value.to_python()


def affine_evaluator(bounds) -> tuple[Callable[[Mapping[str, int]], list], tuple[int, ...]]:
    """The ``bounds`` (each a bound over the sizes, or None: no bound) as one Python function of
    the sizes (name -> int) that gives the list of their :func:`value_at` values without isl, and
    the positions of those it cannot give (a piece or a constraint not affine with integer
    coefficients: a floor division), whose places in the list hold None for isl's values. A new
    call shape of a size-generic kernel evaluates every bound: one function compiled from text,
    each size read once, a few integer operations a bound."""
    names: dict[str, int] = {}  # size name -> its local's number
    texts, by_isl = [], []
    for position, pa in enumerate(bounds):
        text = None if pa is None else _affine_text(pa, names)
        if pa is not None and text is None:
            by_isl.append(position)
        texts.append(text or "None")
    unpack = "".join(f"p{i} = int(sizes[{name!r}])\n    " for name, i in names.items())
    text = f"def evaluate(sizes):\n    {unpack}return [{', '.join(texts)}]\n"
    scope: dict = {}
    exec(compile(text, "<bounds>", "exec"), scope)
    return scope["evaluate"], tuple(by_isl)


def _affine_text(pa: isl.PwAff, names: dict[str, int]) -> Optional[str]:
    """``pa`` as a Python expression of the locals ``p<i>`` (size ``name`` is ``p<names[name]>``,
    numbered here when new) whose value is None where ``pa`` is undefined; None when ``pa`` is not
    affine."""
    params = [pa.get_dim_name(PARAM, i) for i in range(pa.dim(PARAM))]

    def linear(obj) -> str:
        terms = []
        for i, name in enumerate(params):
            coefficient = obj.get_coefficient_val(PARAM, i)
            if not coefficient.is_zero():
                terms.append(f"{coefficient.to_python()} * p{names.setdefault(name, len(names))}")
        return " + ".join([str(obj.get_constant_val().to_python()), *terms])

    pieces = []
    for domain, aff in pa.get_pieces():
        if aff.dim(isl.dim_type.div) or aff.dim(isl.dim_type.in_) or not aff.get_denominator_val().is_one():
            return None
        cases = []  # the domain's basic sets, each a conjunction of its constraints
        for basic in domain.get_basic_sets():
            if basic.dim(isl.dim_type.div) or basic.dim(SET):
                return None
            cases.append(" and ".join(f"{linear(c)} {'==' if c.is_equality() else '>='} 0"
                                      for c in basic.get_constraints()) or "True")
        pieces.append(f"({linear(aff)}) if ({' or '.join(f'({case})' for case in cases) or 'False'}) else ")
    return f"({''.join(pieces)}None)"  # (None: outside, isl's NaN)


def lift_params(pa: isl.PwAff, n: int) -> isl.PwAff:
    """A bound over the sizes, as a function on a statement space with ``n`` dimensions."""
    return pa.insert_dims(isl.dim_type.in_, 0, n) if n else pa


def keep_dim(s: isl.Set, pos: int) -> isl.Set:
    """Existentially project out every set dimension but ``pos``."""
    n = s.dim(SET)
    return s.project_out(SET, pos + 1, n - pos - 1).project_out(SET, 0, pos)


def try_bound(s: isl.Set, which: str) -> Optional[isl.PwAff]:
    """The smallest (``which="min"``) or largest value of the only dimension of ``s``, over the sizes."""
    try:
        return (s.dim_min(0) if which == "min" else s.dim_max(0)).coalesce()
    except isl.Error:  # unbounded optimum: this set does not bound the variable that way
        return None


def simplest(pa: isl.PwAff) -> isl.PwAff:
    """``pa`` as one piece when one of its pieces' formulas holds on its whole domain."""
    pa = pa.coalesce()
    dom = pa.domain()
    for _, aff in pa.get_pieces():
        candidate = isl.PwAff.from_aff(aff).intersect_domain(dom)
        if candidate.ne_set(pa).is_empty():
            return candidate
    return pa
