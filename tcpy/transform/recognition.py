"""The contraction engine's analysis: recognise GEMM-class statements and plan their blocking.

A *contraction* is a statement whose value is the product of two tensor accesses (optionally
times or over scalar literals, times rank-0 tensors, under casts and negations), summed with
``+=!`` or ``+=`` over index variables, every index affine in the index variables::

    C(m, n)    +=! A(m, k) * B(k, n)            GEMM
    C(b, i, j) +=! A(b, i, k) * B(b, j, k)      batched, B transposed
    O(n, f)    +=! X(n, c, h, w) * W(f, c, h, w)
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)   implicit-GEMM convolution
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H) ? I(n, c, h + kh - 1, w) * Wt(f, c, kh) : 0.0

A product (or one of its factors) under ``cond ? ... : 0`` is *guarded*: ``cond``, a conjunction
of affine comparisons of index variables and sizes (a padded convolution's window test), becomes
:class:`Guard` inequalities, and the packing of one operand writes zeros where they fail, so a
padded convolution runs as fast as one over a pre-padded input. The guard's variables must all
index that operand (``b``: batch, N, K, as in NCHW; else ``a``: batch, M, K, as in NHWC);
comparisons that hold on the whole domain are dropped.

The expression as written is what a guarded-off term means, whatever the sizes:

* ``g ? I(...) * W(...) : 0`` (the whole product guarded) adds nothing where ``g`` fails. The
  packed zeros contribute ``0 * x`` for the other operand's ``x``, which is 0 only for finite
  ``x``, so the generated kernel scans the other operand for inf and NaN, and such a call sums
  point by point (:mod:`tcpy.codegen.contraction.exact`; the winograd path checks
  both operands; the direct paths test the guard per tap);
* ``(g ? I(...) : 0) * W(...)`` (one factor guarded) multiplies that factor's 0 by the other
  where ``g`` fails (``0 * inf`` is NaN): the packed zeros are exactly that, so the zeros must be
  packed into that factor's operand and no path may skip the term
  (``Contraction.padding_multiplies``).

Other guards (around a literal only, or around the two factors separately) keep the loop path.

A product times or over factors that read no reduction variable (``O(b, t, e) +=! P(b, t, s) *
V(b, s, e) / l(b, t)``, ``C(m, n) +=! A(m, k) * B(k, n) * s(n) / sqrt(float(K))``) scales every
term of a row, column or element alike: :func:`split_result_scale` takes those factors out, so
that the engine sums the product and the scaling runs once per output element, in its store (an
epilogue), instead of once per term.

:func:`recognize` classifies its index variables by role — **batch** (output and both
operands), **M** (output and operand ``a``), **N** (output and operand ``b``), **K** (both
operands, reduced) — and describes every operand and the output as an :class:`AffineAccess`:
a base element offset plus one element stride per index variable, from the row-major shape.
Several variables may share a role; neighbours whose strides agree in every tensor of the role
merge into one dimension (``Group``), so a contiguous ``(c, h, w)`` is one K of ``C*H*W``.
Operands are ordered so that the output's contiguous variable is in N (vector stores).

The plan of a recognised contraction is :mod:`.contraction`'s; the engine's IR types are in
:mod:`tcpy.contraction_ir`.
"""
from __future__ import annotations

import array
import dataclasses
import math
from typing import Mapping, Optional

from ..contraction_ir import DTYPES, ROLES, AffineAccess, Contraction, Group, Guard, PaddedCopy, frozen_dataclass, row_major
from ..lang import ast
from ..lang.types import ScalarType
from ..ranges.affine import linear_bounds, linear_form


def _in_bounds(access: ast.Access, ranges, sizes, shapes) -> bool:
    """Whether ``access`` reads inside its tensor at every point of the rectangular ``ranges``
    (not only where a guard holds)."""
    for index, extent in zip(access.indices, shapes[access.tensor]):
        aff = linear_form(index, sizes, shapes)
        if aff is None or any(v not in ranges for v in aff[1]):
            return False
        low, high = linear_bounds(*aff, ranges)
        if low < 0 or high >= extent:
            return False
    return True




def _access(tensor: str, indices, dtype, ranges, sizes, shapes) -> Optional[AffineAccess]:
    shape = shapes[tensor]
    if len(indices) != len(shape):
        return None
    row = row_major(shape)
    offset, strides = 0, {}
    for d, index in enumerate(indices):
        aff = linear_form(index, sizes, shapes)
        if aff is None:
            return None
        const, coef = aff
        offset += row[d] * const
        for v, x in coef.items():
            if v not in ranges:
                return None
            offset += row[d] * x * ranges[v][0]
            strides[v] = strides.get(v, 0) + row[d] * x
    return AffineAccess(tensor, dtype, offset, tuple(sorted([(v, s) for v, s in strides.items() if s])),
                        math.prod(shape))


def _factors(expr: ast.Expr, dtype: ScalarType, out: dict) -> bool:
    """Split a product into tensor factors, literals and rank-0 tensors (into ``out``)."""
    if isinstance(expr, ast.Binary) and expr.op == "*":
        return expr.type is dtype and _factors(expr.lhs, dtype, out) and _factors(expr.rhs, dtype, out)
    if isinstance(expr, ast.Unary) and expr.op == "-":
        out["alpha"] = -out["alpha"]
        literal = isinstance(expr.operand, (ast.IntLit, ast.FloatLit))  # -2: typed as the literal
        return (literal or expr.type is dtype) and _factors(expr.operand, dtype, out)
    if isinstance(expr, (ast.IntLit, ast.FloatLit)):
        out["alpha"] *= _literal_value(expr)
        return True
    if isinstance(expr, ast.Binary) and expr.op == "/":  # x / 8: a literal divisor scales alpha
        divisor = expr.rhs.operand if isinstance(expr.rhs, ast.Cast) and expr.rhs.to is dtype else expr.rhs
        if expr.type is not dtype or not isinstance(divisor, (ast.IntLit, ast.FloatLit)):
            return False
        out["alpha"] /= _literal_value(divisor) or math.nan  # (x / 0: no finite alpha, not ours)
        return _factors(expr.lhs, dtype, out)
    if isinstance(expr, ast.Ternary):  # cond ? x : 0 is x under a guard
        if expr.type is not dtype or not _is_zero(expr.other):
            return False
        before = len(out["tensors"])
        if not _factors(expr.then, dtype, out):
            return False
        out["conds"].append((expr.cond, tuple(out["tensors"][before:])))  # (the reads it guards)
        return True
    cast = False
    if isinstance(expr, ast.Cast):
        if expr.to is not dtype:
            return False
        inner = expr.operand
        if isinstance(inner, (ast.IntLit, ast.FloatLit)):
            out["alpha"] *= _literal_value(inner)
            return True
        if not isinstance(inner, ast.Access) or inner.type is None or inner.type is ScalarType.BOOL:
            return False
        expr, cast = inner, True
    if isinstance(expr, ast.Access):
        if not cast and expr.type is not dtype:
            return False
        if not expr.indices:
            out["scalars"].append(expr.tensor)
        else:
            out["tensors"].append(expr)
        return True
    return False


def _literal_value(literal) -> float:
    """A literal's value in its checked type: a float literal is float32 in TC, so ``0.1``
    scales a double contraction by ``(double)0.1f``, as the loop path and the reference do."""
    if literal.type is ScalarType.FLOAT32:
        return array.array("f", [literal.value])[0]  # (rounds to nearest; too large: inf)
    return float(literal.value)


def _is_zero(expr: ast.Expr) -> bool:
    while isinstance(expr, ast.Cast):
        expr = expr.operand
    return isinstance(expr, (ast.IntLit, ast.FloatLit)) and float(expr.value) == 0.0


# a OP b as (sign, shift): sign * (a - b) + shift >= 0
_COMPARISONS = {">=": (1, 0), ">": (1, -1), "<=": (-1, 0), "<": (-1, -1)}


def _guards(cond: ast.Expr, ranges, sizes, shapes, keep: bool = False) -> Optional[list[Guard]]:
    """The inequalities of a conjunction of affine comparisons, or None for any other condition;
    ``keep``: also those that hold on the whole domain."""
    if isinstance(cond, ast.Binary) and cond.op == "&&":
        lhs, rhs = _guards(cond.lhs, ranges, sizes, shapes, keep), _guards(cond.rhs, ranges, sizes, shapes, keep)
        return None if lhs is None or rhs is None else lhs + rhs
    if not isinstance(cond, ast.Binary) or cond.op not in (*_COMPARISONS, "=="):
        return None
    lhs, rhs = linear_form(cond.lhs, sizes, shapes), linear_form(cond.rhs, sizes, shapes)
    if lhs is None or rhs is None or any(v not in ranges for v in (*lhs[1], *rhs[1])):
        return None
    out = []
    for sign, shift in ([(1, 0), (-1, 0)] if cond.op == "==" else [_COMPARISONS[cond.op]]):
        coefs = dict(lhs[1])
        for v, x in rhs[1].items():
            coefs[v] = coefs.get(v, 0) - x
        coefs = {v: sign * x for v, x in coefs.items() if x}
        const = sign * (lhs[0] - rhs[0]) + shift + sum(x * ranges[v][0] for v, x in coefs.items())
        lowest = const + sum(min(0, x * (ranges[v][1] - ranges[v][0] - 1)) for v, x in coefs.items())
        if lowest < 0 or keep:  # else it holds on the whole domain
            out.append(Guard(const, tuple(sorted(coefs.items()))))
    return out


def recognize(stmt: ast.Stmt, ranges: Mapping[str, tuple[int, int]], shapes, types,
              sizes: Mapping[str, int] = {}, keep_guards: bool = False) -> Optional[Contraction]:
    """The :class:`Contraction` a let-inlined checked statement computes, or None.

    ``ranges`` are the statement's concrete ``{var: (lo, hi)}``; ``shapes`` and ``types`` map
    every tensor to its concrete shape and element type; ``sizes`` the def's size variables.
    ``keep_guards``: keep the comparisons that hold on the whole domain too (a size-generic
    kernel's guards: other sizes may need them).
    """
    dtype = types.get(stmt.target)
    if (stmt.reduction != "+" or not stmt.reduction_vars or dtype not in DTYPES
            or stmt.rhs.type is not dtype or any(not isinstance(i, ast.IndexVar) for i in stmt.lhs)):
        return None
    found = {"alpha": 1.0, "scalars": [], "tensors": [], "conds": []}
    if not _factors(stmt.rhs, dtype, found) or len(found["tensors"]) != 2:
        return None
    if not math.isfinite(found["alpha"]):
        return None
    if any(ranges[v][1] <= ranges[v][0] for v in stmt.index_vars):
        return None  # empty domains keep the plain path (identity fill)
    first, second = found["tensors"]
    reads = {first.tensor, second.tensor, *found["scalars"]}
    if stmt.target in reads:
        return None
    # every guard around the whole product (a failing term adds nothing), or every guard around
    # the same one read (a failing term is 0 times the other operand); anything else is not ours
    guarded_reads = {under for _, under in found["conds"]}
    if any(len(under) == 0 for under in guarded_reads) or (len(guarded_reads) > 1 and any(
            len(under) == 1 for under in guarded_reads)):
        return None
    factor_guarded = next((under[0] for under in guarded_reads if len(under) == 1), None)
    guards = []
    for cond, _ in found["conds"]:
        more = _guards(cond, ranges, sizes, shapes, keep_guards)
        if more is None:
            return None
        guards.extend(more)
    accesses = []
    for acc in (first, second):
        affine = _access(acc.tensor, acc.indices, types[acc.tensor], ranges, sizes, shapes)
        if affine is None:
            return None
        accesses.append(affine)
    c = _access(stmt.target, stmt.lhs, dtype, ranges, sizes, shapes)
    if c is None:
        return None
    a, b = accesses
    operand_reads = {"a": first, "b": second}
    out = set(stmt.output_vars)
    in_a = {v for v, s in a.strides}
    in_b = {v for v, s in b.strides}
    roles = {r: [] for r in ROLES}
    extents = {v: ranges[v][1] - ranges[v][0] for v in stmt.index_vars}
    for v in stmt.index_vars:
        if extents[v] == 1:
            continue  # one value (its offset is in the accesses' and guards' constants): no role
        key = (v in out, v in in_a, v in in_b)
        role = {(True, True, True): "batch", (True, True, False): "m", (True, False, True): "n",
                (False, True, True): "k"}.get(key)
        if role is None:
            return None  # broadcast outputs, single-operand reductions: not a contraction
        roles[role].append(v)
    # The output's contiguous variable belongs in N (the vector dimension): swap the operands
    # (the product commutes exactly) when it is on a's side.
    c_inner = min(reversed(stmt.output_vars), key=lambda v: abs(c.stride(v)), default=None)
    if c_inner in roles["m"]:
        a, b = b, a
        operand_reads = {"a": second, "b": first}
        roles["m"], roles["n"] = roles["n"], roles["m"]
    # The guards are decided while packing one operand: every guard variable must index it.
    # The other operand is read at every point of the domain, so it must be inside its tensor
    # everywhere, also where the guard fails (a padded window can put the guard on the weights'
    # side when the image's output extent is 1, while the image is what it protects).
    # A guarded factor's zeros go into its own operand (0 times the other, as written).
    guard_vars = {v for g in guards for v, _ in g.coefs}
    guarded = next((w for w, free, other in (("b", "m", "a"), ("a", "n", "b"))
                    if not guard_vars & set(roles[free])
                    and (not guards or _in_bounds(operand_reads[other], ranges, sizes, shapes))
                    and (factor_guarded is None or operand_reads[w] is factor_guarded)), None)
    if guarded is None:
        return None
    groups = _groups(roles, extents, a, b, c, guards)
    con = Contraction(str(stmt), dtype, a, b, c, groups["batch"], groups["m"], groups["n"], groups["k"],
                      found["alpha"], tuple(found["scalars"]), bool(stmt.init), tuple(guards),
                      guarded if guards else "", bool(guards) and factor_guarded is not None,
                      extents=tuple([(v, extents[v]) for r in ROLES for v in roles[r]]))
    if guards and guarded == "b":
        copy = _padded_copy(operand_reads["b"], dtype, guards, roles, ranges, sizes, shapes)
        if copy is not None:
            dims, source_offset, padded_b = copy
            inner = dataclasses.replace(con, b=padded_b, guards=(), guarded="",
                                        **_groups(roles, extents, a, padded_b, c, ()))
            con = dataclasses.replace(con, padded=PaddedCopy(dims, source_offset, inner))
    return con


def split_result_scale(stmt: ast.Stmt) -> Optional[tuple[ast.Stmt, ast.Stmt]]:
    """``C(v) +=! P * f / g`` as ``C(v) +=! P`` and ``C(v) = C(v) * f / g`` when the factors and
    divisors ``f``, ``g`` of the statement's product read no reduction variable (they are the same
    for every term of an output element's sum, so they may scale the sum instead), else None.

    Only a statement that overwrites its target (``+=!``) splits: ``C += P * f`` would scale
    ``C``'s earlier values too. As with literal factors, the sum is then scaled once instead of
    each term: the results agree up to rounding and overflow of the unscaled sum, except where
    the scale is infinite (a divisor 0, a factor inf): there the sum's sign decides (inf, or NaN
    for a zero sum) instead of each term's (NaN as soon as one term is 0 or two differ in sign)."""
    if stmt.reduction != "+" or not stmt.init or not stmt.reduction_vars or stmt.rhs.type is None:
        return None
    if any(isinstance(w, ast.Exists) for w in stmt.where) or any(not isinstance(e, ast.IndexVar) for e in stmt.lhs):
        return None
    dtype = stmt.rhs.type
    factors: list[tuple[ast.Expr, bool]] = []  # (factor, divides)

    def flatten(expr: ast.Expr, divides: bool) -> None:
        if isinstance(expr, ast.Binary) and expr.op in ("*", "/") and expr.type is dtype:
            flatten(expr.lhs, divides)
            flatten(expr.rhs, divides != (expr.op == "/"))
        else:
            factors.append((expr, divides))

    flatten(stmt.rhs, False)
    reduced = set(stmt.reduction_vars)

    def is_scale(expr: ast.Expr) -> bool:
        nodes = list(expr.walk())
        while isinstance(expr, (ast.Cast, ast.Unary)):
            expr = expr.operand  # (a literal under casts and negations is alpha's: see _factors)
        return (nodes[0].type is dtype and not isinstance(expr, (ast.IntLit, ast.FloatLit))
                and not any((isinstance(n, ast.IndexVar) and n.name in reduced)
                            or (isinstance(n, ast.Access) and n.tensor == stmt.target) for n in nodes))

    scales = [(f, d) for f, d in factors if is_scale(f)]
    product = [(f, d) for f, d in factors if not is_scale(f)]
    if not scales or not product or product[0][1]:
        return None

    def fold(start: ast.Expr, terms) -> ast.Expr:
        for factor, divides in terms:
            start = ast.Binary("/" if divides else "*", start, factor, type=dtype)
        return start

    sum_stmt = dataclasses.replace(stmt, rhs=fold(product[0][0], product[1:]))
    scaled = ast.Stmt(stmt.target, stmt.lhs, None, False, fold(ast.Access(stmt.target, stmt.lhs, type=dtype), scales),
                      span=stmt.span, target_span=stmt.target_span, output_vars=stmt.output_vars)
    return sum_stmt, scaled


def _groups(roles, extents, a: AffineAccess, b: AffineAccess, c: AffineAccess, guards) -> dict:
    """Each role's variables merged into groups (:func:`_merge`) over the tensors it indexes."""
    strides = {"a": dict(a.strides), "b": dict(b.strides), "c": dict(c.strides),
               **{f"g{i}": dict(g.coefs) for i, g in enumerate(guards)}}
    # a guard is one more affine form of the variables: merged groups must keep it affine
    forms = tuple([f"g{i}" for i in range(len(guards))])
    groups = {}
    for role, primary, members in (("batch", "c", "abc"), ("m", "c", "ac"), ("n", "c", "bc"), ("k", "a", "ab")):
        vars_ = sorted(roles[role], key=lambda v: -abs(strides[primary].get(v, 0)))
        groups[role] = _merge(vars_, extents, strides, (*members, *forms), forms)
    return groups


def _padded_copy(read: ast.Access, dtype: ScalarType, guards, roles, ranges, sizes, shapes):
    """``(dims, source offset, access into the copy)`` of :class:`PaddedCopy` when every guard
    is one bound of one index of ``read`` (``index >= 0`` or ``index <= extent - 1``) over
    variables that are not batch variables, and no index mixes batch and other variables;
    None otherwise. The copy holds the dimensions the batch variables do not index, each
    widened by the zeros its index reaches outside the operand."""
    shape = shapes[read.tensor]
    row = row_major(shape)
    batch = set(roles["batch"])
    indices = []  # per dimension: (constant with variables counted from 0, {var: coefficient})
    for index in read.indices:
        const, coef = linear_form(index, sizes, shapes)
        coef = {v: x for v, x in coef.items() if x}
        indices.append((const + sum(x * ranges[v][0] for v, x in coef.items()), coef))
    copied = [d for d, (_, coef) in enumerate(indices) if not set(coef) & batch]
    if any(set(indices[d][1]) - batch for d in range(len(shape)) if d not in copied):
        return None  # an index of batch and other variables
    for g in guards:
        coefs = dict(g.coefs)
        if not any((indices[d][1] == coefs and g.const == indices[d][0])
                   or ({v: -x for v, x in indices[d][1].items()} == coefs
                       and g.const == shape[d] - 1 - indices[d][0]) for d in copied):
            return None
    dims = []
    for d in copied:
        const, coef = indices[d]
        low = const + sum(min(0, x * (ranges[v][1] - ranges[v][0] - 1)) for v, x in coef.items())
        high = const + sum(max(0, x * (ranges[v][1] - ranges[v][0] - 1)) for v, x in coef.items())
        dims.append((shape[d], row[d], max(0, -low), max(0, high - shape[d] + 1)))
    padded = [extent + lo + hi for extent, _, lo, hi in dims]
    pitch = row_major(padded)  # strides of the copy
    offset, strides = 0, {}
    for i, d in enumerate(copied):
        const, coef = indices[d]
        offset += (const + dims[i][2]) * pitch[i]
        for v, x in coef.items():
            strides[v] = strides.get(v, 0) + x * pitch[i]
    source_offset = sum(indices[d][0] * row[d] for d in range(len(shape)) if d not in copied)
    access = AffineAccess(f"{read.tensor} (zero-padded copy)", dtype, offset,
                          tuple(sorted([(v, x) for v, x in strides.items() if x])), math.prod(padded))
    return tuple(dims), source_offset, access


def _merge(vars_, extents, strides, members, guards) -> tuple[Group, ...]:
    """Groups of neighbouring variables that address every member (a tensor or a guard, by its
    name in ``strides``: its stride or coefficient per variable) like one variable."""
    groups: list[list[str]] = []
    for v in vars_:
        if groups:
            outer = groups[-1][-1]
            if all(strides[t].get(outer, 0) == extents[v] * strides[t].get(v, 0) for t in members):
                groups[-1].append(v)
                continue
        groups.append([v])
    a, b, c, forms = strides["a"], strides["b"], strides["c"], [strides[t] for t in guards]
    merged = []
    for g in groups:
        inner = g[-1]
        extent = extents[inner] if len(g) == 1 else math.prod([extents[v] for v in g])
        merged.append(Group(tuple(g), extent, a.get(inner, 0), b.get(inner, 0), c.get(inner, 0),
                            tuple([form.get(inner, 0) for form in forms])))
    return tuple(merged)


# ----------------------------------------------------------------------------- blocks of rows


@frozen_dataclass
class Base:
    """Where a block contraction's operand starts in ``tensor``: ``offset`` elements plus
    ``stride * (var - lo)`` for each variable of the loops around it (the blocked variable at
    the block's first row)."""

    tensor: str
    offset: int
    strides: tuple[tuple[str, int], ...]


def statement_accesses(stmt: ast.Stmt) -> dict[str, ast.Access]:
    """A statement's accesses by tensor: its reads, and its target as it writes it."""
    accesses = {node.tensor: node for node in stmt.rhs.walk() if isinstance(node, ast.Access)}
    accesses[stmt.target] = ast.Access(stmt.target, stmt.lhs)
    return accesses


def block_contraction(con: Contraction, stmt: ast.Stmt, ranges, fixed: tuple[str, ...], block_var: str,
                      rows: int, buffers: Mapping[str, str], program,
                      columns: Optional[tuple[str, int, int]] = None,
                      accesses: Optional[Mapping[str, ast.Access]] = None
                      ) -> Optional[tuple[Contraction, tuple[Base, Base, Base]]]:
    """``con`` restricted to one block of ``rows`` rows of ``block_var`` (an M variable, or the
    only K variable: the block's terms of a sum over the rows) inside loops over ``fixed`` (the
    batch and other M variables): those variables leave the roles and
    move into the operands' bases, so the same micro-kernel runs on each block. A tensor in
    ``buffers`` lives in the named per-thread block buffer, one row (its dimensions not indexed
    by ``fixed``) per value of ``block_var``. ``columns`` (variable, count, width) restricts an
    N or K variable to a block of ``count`` values too (the operands' bases then also move
    along it; a block buffer's row holds ``width`` of them); ``accesses``: the statement's
    (:func:`statement_accesses`), if at hand. None when the roles do not allow it, or when the
    contraction has guards (padding)."""
    fixed_set = set(fixed)
    summed = con.role_vars("k") == (block_var,)
    if (con.guards or not {v for v in con.role_vars("batch")} <= fixed_set
            or not (summed or block_var in con.role_vars("m") and set(con.role_vars("m")) <= fixed_set | {block_var})
            or fixed_set & set(con.role_vars("n") + con.role_vars("k"))):
        return None
    extents = {v: ranges[v][1] - ranges[v][0] for v in stmt.index_vars}
    extents[block_var] = rows
    local_ranges = {**ranges, block_var: (0, rows)}
    moving = {block_var}  # the variables whose block start moves the bases
    if columns is not None:
        column, count, width = columns
        if column not in con.role_vars("n") + con.role_vars("k"):
            return None
        extents[column] = count
        local_ranges[column] = (0, count)
        moving.add(column)
    accesses = accesses or statement_accesses(stmt)
    accs, bases = {}, []
    for which in "abc":
        acc = getattr(con, which)
        if acc.tensor in buffers:
            indices = accesses[acc.tensor].indices
            shared = fixed_set | {block_var}
            row = [(e, width if columns and isinstance(e, ast.IndexVar) and e.name == column else n)
                   for e, n in zip(indices, program.shapes[acc.tensor])
                   if not (isinstance(e, ast.IndexVar) and e.name in shared)]
            if len(row) != len(indices) - len(shared):
                return None
            kept, shape = [e for e, _ in row], [n for _, n in row]
            local = _access(acc.tensor, (ast.IndexVar(block_var),) + tuple(kept), acc.dtype, local_ranges,
                            program.sizes, {acc.tensor: (rows, *shape)})
            if local is None:
                return None
            accs[which] = local
            bases.append(Base(buffers[acc.tensor], 0, ()))
        else:
            accs[which] = AffineAccess(acc.tensor, acc.dtype, 0,
                                       tuple([(v, s) for v, s in acc.strides if v not in fixed_set]))
            bases.append(Base(acc.tensor, acc.offset,
                              tuple([(v, s) for v, s in acc.strides if v in fixed_set or v in moving])))
    groups, strides = {}, {which: dict(acc.strides) for which, acc in accs.items()}
    for role, primary, members in (("m", "c", "ac"), ("n", "c", "bc"), ("k", "a", "ab")):
        vars_ = sorted([v for v in con.role_vars(role) if v not in fixed_set],
                       key=lambda v: -abs(strides[primary].get(v, 0)))
        groups[role] = _merge(vars_, extents, strides, members, ())
    return (Contraction(con.stmt, con.dtype, accs["a"], accs["b"], accs["c"], (), groups["m"], groups["n"],
                        groups["k"], con.alpha, con.alpha_tensors, con.init), tuple(bases))
