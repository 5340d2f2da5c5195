"""The contraction engine's analysis: recognise GEMM-class statements and plan their blocking.

A *contraction* is a statement whose value is the product of two tensor accesses (optionally
times scalar literals or rank-0 tensors, under casts and negations), summed with ``+=!`` or
``+=`` over index variables, every index affine in the index variables::

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
  point by point (:mod:`tcpy.codegen.contraction`, ``exact_fallback``; the winograd path checks
  both operands; the direct paths test the guard per tap);
* ``(g ? I(...) : 0) * W(...)`` (one factor guarded) multiplies that factor's 0 by the other
  where ``g`` fails (``0 * inf`` is NaN): the packed zeros are exactly that, so the zeros must be
  packed into that factor's operand and no path may skip the term
  (``Contraction.padding_multiplies``).

Other guards (around a literal only, or around the two factors separately) keep the loop path.

:func:`recognize` classifies its index variables by role — **batch** (output and both
operands), **M** (output and operand ``a``), **N** (output and operand ``b``), **K** (both
operands, reduced) — and describes every operand and the output as an :class:`AffineAccess`:
a base element offset plus one element stride per index variable, from the row-major shape.
Several variables may share a role; neighbours whose strides agree in every tensor of the role
merge into one dimension (``Group``), so a contiguous ``(c, h, w)`` is one K of ``C*H*W``.
Operands are ordered so that the output's contiguous variable is in N (vector stores).

:func:`plan` chooses, for a :class:`~tcpy.target.Target`, the micro-tile (``MR x NR``, from the
register file), the cache blocks ``kc``, ``mc``, ``nc`` (a footprint model of L1, L2 and L3,
after Low et al., "Analytical modeling is enough for high-performance BLIS"), the path
(``packed``: both operands packed into slivers, BLIS's five loops; ``small``: operands read in
place by a register-blocked kernel when everything already fits in L2 and one K block;
``winograd``: a 3x3 stride-1 convolution as Winograd's F(2x2, 3x3), :mod:`.winograd`, when its
estimated time beats the GEMM's) and the thread grid (batch x M x N x K cells, from a cost model
of compute, packing and split-K combination). :mod:`tcpy.codegen.contraction` renders the C
(:mod:`tcpy.codegen.winograd` the winograd path's).
"""
from __future__ import annotations

import array
import dataclasses
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

from ..errors import TCOptionError
from ..lang import ast
from ..lang.types import ScalarType
from ..target import Target
from ..contraction_ir import (DTYPES, ROLES, AffineAccess, Contraction, Group, Guard, PaddedCopy, Plan, POINTS,
                              WinogradForm, row_major)
from .winograd import GAIN_MIN, slivers_per_block, winograd_form
from .winograd import cycles as winograd_cycles
from .winograd import direct_cycles as gemm_cycles

def _affine(expr: ast.Expr, sizes: Mapping[str, int], shapes) -> Optional[tuple[int, dict[str, int]]]:
    """``(constant, {var: coefficient})`` of an affine index expression, or None."""
    if isinstance(expr, ast.IntLit):
        return int(expr.value), {}
    if isinstance(expr, ast.IndexVar):
        return 0, {expr.name: 1}
    if isinstance(expr, ast.SizeVar):
        return (int(sizes[expr.name]), {}) if expr.name in sizes else None
    if isinstance(expr, ast.DimRef):
        return int(shapes[expr.tensor][expr.dim]), {}
    if isinstance(expr, ast.Unary) and expr.op == "-":
        inner = _affine(expr.operand, sizes, shapes)
        return None if inner is None else (-inner[0], {v: -c for v, c in inner[1].items()})
    if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*"):
        lhs, rhs = _affine(expr.lhs, sizes, shapes), _affine(expr.rhs, sizes, shapes)
        if lhs is None or rhs is None:
            return None
        if expr.op == "*":
            if lhs[1] and rhs[1]:
                return None
            (k, _), (c, coef) = (lhs, rhs) if not lhs[1] else (rhs, lhs)
            return k * c, {v: k * x for v, x in coef.items()}
        sign = 1 if expr.op == "+" else -1
        coef = dict(lhs[1])
        for v, x in rhs[1].items():
            coef[v] = coef.get(v, 0) + sign * x
        return lhs[0] + sign * rhs[0], coef
    return None


def _in_bounds(access: ast.Access, ranges, sizes, shapes) -> bool:
    """Whether ``access`` reads inside its tensor at every point of the rectangular ``ranges``
    (not only where a guard holds)."""
    for index, extent in zip(access.indices, shapes[access.tensor]):
        aff = _affine(index, sizes, shapes)
        if aff is None or any(v not in ranges for v in aff[1]):
            return False
        const, coef = aff
        low = const + sum(min(x * ranges[v][0], x * (ranges[v][1] - 1)) for v, x in coef.items())
        high = const + sum(max(x * ranges[v][0], x * (ranges[v][1] - 1)) for v, x in coef.items())
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
        aff = _affine(index, sizes, shapes)
        if aff is None:
            return None
        const, coef = aff
        offset += row[d] * const
        for v, x in coef.items():
            if v not in ranges:
                return None
            offset += row[d] * x * ranges[v][0]
            strides[v] = strides.get(v, 0) + row[d] * x
    return AffineAccess(tensor, dtype, offset, tuple(sorted((v, s) for v, s in strides.items() if s)),
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


def _guards(cond: ast.Expr, ranges, sizes, shapes) -> Optional[list[Guard]]:
    """The inequalities of a conjunction of affine comparisons, or None for any other condition."""
    if isinstance(cond, ast.Binary) and cond.op == "&&":
        lhs, rhs = _guards(cond.lhs, ranges, sizes, shapes), _guards(cond.rhs, ranges, sizes, shapes)
        return None if lhs is None or rhs is None else lhs + rhs
    if not isinstance(cond, ast.Binary) or cond.op not in (*_COMPARISONS, "=="):
        return None
    lhs, rhs = _affine(cond.lhs, sizes, shapes), _affine(cond.rhs, sizes, shapes)
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
        if lowest < 0:  # else it holds on the whole domain
            out.append(Guard(const, tuple(sorted(coefs.items()))))
    return out


def recognize(stmt: ast.Stmt, ranges: Mapping[str, tuple[int, int]], shapes, types,
              sizes: Mapping[str, int] = {}) -> Optional[Contraction]:
    """The :class:`Contraction` a let-inlined checked statement computes, or None.

    ``ranges`` are the statement's concrete ``{var: (lo, hi)}``; ``shapes`` and ``types`` map
    every tensor to its concrete shape and element type; ``sizes`` the def's size variables.
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
        more = _guards(cond, ranges, sizes, shapes)
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
                      extents=tuple((v, extents[v]) for r in ROLES for v in roles[r]))
    if guards and guarded == "b":
        copy = _padded_copy(operand_reads["b"], dtype, guards, roles, ranges, sizes, shapes)
        if copy is not None:
            dims, source_offset, padded_b = copy
            inner = dataclasses.replace(con, b=padded_b, guards=(), guarded="",
                                        **_groups(roles, extents, a, padded_b, c, ()))
            con = dataclasses.replace(con, padded=PaddedCopy(dims, source_offset, inner))
    return con


def _groups(roles, extents, a: AffineAccess, b: AffineAccess, c: AffineAccess, guards) -> dict:
    """Each role's variables merged into groups (:func:`_merge`) over the tensors it indexes."""
    accs = {"a": a, "b": b, "c": c, **{f"g{i}": g for i, g in enumerate(guards)}}
    # a guard is one more affine form of the variables: merged groups must keep it affine
    forms = tuple(f"g{i}" for i in range(len(guards)))
    groups = {}
    for role, primary, members in (("batch", "c", "abc"), ("m", "c", "ac"), ("n", "c", "bc"), ("k", "a", "ab")):
        vars_ = sorted(roles[role], key=lambda v: -abs(accs[primary].stride(v)))
        groups[role] = _merge(vars_, extents, accs, (*members, *forms), forms)
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
        const, coef = _affine(index, sizes, shapes)
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
                          tuple(sorted((v, x) for v, x in strides.items() if x)), math.prod(padded))
    return tuple(dims), source_offset, access


def _merge(vars_, extents, accs, members, guards) -> tuple[Group, ...]:
    """Groups of neighbouring variables that address every member (a tensor or a guard, by its
    name in ``accs``) like one variable."""
    groups: list[list[str]] = []
    for v in vars_:
        if groups:
            outer = groups[-1][-1]
            if all(accs[t].stride(outer) == extents[v] * accs[t].stride(v) for t in members):
                groups[-1].append(v)
                continue
        groups.append([v])
    return tuple(Group(tuple(g), math.prod(extents[v] for v in g),
                       accs["a"].stride(g[-1]), accs["b"].stride(g[-1]), accs["c"].stride(g[-1]),
                       tuple(accs[t].stride(g[-1]) for t in guards))
                 for g in groups)


# ----------------------------------------------------------------------------- planning




PACK_COST = 0.5  # cycles per packed element (one load, one store, no reuse)
PACK_COST_FAR = 1.0  # the same when the operand does not fit in L2 (its loads come from L3)
READ_COST = 0.25  # cycles per element a cell reads in place from beyond L2 (memory bandwidth)
COMBINE_COST = 2.0  # cycles per element and partial of a split-K combination (written, then read)
FMA_PIPES = 2  # vector FMAs issued per cycle (the cost model's unit; Target has no port count)
COPY_B_MIN_TILES = 4
PACK_SHARE_MAX = 0.05  # packing A may cost this share of the FMA time (else the stream path)
SPAWN_COST = 10000.0  # cycles to wake and join an OpenMP team whose threads sleep (a few us)
# cycles a direct-path cell spends on each batch index it starts (a depthwise 3x3 layer of 56x56
# images split by rows at two threads, each cell starting every channel instead of half of them,
# ran 40 us slower: ~1000 cycles per channel)
DIRECT_BATCH_COST = 1000.0
# Rows of a micro-tile: taller tiles with fewer B vectors (14x2 with 32 registers: 14 broadcasts
# per k, every register taken) ran 5-15% below 8x3 with 32 wide registers in float and double,
# GEMMs and convolutions alike; with 16 registers the bound leaves 6x2, the tallest that fits.
MAX_TILE_ROWS = 8
NARROW_N_GAIN = 1.05  # a tile fitting N's extent better must win by this (8x3 ran ~5% above 6x4)
ONE_K_BLOCK_SLACK = 1.5  # K up to this many L1-sized K blocks runs as one when the output is beyond L2


def micro_tile(target: Target, element_bytes: int, n: Optional[int] = None) -> tuple[int, int]:
    """``(MR, NR vectors)``: accumulators ``MR x NRv`` + ``NRv`` vectors of B + one broadcast of
    A fit the vector registers, with no more loads (MR broadcasts + NRv vectors) than FMAs and
    at most ``MAX_TILE_ROWS`` rows. Most FMAs per k, on ties the taller tile (a narrower B
    sliver leaves L1 room for kc); given N's extent ``n``, a tile whose FMAs times the useful
    share of its columns (N in whole tiles) is ``NARROW_N_GAIN`` higher replaces it (N = 64
    with 48-wide tiles would compute 96 columns)."""
    regs, lanes = target.vector_registers, target.lanes(element_bytes)
    tallest = {}
    for nv in range(1, 5):
        fits = [mr for mr in range(1, MAX_TILE_ROWS + 1) if mr * nv + nv + 1 <= regs and mr + nv <= mr * nv]
        if fits:
            tallest[nv] = max(fits)
    if not tallest:  # a tiny register file: one row, one vector
        return 1, 1
    best = max(((mr, nv) for nv, mr in tallest.items()), key=lambda t: (t[0] * t[1], t[0]))
    if n is None:
        return best

    def useful(tile):
        mr, nv = tile
        nr = nv * lanes
        return mr * nv * n / (-(-n // nr) * nr)

    narrow = max(((mr, nv) for nv, mr in tallest.items()), key=lambda t: (useful(t), t[0]))
    return narrow if useful(narrow) > NARROW_N_GAIN * useful(best) else best


def _round_down(x: int, m: int) -> int:
    return max(m, x // m * m)


# ----------------------------------------------------------------------------- plan overrides

PATHS = ("packed", "small", "stream", "direct", "batch_lanes")  # the paths Options.plan may ask for


def _bad_plan(name: str, expected: str, got) -> None:
    raise TCOptionError(f"Options.plan[{name!r}] must be {expected}, got {got!r}")


def _multiple_of(name: str, value: int, multiple: int) -> int:
    if value % multiple:
        _bad_plan(name, f"a multiple of {multiple} for this contraction", value)
    return value


def _micro_tile_of(target: Target, element_bytes: int, n: int, overrides) -> tuple[int, int]:
    """``(MR, NR vectors)``: the planner's (:func:`micro_tile`), or the one ``overrides`` set,
    which must be whole vectors fitting the registers as :func:`micro_tile`'s do."""
    mr, nv = micro_tile(target, element_bytes, n)
    if "mr" not in overrides and "nr" not in overrides:
        return mr, nv
    lanes = target.lanes(element_bytes)
    mr = overrides.get("mr", mr)
    nr = _multiple_of("nr", overrides.get("nr", nv * lanes), lanes)
    nv = nr // lanes
    if mr > MAX_TILE_ROWS or nv > 4 or mr * nv + nv + 1 > target.vector_registers:
        _bad_plan("mr" if "mr" in overrides else "nr",
                  f"a micro-tile of at most {MAX_TILE_ROWS} rows and 4 vectors of {lanes} whose accumulators, "
                  f"B vectors and broadcast fit {target.vector_registers} registers (mr {mr}, nr {nr} do not)",
                  overrides.get("mr", overrides.get("nr")))
    return mr, nv


def _path_runs(path: str, con: Contraction) -> bool:
    """Whether ``path`` can compute ``con`` at all (whatever it would cost)."""
    if path == "direct":
        return _direct_ok(con)
    if path == "batch_lanes":
        return _batch_lanes_ok(con)
    if path == "small":
        return _small_layout_ok(con)
    if path == "stream":
        return _stream_layout_ok(con)
    return path == "packed"


def _grid_of(con, path, mr, nr, kc, mc, nc, lanes, threads, overrides) -> tuple[int, int, int, int]:
    """The least-cost thread grid (:func:`_grid`), or the one ``overrides`` set: at most
    ``threads`` cells, none empty, K split only on the packed path."""
    if "grid" not in overrides:
        return _grid(con, path, mr, nr, kc, mc, nc, lanes, threads)
    grid = tuple(overrides["grid"])
    batch, M, N, K = con.sizes
    limits = (batch, -(-M // mr), -(-N // nr), max(1, K // (2 * kc)) if path == "packed" else 1)
    if math.prod(grid) > threads or any(g > limit for g, limit in zip(grid, limits)):
        _bad_plan("grid", f"(batch, M, N, K) cells of at most {threads} thread(s) in all and at most "
                  f"{limits} for this contraction on the {path} path", grid)
    return grid


def _balanced(total: int, block: int, multiple: int) -> int:
    """A block size <= ``block`` (a multiple of ``multiple``) splitting ``total`` into equal
    blocks: 300 with block 200 gives 152, not 200 + 100."""
    if total <= block:
        return -(-total // multiple) * multiple
    count = -(-total // block)
    return -(-(-(-total // count)) // multiple) * multiple


def plan(con: Contraction, target: Target, threads: int, b_packed_once: bool = False,
         winograd: bool = True, overrides: Mapping[str, object] = MappingProxyType({})) -> Plan:
    """Micro-tile, cache blocks, path and thread grid of ``con`` on ``target`` with ``threads``.

    ``b_packed_once``: B is packed once for many calls (the blocks of a fused chain), so the
    small path (B read in place) never pays: ``stream`` or ``packed``. ``winograd``: the
    winograd path may be chosen (``Options.winograd``). ``overrides`` (``Options.plan``) set
    plan fields instead of the cost model: ``path``, ``mr``, ``nr``, ``kc``, ``mc``, ``nc``,
    ``grid``; a value this contraction cannot run with raises :class:`TCOptionError`."""
    s = con.dtype.bits // 8
    lanes = target.lanes(s)
    batch, M, N, K = con.sizes
    mr, nv = _micro_tile_of(target, s, N, overrides)
    nr = nv * lanes
    unroll = 4
    path_set = overrides.get("path")
    if path_set is not None and not _path_runs(path_set, con):
        _bad_plan("path", f"a path this contraction can run ({', '.join(p for p in PATHS if _path_runs(p, con))})",
                  path_set)
    if path_set in (None, "batch_lanes") and _batch_lanes_ok(con):
        # cells split M: each thread reads and writes whole rows of batch lanes (a pixel's
        # channels), contiguous in memory; the batch only when M has fewer rows than threads
        tm = min(M, threads)
        grid = (min(batch, threads // tm), tm, 1, 1)
        reasons = (f"batch-lanes path: N = 1, K = {K} (a window) and the batch ({batch}) contiguous in every "
                   "tensor, as in a depthwise convolution in NHWC: the vector lanes hold consecutive batch "
                   "indices, each output's K taps summed in registers (a guard decides a tap for all lanes)",
                   f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): rows of M first (each "
                   "thread's rows of batch lanes contiguous in memory)")
        return Plan("batch_lanes", 1, lanes, lanes, K, 1, 1, unroll, grid, threads, reasons)
    if path_set in (None, "direct") and _direct_ok(con):
        # M = 1: a micro-tile would fill one of its rows. Runs along N stop at nc outputs so that
        # the K rows of B a run reads stay in L1.
        nc = _round_down(target.l1d // 2 // (K * s), lanes)
        grid = _grid_of(con, "direct", mr, nr, K, 1, nc, lanes, threads, overrides)
        reasons = (f"direct path: M = 1 and K = {K} (a window, as in a depthwise convolution): each run of up "
                   f"to {nc} outputs along N sums its K taps in registers, vectorised along the run",
                   f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): least estimated time")
        # A cell that computes all of N for its batch indices copies each one's slice of B once,
        # with zeros around it, and reads the copy with no guards (no per-position tap lists
        # at the padded ends of a run), when the copy fits half of L2.
        copy_bytes = con.padded.elements * s if con.padded else 0
        padded_copy = bool(con.padded) and grid[2] == 1 and copy_bytes <= target.l2 // 2
        if padded_copy:
            reasons += (f"B's guards bound its own indices: each batch index's slice is copied with zeros around "
                        f"it ({copy_bytes // 1024} KiB, in half of L2) and read with no guards; "
                        + ("the zeros multiply the taps, as written" if con.padding_multiplies else
                           "batch indices whose taps are not all finite sum point by point (0 x inf must stay 0)"),)
        # (without the copy a run leaves out the taps whose guard fails: not a guarded factor's 0 x tap)
        if padded_copy or not con.padding_multiplies:
            return Plan("direct", mr, nr, lanes, K, 1, nc, unroll, grid, threads, reasons, padded_copy=padded_copy)
    reasons = [f"micro-tile {mr}x{nr}: {mr * nv} accumulators + {nv} B vectors + 1 broadcast "
               f"<= {target.vector_registers} registers of {target.vector_bytes} bytes"]
    if "mr" in overrides or "nr" in overrides:
        reasons[0] += " (set by Options.plan)"
    # Footprints (Low et al.): the B sliver (kc x NR) stays in L1 while A slivers (MR x kc)
    # stream through it. Of an L1 of W ways, A's slivers need C_A = floor((W - 1) / (1 + NR/MR))
    # ways and one way stays free for C, so B's sliver may fill W - 1 - C_A ways. The packed A
    # block (mc x kc) stays in half of L2; the packed B panel (kc x nc) in half of this core's
    # share of L3.
    a_ways = max(1, int((target.l1d_ways - 1) / (1 + nr / mr)))
    b_ways = max(1, target.l1d_ways - 1 - a_ways)
    kc_max = _round_down(target.l1d * b_ways // target.l1d_ways // (nr * s), unroll)
    form = winograd_form(con) if winograd and not b_packed_once and not overrides else None
    if form is not None:
        wplan = _winograd_plan(con, form, target, threads, kc_max, unroll)
        if wplan is not None:
            return wplan
    kc = _balanced(K, kc_max, unroll)
    reasons.append(f"kc {kc}: the B sliver kc x NR ({kc * nr * s // 1024} KiB) fills {b_ways} of {target.l1d_ways} "
                   f"ways of L1 ({target.l1d // 1024} KiB; A slivers {a_ways}, C 1); K = {K} in "
                   f"{-(-K // kc)} equal blocks")
    out_bytes = batch * M * N * s
    if kc < K <= ONE_K_BLOCK_SLACK * kc_max and out_bytes > target.l2:
        kc = _balanced(K, K, unroll)
        reasons.append(f"kc {kc}: K = {K} in one block, longer than the L1 fit ({kc_max}): a second block "
                       f"would read and write the output ({out_bytes // 1024} KiB, beyond L2) once more")
    if "kc" in overrides:
        kc = _multiple_of("kc", overrides["kc"], unroll)
        reasons.append(f"kc {kc}: set by Options.plan")
    mc_max = _round_down(target.l2 // 2 // (kc * s), mr)
    nc_max = _round_down(target.l3_per_core // 2 // (kc * s), nr)
    small = _small_ok(con, target, kc, s) and not b_packed_once
    if path_set is not None:
        small = path_set == "small"
    elif small and batch * -(-M // mr) * -(-N // nr) < threads and K >= 2 * kc:
        small = False  # fewer micro-tiles than threads: the packed path can split K
        reasons.append(f"packed path: {threads} threads and fewer micro-tiles; K = {K} can be split")
    if small:
        path = "small"
        reasons.append(f"small path: a K block of A and B ((M + N) x kc = {(M + N) * kc * s // 1024} KiB) "
                       f"fits half of L2: packing cannot pay")
    elif (path_set == "stream" or path_set is None and _stream_ok(
            con, target, kc_stream := min(kc, _stream_kc(target, N, s, unroll)), s, lanes) and (
            b_packed_once or batch * -(-M // mr) >= threads)):
        path = "stream"
        kc_stream = kc if "kc" in overrides else min(kc, _stream_kc(target, N, s, unroll))
        if kc_stream < kc:
            kc = _balanced(K, kc_stream, unroll)
            reasons.append(f"kc {kc} for the stream path: a K block of B fits half of L2")
        reasons.append(f"stream path: N = {N} is narrow, so packing A would cost more than "
                       f"{PACK_SHARE_MAX:.0%} of the FMAs; A is read in place, one micro-tile of rows at a "
                       f"time, against a packed K block of B (kc x N = {kc * N * s // 1024} KiB, in half of L2)")
    else:
        path = "packed"
    if path_set is not None:
        reasons.append(f"{path} path: set by Options.plan")
    grid = _grid_of(con, path, mr, nr, kc, mc_max, nc_max, lanes, threads, overrides)
    tb, tm, tn, tk = grid
    # Small path: a B sliver (kc x NR, rows far apart in B) is copied to be contiguous when
    # enough micro-tiles reuse it (its rows would otherwise crowd a few L1 sets).
    copy_b = small and -(-(-(-M // mr)) // tm) >= COPY_B_MIN_TILES
    if copy_b:
        reasons.append(f"small path copies each B sliver: {COPY_B_MIN_TILES}+ micro-tiles reuse it")
    m_part = -(-(-(-M // mr)) // tm) * mr
    n_part = -(-(-(-N // nr)) // tn) * nr
    # A cell whose rows fit one mc block packs its whole A (M rows by all of K) once (a
    # convolution's weights, a GEMM with few rows), in half of L2 or, K blocks beyond it, of
    # this core's L3 share: B panels then need no reuse across A blocks, so they stay in the
    # other half of L2 between packing and use (not in L3), and so does the output panel they
    # update, across K blocks (with L3-sized panels each K block re-read the output from L3).
    a_bytes = m_part * -(-K // kc) * kc * s
    a_once = path == "packed" and m_part <= mc_max and a_bytes <= max(target.l2, target.l3_per_core) // 2
    if a_once:
        nc_max = _round_down(target.l2 // 2 // (kc * s), nr)
    mc = _balanced(m_part, mc_max, mr)
    nc = _balanced(n_part, nc_max, nr)
    if "mc" in overrides or "nc" in overrides:
        mc = _multiple_of("mc", overrides.get("mc", mc), mr)
        nc = _multiple_of("nc", overrides.get("nc", nc), nr)
        a_once = a_once and m_part <= mc
        reasons.append(f"mc {mc}, nc {nc}: set by Options.plan")
    if a_once:
        where = f"L2 ({target.l2 // 1024} KiB)" if a_bytes <= target.l2 // 2 else \
            f"this core's L3 share ({target.l3_per_core // 1024} KiB; one mc block)"
        reasons.append(f"A packed once per cell: its {m_part} rows x K ({m_part * K * s // 1024} KiB) fit half "
                       f"of {where}")
        reasons.append(f"nc {nc}: the packed B panel kc x nc ({kc * nc * s // 1024} KiB) fits the other half of "
                       "L2 (no A block reuses it)")
    elif path == "packed":
        reasons.append(f"mc {mc}: the packed A block mc x kc ({mc * kc * s // 1024} KiB) fits half of L2 "
                       f"({target.l2 // 1024} KiB)")
        reasons.append(f"nc {nc}: the packed B panel kc x nc ({kc * nc * s // 1024} KiB) fits half of "
                       f"this core's L3 share ({target.l3_per_core // 1024} KiB)")
    reasons.append(f"thread grid {tb}x{tm}x{tn}x{tk} for {threads} thread(s): " + (
        "set by Options.plan" if "grid" in overrides else
        "least estimated time of compute + packing + split-K combination"))
    # An output written once (one K block) that is larger than the threads' halves of L3 would
    # only evict the operands: its whole tiles bypass the caches (no read for ownership, half
    # the memory traffic of the stores).
    stream_stores = (path != "direct" and con.init and K <= kc and tk == 1
                     and out_bytes > threads * target.l3_per_core // 2)
    if stream_stores:
        reasons.append(f"non-temporal stores: each output tile is written once (K = {K} in one block) and the "
                       f"output ({out_bytes / 2**20:.1f} MiB) exceeds half of the threads' L3 shares")
    return Plan(path, mr, nr, lanes, kc, mc, nc, unroll, grid, threads, tuple(reasons), copy_b, a_once,
                stream_stores)


def _winograd_plan(con: Contraction, form: WinogradForm, target: Target, threads: int, kc_max: int,
                   unroll: int) -> Optional[Plan]:
    """The winograd path's plan when its estimated time beats the direct GEMM's by GAIN_MIN."""
    s = con.dtype.bits // 8
    lanes = target.lanes(s)
    mr, nv = micro_tile(target, s, form.tiles)
    nr = nv * lanes
    fmas = FMA_PIPES * lanes
    batch, M, N, _ = con.sizes
    slivers = -(-form.tiles // nr)
    # per thread: the GEMM splits its micro-tiles over the threads, Winograd its tile slivers
    # (a few slivers cannot keep many threads busy)
    gemm = gemm_cycles(form, fmas) * batch / min(threads, batch * -(-M // mr) * -(-N // nr))
    fast = winograd_cycles(form, mr, nr, fmas) * batch / min(threads, batch * slivers)
    if gemm < GAIN_MIN * fast:
        return None
    kc = _balanced(form.K, kc_max, unroll)
    per_thread = -(-batch * slivers // threads)
    blocks = slivers_per_block(form, nr, s, target.l2, per_thread)
    rows = -(-form.M // mr) * mr
    mc = max(mr, min(rows, _round_down(target.l2 // 2 // (kc * s), mr)))
    grid = (1, 1, min(threads, batch * slivers), 1)
    u_bytes = batch * POINTS * rows * form.K * s
    reasons = (f"winograd path: {form.describe()}; estimated {gemm / fast:.2f}x less time than the GEMM "
               f"over all 9 taps with {threads} thread(s) (16 products on {mr}x{nr} micro-tiles and the "
               "transforms; the threads split the tile slivers)",
               f"transformed weights once per call: {POINTS} x {rows} x {form.K} ({u_bytes // 1024} KiB)",
               f"blocks of {blocks * nr} tiles: the block's transformed input and products "
               f"({POINTS * (form.K + rows) * blocks * nr * s // 1024} KiB) per thread",
               f"kc {kc}: a transformed input sliver kc x NR ({kc * nr * s // 1024} KiB) stays in L1",
               f"mc {mc}: a block of one point's transformed weights mc x kc ({mc * kc * s // 1024} KiB) stays "
               f"in half of L2 while the block's tile slivers pass",
               f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): the threads claim blocks "
               "of tile slivers, transform and multiply them")
    return Plan("winograd", mr, nr, lanes, kc, mc, blocks * nr, unroll, grid, threads, reasons, winograd=form)


DIRECT_K_MAX = 64  # longest reduction the direct path takes (a window; beyond, a GEMM's reuse wins)


def _direct_ok(con: Contraction) -> bool:
    """M = 1 (no M variables) with a short K: a micro-tile would fill one of its MR rows, so each
    output row is computed directly (depthwise convolution, pooling-like windows). The output's
    inner N variable must be contiguous (vector stores), and a guard must be B's (its runs along N
    are what the path clamps)."""
    return (not con.m and con.size("k") <= DIRECT_K_MAX and bool(con.n) and con.n[-1].c == 1
            and con.guarded != "a")


def _batch_lanes_ok(con: Contraction) -> bool:
    """N = 1 (no N variables) with a short K, the batch's inner group contiguous in all three
    tensors, and guards (if any) on A that do not depend on the batch: a depthwise convolution
    in NHWC (batch = channels, M = pixels, K = the window). A micro-tile would fill one of its
    NR columns; instead the vector lanes hold consecutive batch indices, and a guard decides a
    tap for all of them at once (so it leaves out a failing tap: not for a guarded factor, whose
    failing taps are 0 times the other operand)."""
    if (con.n or not con.m or not con.batch or con.size("k") > DIRECT_K_MAX or con.guarded == "b"
            or con.padding_multiplies):
        return False
    inner = con.batch[-1]
    return (inner.a == inner.b == inner.c == 1 and con.a.dtype is con.dtype and con.b.dtype is con.dtype
            and all(g.stride(f"g{i}") == 0 for g in con.batch for i in range(len(con.guards))))


def _stream_ok(con: Contraction, target: Target, kc: int, s: int, lanes: int) -> bool:
    """A read in place when packing it costs too much for its reuse: each A element feeds
    ``N / lanes`` vector FMAs (``N / lanes / FMA_PIPES`` cycles) and its copy ``PACK_COST``
    cycles (``PACK_COST_FAR`` when A does not fit in L2). The K block of B (``kc x N``) must
    fit half of L2."""
    _, M, N, K = con.sizes
    cost = PACK_COST if M * K * s <= target.l2 else PACK_COST_FAR
    if cost * lanes * FMA_PIPES / max(1, N) <= PACK_SHARE_MAX or kc * N * s > target.l2 // 2:
        return False
    return _stream_layout_ok(con)


def _stream_layout_ok(con: Contraction) -> bool:
    """A can be read in place: unguarded, of the contraction's type, linear along M and K."""
    m_stride = con.linear_stride("m", "a")
    return (con.a.dtype is con.dtype and bool(con.k) and con.linear_stride("k", "a") is not None
            and con.guarded != "a" and m_stride is not None and (not con.m or m_stride != 0))


def _stream_kc(target: Target, N: int, s: int, unroll: int) -> int:
    """The longest K block of B (``kc x N``) that fits half of L2, at least ``4 * unroll``
    (shorter blocks would spend more on the output tile's loads and stores than on FMAs)."""
    return max(4 * unroll, _round_down(target.l2 // 2 // max(1, N * s), unroll))


def _small_ok(con: Contraction, target: Target, kc: int, s: int) -> bool:
    """Operands read in place when a K block of both (``(M + N) x kc``) already sits in half of
    L2: each packed element would be reused too few times to pay for its copy."""
    _, M, N, K = con.sizes
    return (M + N) * kc * s <= target.l2 // 2 and _small_layout_ok(con)


def _small_layout_ok(con: Contraction) -> bool:
    """Both operands can be read in place: unguarded (a guarded operand is only read by
    packing), of the contraction's type, one variable per role, B's N unit-stride."""
    if con.guards or con.a.dtype is not con.dtype or con.b.dtype is not con.dtype:
        return False
    single = all(len(getattr(con, r)) <= 1 for r in ("m", "n", "k"))
    unit = bool(con.n) and con.n[0].b == 1 and con.n[0].c == 1
    return single and unit and bool(con.k)


def cell_cost(con: Contraction, path: str, mr: int, nr: int, nc: int, lanes: int, grid, threads: int) -> float:
    """Estimated cycles of the slowest thread for a thread grid (the cost model of :func:`plan`)."""
    batch, M, N, K = con.sizes
    tb, tm, tn, tk = grid
    cells = tb * tm * tn * tk
    rounds = -(-cells // threads)
    bp = -(-batch // tb)
    mp = -(-(-(-M // mr)) // tm) * mr
    np_ = -(-(-(-N // nr)) // tn) * nr
    kp = -(-K // tk)
    compute = bp * mp * np_ * kp / lanes / FMA_PIPES
    pack = 0.0
    if path == "packed":
        pack = bp * (mp * kp * -(-np_ // nc) + kp * np_) * PACK_COST
    elif path == "stream":  # B's block packed; A read in place by every cell that needs it
        pack = bp * kp * (np_ * PACK_COST + mp * READ_COST)
    if path == "direct":  # each batch index a cell starts: its A values, tap tables, padded rows
        pack = bp * DIRECT_BATCH_COST
    combine = (batch * M * N * tk / threads * COMBINE_COST) if tk > 1 else 0.0
    spawn = SPAWN_COST if cells > 1 else 0.0
    return rounds * (compute + pack) + combine + spawn


def _grid(con, path, mr, nr, kc, mc, nc, lanes, threads) -> tuple[int, int, int, int]:
    batch, M, N, K = con.sizes
    limits = (batch, -(-M // mr), -(-N // nr), max(1, K // (2 * kc)) if path == "packed" else 1)
    best = None
    for grid in _grids(limits, threads):
        cost = cell_cost(con, path, mr, nr, nc, lanes, grid, threads)
        # ties: no split K, then more cells (the same slowest cell, less work for the others and
        # for a descheduled thread), then split N before M (each thread packs its own B)
        key = (round(cost, 6), grid[3], -math.prod(grid), grid[1])
        if best is None or key < best[0]:
            best = (key, grid)
    return best[1]


def _grids(limits, threads):
    """Every (tb, tm, tn, tk) within ``limits`` with at most ``threads`` cells."""
    def rec(i, left):
        if i == len(limits):
            yield ()
            return
        for t in range(1, min(limits[i], left) + 1):
            for rest in rec(i + 1, left // t):
                yield (t,) + rest
    return rec(0, max(1, threads))


# ----------------------------------------------------------------------------- blocks of rows


@dataclass(frozen=True)
class Base:
    """Where a block contraction's operand starts in ``tensor``: ``offset`` elements plus
    ``stride * (var - lo)`` for each variable of the loops around it (the blocked variable at
    the block's first row)."""

    tensor: str
    offset: int
    strides: tuple[tuple[str, int], ...]


def block_contraction(con: Contraction, stmt: ast.Stmt, ranges, fixed: tuple[str, ...], block_var: str,
                      rows: int, buffers: Mapping[str, str], program,
                      columns: Optional[tuple[str, int, int]] = None
                      ) -> Optional[tuple[Contraction, tuple[Base, Base, Base]]]:
    """``con`` restricted to one block of ``rows`` rows of ``block_var`` (an M variable) inside
    loops over ``fixed`` (the batch and other M variables): those variables leave the roles and
    move into the operands' bases, so the same micro-kernel runs on each block. A tensor in
    ``buffers`` lives in the named per-thread block buffer, one row (its dimensions not indexed
    by ``fixed``) per value of ``block_var``. ``columns`` (variable, count, width) restricts an
    N or K variable to a block of ``count`` values too (the operands' bases then also move
    along it; a block buffer's row holds ``width`` of them). None when the roles do not allow
    it, or when the contraction has guards (padding)."""
    fixed_set = set(fixed)
    if (con.guards or not {v for v in con.role_vars("batch")} <= fixed_set or block_var not in con.role_vars("m")
            or not set(con.role_vars("m")) <= fixed_set | {block_var}
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
    accesses = {node.tensor: node for node in stmt.rhs.walk() if isinstance(node, ast.Access)}
    accesses[stmt.target] = ast.Access(stmt.target, stmt.lhs)
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
                                       tuple((v, s) for v, s in acc.strides if v not in fixed_set))
            bases.append(Base(acc.tensor, acc.offset,
                              tuple((v, s) for v, s in acc.strides if v in fixed_set or v in moving)))
    groups = {}
    for role, primary, members in (("m", "c", "ac"), ("n", "c", "bc"), ("k", "a", "ab")):
        vars_ = sorted((v for v in con.role_vars(role) if v not in fixed_set),
                       key=lambda v: -abs(accs[primary].stride(v)))
        groups[role] = _merge(vars_, extents, accs, members, ())
    return (Contraction(con.stmt, con.dtype, accs["a"], accs["b"], accs["c"], (), groups["m"], groups["n"],
                        groups["k"], con.alpha, con.alpha_tensors, con.init), tuple(bases))
