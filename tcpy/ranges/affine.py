"""Index expressions at concrete sizes as affine forms, and accesses as isl maps.

One analysis for every pass that asks what an index expression is once the sizes are known:
contraction recognition reads strides and offsets from the linear forms, fusion and the
snapshot pass build exact dependences from the access maps. (Range inference, on symbolic
sizes, has its own converter in :mod:`.convert`.)
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


def affine_form(expr: ast.Expr, sizes: Mapping[str, int], shapes) -> Optional[AffineForm]:
    """The form of an index expression at concrete ``sizes`` and ``shapes``, or None when it is
    not quasi-affine in the index variables (a product of variables, a tensor read, a call, a
    division by anything but a positive constant, a size not in ``sizes``)."""
    if isinstance(expr, ast.IntLit):
        return AffineForm(int(expr.value))
    if isinstance(expr, ast.IndexVar):
        return AffineForm(0, ((expr.name, 1),))
    if isinstance(expr, ast.SizeVar):
        return AffineForm(int(sizes[expr.name])) if expr.name in sizes else None
    if isinstance(expr, ast.DimRef):
        return AffineForm(int(shapes[expr.tensor][expr.dim]))
    if isinstance(expr, ast.Unary) and expr.op == "-":
        inner = affine_form(expr.operand, sizes, shapes)
        return None if inner is None else _scale(inner, -1)
    if not (isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*", "/", "%")):
        return None
    lhs, rhs = affine_form(expr.lhs, sizes, shapes), affine_form(expr.rhs, sizes, shapes)
    if lhs is None or rhs is None:
        return None
    if expr.op in ("+", "-"):
        return _combine(lhs, rhs, 1 if expr.op == "+" else -1)
    if expr.op == "*":
        if lhs.coefficients and rhs.coefficients:
            return None
        constant, form = (lhs, rhs) if not lhs.coefficients else (rhs, lhs)
        return _scale(form, constant.constant)
    if rhs.coefficients or rhs.constant <= 0:
        return None
    quotient = AffineForm(0, ((FloorDiv(lhs, rhs.constant), 1),))
    if expr.op == "/":
        return quotient
    return _combine(lhs, _scale(quotient, rhs.constant), -1)  # floor modulo, as in subscripts


def linear_form(expr: ast.Expr, sizes: Mapping[str, int], shapes) -> Optional[tuple[int, dict[str, int]]]:
    """``(constant, {var: coefficient})`` of an index expression affine in the index variables
    at concrete sizes (no floor division), or None."""
    form = affine_form(expr, sizes, shapes)
    return None if form is None else form.linear()


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
