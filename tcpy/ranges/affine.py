"""Index expressions as affine functions: one structural analysis, two value domains.

:func:`fold_index` walks an index expression once for every pass that asks whether it is
(quasi-)affine; an :class:`IndexAlgebra` says what its leaves and operations are. Range
inference folds into isl functions of symbolic sizes (:class:`~tcpy.ranges.convert.Converter`);
at concrete sizes :func:`affine_form` folds into :class:`AffineForm` values, from which
contraction recognition reads strides and guards (:func:`linear_form`) and fusion and the
snapshot pass build exact dependences (:func:`access_map`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

import islpy as isl

from ..lang import ast


@dataclass(frozen=True)
class FloorDiv:
    """``floor(numerator / divisor)`` with a positive constant divisor: a quasi-affine term."""

    numerator: "AffineForm"
    divisor: int


Term = Union[str, FloorDiv]  # an index variable's name, or a floor division


@dataclass(frozen=True)
class AffineForm:
    """``constant + sum(coefficient * term)``; coefficients keep the order the terms were met
    in, and zero coefficients (``0 * i`` still names ``i``)."""

    constant: int
    coefficients: tuple[tuple[Term, int], ...] = ()

    def linear(self) -> Optional[tuple[int, dict[str, int]]]:
        """``(constant, {var: coefficient})`` when every term is an index variable, else None."""
        if any(not isinstance(term, str) for term, _ in self.coefficients):
            return None
        return self.constant, dict(self.coefficients)

    def isl(self, names: Mapping[str, str]) -> str:
        """isl text of the form, index variables renamed by ``names``."""
        parts = [f"{x}*{names[term] if isinstance(term, str) else _floor_text(term, names)}"
                 for term, x in self.coefficients]
        return " + ".join([*parts, str(self.constant)])


def _floor_text(term: FloorDiv, names: Mapping[str, str]) -> str:
    return f"floor(({term.numerator.isl(names)})/{term.divisor})"


def _combine(a: AffineForm, b: AffineForm, sign: int) -> AffineForm:
    coefficients = dict(a.coefficients)
    for term, x in b.coefficients:
        coefficients[term] = coefficients.get(term, 0) + sign * x
    return AffineForm(a.constant + sign * b.constant, tuple(coefficients.items()))


def _scale(form: AffineForm, k: int) -> AffineForm:
    return AffineForm(k * form.constant, tuple((term, k * x) for term, x in form.coefficients))


class NotAffine(Exception):
    """An index expression the algebra cannot represent; ``data`` when it reads a tensor."""

    def __init__(self, node: ast.Expr, data: bool):
        super().__init__(str(node))
        self.node = node
        self.data = data


class IndexAlgebra:
    """The values an index expression folds into: leaves, sums, products by a constant and
    floor divisions by a constant. A method returns None where its value is not representable."""

    def const(self, value: int): ...
    def variable(self, name: str): ...
    def size(self, name: str): ...
    def extent(self, node: ast.DimRef): ...
    def neg(self, a): ...
    def add(self, a, b): ...
    def sub(self, a, b): ...
    def product(self, a, b): ...
    def divisor(self, b, index: bool) -> Optional[int]: ...
    def floor_div(self, a, divisor: int): ...
    def scale(self, a, k: int): ...

    def other(self, e: ast.Expr, index: bool):
        """Any other node (casts, calls, ternaries, reads): not affine unless the algebra says so."""
        raise NotAffine(e, False)


def fold_index(e: ast.Expr, algebra: IndexAlgebra, index: bool = True):
    """The value of ``e`` in ``algebra``; raises :class:`NotAffine`.

    ``/`` and ``%`` round toward negative infinity inside index expressions (``index``); in
    value expressions C truncates, which the algebra's ``divisor`` may refuse."""
    if isinstance(e, ast.IntLit):
        value = algebra.const(e.value)
    elif isinstance(e, ast.IndexVar):
        value = algebra.variable(e.name)
    elif isinstance(e, ast.SizeVar):
        value = algebra.size(e.name)
    elif isinstance(e, ast.DimRef):
        value = algebra.extent(e)
    elif isinstance(e, ast.Unary) and e.op == "-":
        return algebra.neg(fold_index(e.operand, algebra, index))
    elif isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "%"):
        a, b = fold_index(e.lhs, algebra, index), fold_index(e.rhs, algebra, index)
        if e.op == "+":
            return algebra.add(a, b)
        if e.op == "-":
            return algebra.sub(a, b)
        if e.op == "*":
            value = algebra.product(a, b)
        else:
            divisor = algebra.divisor(b, index)
            if divisor is None:
                raise NotAffine(e, False)
            quotient = algebra.floor_div(a, divisor)
            return quotient if e.op == "/" else algebra.sub(a, algebra.scale(quotient, divisor))
    else:
        return algebra.other(e, index)
    if value is None:
        raise NotAffine(e, False)
    return value


class _Forms(IndexAlgebra):
    """:class:`AffineForm` values at concrete sizes and shapes."""

    def __init__(self, sizes: Mapping[str, int], shapes):
        self.sizes, self.shapes = sizes, shapes

    def const(self, value):
        return AffineForm(int(value))

    def variable(self, name):
        return AffineForm(0, ((name, 1),))

    def size(self, name):
        return AffineForm(int(self.sizes[name])) if name in self.sizes else None

    def extent(self, node):
        return AffineForm(int(self.shapes[node.tensor][node.dim]))

    def neg(self, a):
        return _scale(a, -1)

    def add(self, a, b):
        return _combine(a, b, 1)

    def sub(self, a, b):
        return _combine(a, b, -1)

    def product(self, a, b):
        if a.coefficients and b.coefficients:
            return None
        constant, form = (a, b) if not a.coefficients else (b, a)
        return _scale(form, constant.constant)

    def divisor(self, b, index):
        return None if b.coefficients or b.constant <= 0 else b.constant

    def floor_div(self, a, divisor):
        return AffineForm(0, ((FloorDiv(a, divisor), 1),))

    def scale(self, a, k):
        return _scale(a, k)


def affine_form(expr: ast.Expr, sizes: Mapping[str, int], shapes) -> Optional[AffineForm]:
    """The form of an index expression at concrete ``sizes`` and ``shapes``, or None when it is
    not quasi-affine in the index variables (a product of variables, a tensor read, a call, a
    division by anything but a positive constant, a size not in ``sizes``)."""
    try:
        return fold_index(expr, _Forms(sizes, shapes))
    except NotAffine:
        return None


def linear_form(expr: ast.Expr, sizes: Mapping[str, int], shapes) -> Optional[tuple[int, dict[str, int]]]:
    """``(constant, {var: coefficient})`` of an index expression affine in the index variables
    at concrete sizes (no floor division), or None."""
    if isinstance(expr, ast.IndexVar):  # (most indices: planning a new call shape reads many)
        return 0, {expr.name: 1}
    form = affine_form(expr, sizes, shapes)
    return None if form is None else form.linear()


def linear_bounds(constant: int, coefficients: Mapping[str, int], ranges) -> tuple[int, int]:
    """The smallest and largest value of ``constant + sum(coefficient * var)`` over the
    rectangular ``ranges`` (var -> half-open ``(lo, hi)``, not empty): each variable at its own
    extreme."""
    low = high = constant
    for var, x in coefficients.items():
        first, last = x * ranges[var][0], x * (ranges[var][1] - 1)
        low += min(first, last)
        high += max(first, last)
    return low, high


def access_map(access: ast.Access, loops: Sequence[str], ranges, sizes: Mapping[str, int], shapes,
               label: str) -> Optional[isl.Map]:
    """``{ label[loops] -> T[element] }`` over the rectangular ``ranges`` of the ``loops`` (in
    that order): the elements ``access`` touches; None when an index is not quasi-affine."""
    names = {v: f"x{i}" for i, v in enumerate(loops)}
    forms = [affine_form(e, sizes, shapes) for e in access.indices]
    if any(form is None for form in forms):
        return None
    domain = " and ".join(f"{ranges[v][0]} <= {names[v]} < {ranges[v][1]}" for v in loops) or "true"
    space = f"{label}[{', '.join(names[v] for v in loops)}]"
    return isl.Map(f"{{ {space} -> T[{', '.join(form.isl(names) for form in forms)}] : {domain} }}")
