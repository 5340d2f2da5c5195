"""AST -> isl: index and size expressions as piecewise quasi-affine functions, conditions as sets.

Everything lives on one isl space per statement: the def's size variables are parameters, the
statement's index variables are set dimensions. Expressions isl cannot represent (products of
variables, C's truncating division in values, tensor reads) raise :class:`NotAffine`.
"""
from __future__ import annotations

from typing import Optional

import islpy as isl

from ..lang import ast
from ..lang.visit import reads_tensor
from .affine import IndexAlgebra, NotAffine, fold_index
from .isl_helpers import CTX, PARAM, SET, lift_params, param_space


_COMPARE = {"<": "lt_set", "<=": "le_set", ">": "gt_set", ">=": "ge_set", "==": "eq_set", "!=": "ne_set"}


class Converter(IndexAlgebra):
    """Turns size and index expressions into isl piecewise affine functions on one space."""

    def __init__(self, params, dims, extents):
        self.space = (isl.Space.create_from_names(CTX, set=list(dims), params=list(params)) if dims
                      else param_space(params))
        self.ls = isl.LocalSpace.from_space(self.space)
        self.params = list(params)
        self.dims = list(dims)
        self.extents = extents  # tensor -> tuple of PwAff over the sizes

    def const(self, value: int) -> isl.PwAff:
        return isl.PwAff.from_aff(isl.Aff.val_on_domain(self.ls, isl.Val.int_from_si(CTX, value)))

    def var(self, name: str) -> isl.PwAff:
        return isl.PwAff.from_aff(isl.Aff.var_on_domain(self.ls, SET, self.dims.index(name)))

    def lift(self, pa: isl.PwAff) -> isl.PwAff:
        return lift_params(pa, len(self.dims))

    def universe(self) -> isl.Set:
        return isl.Set.universe(self.space)

    def affine(self, e: ast.Expr, index: bool = True) -> isl.PwAff:
        """The isl function of ``e``; raises :class:`NotAffine`.

        ``/`` and ``%`` round toward negative infinity inside index expressions only; in value
        expressions (ternary conditions) C truncates, which isl cannot express: not affine.
        """
        return fold_index(e, self, index)

    # the isl functions of the index algebra (fold_index calls them)

    def variable(self, name: str) -> Optional[isl.PwAff]:
        return self.var(name) if name in self.dims else None

    def size(self, name: str) -> isl.PwAff:
        return isl.PwAff.from_aff(isl.Aff.var_on_domain(self.ls, PARAM, self.params.index(name)))

    def extent(self, node: ast.DimRef) -> Optional[isl.PwAff]:
        dims = self.extents.get(node.tensor)
        if dims is None or not 0 <= node.dim < len(dims):
            return None
        return self.lift(dims[node.dim])

    def neg(self, a: isl.PwAff) -> isl.PwAff:
        return a.neg()

    def add(self, a: isl.PwAff, b: isl.PwAff) -> isl.PwAff:
        return a.add(b)

    def sub(self, a: isl.PwAff, b: isl.PwAff) -> isl.PwAff:
        return a.sub(b)

    def product(self, a: isl.PwAff, b: isl.PwAff) -> Optional[isl.PwAff]:
        return a.mul(b) if a.is_cst() or b.is_cst() else None

    def divisor(self, b: isl.PwAff, index: bool) -> Optional[int]:
        divisor = self._constant(b)
        return None if divisor in (None, 0) or not index else divisor

    def floor_div(self, a: isl.PwAff, divisor: int) -> isl.PwAff:
        return a.scale_down_val(isl.Val.int_from_si(CTX, divisor)).floor()

    def scale(self, a: isl.PwAff, k: int) -> isl.PwAff:
        return a.scale_val(isl.Val.int_from_si(CTX, k))

    def other(self, e: ast.Expr, index: bool) -> isl.PwAff:
        """Integral casts, ``min``/``max`` of two and ternaries with affine conditions."""
        if isinstance(e, ast.Cast) and e.to.is_integral:
            return self.affine(e.operand, index)
        if isinstance(e, ast.Call) and e.func in ("min", "max") and len(e.args) == 2:
            a, b = self.affine(e.args[0], index), self.affine(e.args[1], index)
            return a.min(b) if e.func == "min" else a.max(b)
        if isinstance(e, ast.Ternary):
            cond = self.condition(e.cond)
            then, other = self.affine(e.then, index), self.affine(e.other, index)
            return then.intersect_domain(cond).union_add(other.intersect_domain(self.universe().subtract(cond)))
        raise NotAffine(e, reads_tensor(e))

    @staticmethod
    def _constant(pa: isl.PwAff) -> Optional[int]:
        pieces = pa.get_pieces()
        if len(pieces) != 1 or not pieces[0][1].is_cst():
            return None
        val = pieces[0][1].get_constant_val()
        return val.to_python() if val.is_int() else None

    def condition(self, e: ast.Expr) -> isl.Set:
        """The set where a boolean expression holds; raises :class:`NotAffine`."""
        if isinstance(e, ast.Binary) and e.op in _COMPARE:
            return getattr(self.affine(e.lhs, False), _COMPARE[e.op])(self.affine(e.rhs, False))
        if isinstance(e, ast.Binary) and e.op in ("&&", "||"):
            a, b = self.condition(e.lhs), self.condition(e.rhs)
            return a.intersect(b) if e.op == "&&" else a.union(b)
        if isinstance(e, ast.Unary) and e.op == "!":
            return self.universe().subtract(self.condition(e.operand))
        if reads_tensor(e):
            raise NotAffine(e, True)
        raise NotAffine(e, False)


def guarded_accesses(e: ast.Expr, guard, conv: Converter, out: list):
    """Collect (access, guard set) pairs, following the lazy branches of ternaries."""
    if isinstance(e, ast.Ternary):
        guarded_accesses(e.cond, guard, conv, out)
        try:
            cond = conv.condition(e.cond)
        except NotAffine:  # a condition we cannot analyse may be true: keep the outer guard
            guarded_accesses(e.then, guard, conv, out)
            guarded_accesses(e.other, guard, conv, out)
            return
        base = guard if guard is not None else conv.universe()
        guarded_accesses(e.then, base.intersect(cond), conv, out)
        guarded_accesses(e.other, base.subtract(cond), conv, out)
        return
    if isinstance(e, ast.Access):
        out.append((e, guard))
    for child in e.children():
        guarded_accesses(child, guard, conv, out)
