"""Bounds for people: isl piecewise quasi-affine functions -> sympy expressions -> TC-style text.

``pw_to_sympy`` turns a bound into one sympy expression of the size variables (``floor`` for
integer division, ``Min``/``Max`` where isl proves them equal); ``format_expr`` prints it in TC
syntax (``floor((H - KH)/2)`` prints as ``(H - KH)/2``); ``requires_text`` says a set of sizes
as conditions (``N + M <= P + 1``).
"""
from __future__ import annotations

import itertools

import islpy as isl
import sympy

from ..lang import ast
from .isl_helpers import PARAM


def pw_to_sympy(pa: isl.PwAff) -> sympy.Expr:
    """A piecewise quasi-affine bound as a sympy expression of the size variables.

    One expression when one piece's formula holds on the whole domain, ``Min``/``Max`` of the
    pieces' formulas when isl proves that equal, else a ``Piecewise``. Integer division
    becomes ``floor``.
    """
    pa = pa.coalesce()
    pieces = pa.get_pieces()
    if not pieces:
        return sympy.nan
    dom = pa.domain()
    affs = []
    for _, aff in pieces:
        if not any(aff.plain_is_equal(a) for a in affs):
            affs.append(aff)
    whole = [isl.PwAff.from_aff(a).intersect_domain(dom) for a in affs]
    for aff, candidate in zip(affs, whole):
        if candidate.ne_set(pa).is_empty():
            return _tidy(_aff_to_sympy(aff))
    # min/max of some of the pieces' formulas (pieces such as "0 when N = 0" may be redundant)
    for size in range(2, min(len(affs), 4) + 1) if len(affs) <= 6 else ():
        for subset in itertools.combinations(range(len(affs)), size):
            for combine, fn in ((isl.PwAff.min, sympy.Min), (isl.PwAff.max, sympy.Max)):
                total = whole[subset[0]]
                for k in subset[1:]:
                    total = combine(total, whole[k])
                if total.ne_set(pa).is_empty():
                    return fn(*[_tidy(_aff_to_sympy(affs[k])) for k in subset])
    return sympy.Piecewise(*[(_tidy(_aff_to_sympy(a)), sympy.Symbol(requires_text(s))) for s, a in pieces])


def _tidy(expr: sympy.Expr) -> sympy.Expr:
    """Move size variables into or out of ``floor`` so that they appear once:
    ``floor((H + KH)/2) - KH`` becomes ``floor((H - KH)/2)``."""
    floors = [t for t in sympy.Add.make_args(expr) if isinstance(t, sympy.floor)]
    for f in floors:
        num, den = sympy.fraction(sympy.together(f.args[0]))
        if not den.is_Integer:
            continue
        outside = expr - f
        for sym in sorted(num.free_symbols, key=str):
            o = outside.coeff(sym)
            if o.is_Integer and o != 0:
                num += o * den * sym
                outside -= o * sym
        expr = sympy.floor(sympy.expand(num) / den) + outside
    return expr


def _val(v: isl.Val) -> sympy.Rational:
    return sympy.Rational(str(v))


def _aff_to_sympy(aff: isl.Aff) -> sympy.Expr:
    expr = _val(aff.get_constant_val())
    for pos in range(aff.dim(PARAM)):
        c = aff.get_coefficient_val(PARAM, pos)
        if not c.is_zero():
            expr += _val(c) * sympy.Symbol(aff.get_dim_name(PARAM, pos), integer=True)
    for pos in range(aff.dim(isl.dim_type.div)):
        c = aff.get_coefficient_val(isl.dim_type.div, pos)
        if not c.is_zero():
            expr += _val(c) * sympy.floor(_aff_to_sympy(aff.get_div(pos)))
    return expr


def format_expr(expr) -> str:
    """Print a sympy bound in TC syntax: ``floor((I + 1)/2)`` prints as ``(I + 1)/2``."""
    expr = sympy.sympify(expr)
    if isinstance(expr, sympy.Integer):
        return str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, sympy.floor):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return format_expr(num)
        inner = format_expr(num)
        if not (num.is_Symbol or num.is_Integer):
            inner = f"({inner})"
        return f"{inner}/{format_expr(den)}"
    if isinstance(expr, (sympy.Min, sympy.Max)):
        return f"{type(expr).__name__.lower()}({', '.join(format_expr(a) for a in expr.args)})"
    if isinstance(expr, sympy.Add):
        terms = sorted(expr.args, key=lambda t: (t.is_Number, _sort_key(t)))
        positive = [t for t in terms if t.as_coeff_Mul()[0] > 0]
        if positive:  # lead with a positive term: `11 - I`, not `-I + 11`
            terms.remove(positive[0])
            terms.insert(0, positive[0])
        out = format_expr(terms[0])
        for t in terms[1:]:
            coeff = t.as_coeff_Mul()[0]
            if coeff < 0:
                out += " - " + format_expr(-t)
            else:
                out += " + " + format_expr(t)
        return out
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        if coeff == -1:
            return "-" + _atom(rest)
        if isinstance(coeff, sympy.Rational) and coeff.q != 1:
            return f"{_atom(coeff.p * rest)}/{coeff.q}"
        return "*".join(_atom(a) for a in ([coeff] if coeff != 1 else []) + list(sympy.Mul.make_args(rest)))
    if isinstance(expr, sympy.Rational):
        return f"{expr.p}/{expr.q}"
    if isinstance(expr, sympy.Piecewise):
        return " else ".join(f"{format_expr(e)} if {c}" for e, c in expr.args)
    return str(expr)


def _sort_key(term) -> int:
    # Size variables first, floor terms next, in the order sympy keeps them.
    return 1 if term.has(sympy.floor) else 0


def _atom(expr) -> str:
    text = format_expr(expr)
    return f"({text})" if isinstance(sympy.sympify(expr), (sympy.Add, sympy.floor)) else text


def format_shape(dims) -> str:
    """A shape of sympy extents as a tuple in TC syntax: ``(M, (N + 1)/2)``, ``(M,)``."""
    return ast.tuple_text(format_expr(d) for d in dims)


def requires_text(ok: isl.Set) -> str:
    """A parameter set as readable conditions: ``N + M <= P + 1``, alternatives joined by ``or``."""
    ok = ok.coalesce()
    if ok.is_empty():
        return "false"
    alternatives = []
    for bset in ok.get_basic_sets():
        if bset.dim(isl.dim_type.div):  # existentials: let isl say it
            text = str(ok)
            inner = text[text.index("{") + 1: text.rindex("}")].strip()
            return inner.split(":", 1)[1].strip() if ":" in inner else inner
        conds = [_constraint_text(c) for c in bset.get_constraints()]
        alternatives.append(" and ".join(conds) if conds else "true")
    if len(alternatives) == 1:
        return alternatives[0]
    return " or ".join(f"({a})" if " and " in a else a for a in alternatives)


def _constraint_text(c: isl.Constraint) -> str:
    left, right = [], []  # terms with negative / positive coefficients
    for pos in range(c.dim(PARAM)):
        coeff = c.get_coefficient_val(PARAM, pos).to_python()
        if coeff:
            name = c.get_dim_name(PARAM, pos)
            term = name if abs(coeff) == 1 else f"{abs(coeff)}*{name}"
            (right if coeff > 0 else left).append(term)
    const = c.get_constant_val().to_python()
    op = "=" if c.is_equality() else "<="
    # the constraint reads  sum(right) + const >= sum(left)  (or ==)
    if not left:
        return f"{' + '.join(right)} {'>=' if op == '<=' else '='} {-const}"
    if not right:
        return f"{' + '.join(left)} {op} {const}"
    if const > 0:
        right.append(str(const))
    elif const < 0:
        left.append(str(-const))
    return f"{' + '.join(left)} {op} {' + '.join(right)}"
