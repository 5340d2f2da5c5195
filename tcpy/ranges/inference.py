"""Range inference of one def: TC's rule, and the decisions tcpy takes where TC is silent.

TC's rule (docs/source/inference.rst of Tensor Comprehensions): each index variable gets the
largest rectangular range ``[lo, hi)`` for which no access reads out of bounds. Ranges given by
``where i in lo:hi`` are fixed up front. The others are found in rounds: an access index
expression with exactly one unresolved variable bounds that variable *for all values* of the
variables resolved in earlier rounds; bounds found within one round are intersected. ``exists
T(...)`` constrains like an access and computes nothing. Integer division rounds toward
negative infinity.

Decisions where TC is silent:

* Inference counts every access, as TC does, even one inside a ternary branch (so the usual
  padded convolution ``cond ? I(n, c, h + kh - 1, ...) * W(m, c, kh, kw) : 0`` still gets ``kh``
  from ``W``). Preconditions, however, only ask an access to be in bounds where its branch is
  taken (``i > 0 ? I(i - 1) : 0`` never reads ``I(-1)``); conditions that read tensors are
  assumed true, which is the safe side.
* Sizes may be zero. A variable whose range is empty for the given sizes (no value keeps every
  access in bounds, or a variable its bound depends on has an empty range) runs zero times; an
  output dimension indexed by it has size 0. Reductions over an empty range leave the identity
  (matmul with ``K = 0`` gives zeros of shape ``(M, N)``).
* An output dimension spans ``0 .. hi`` of its index variable's range. When ``lo > 0`` the
  elements below ``lo`` are written by no statement and stay zero (outputs are zero-filled).
  ``lo < 0`` is an error: at inference time when it holds for all sizes, else a
  precondition checked when sizes are bound.
* A statement writing a tensor whose shape is already known (a typed return, or a tensor an
  earlier statement defined) constrains its left-hand side like a read: it cannot write outside.
* Accesses whose index is not quasi-affine or reads a tensor (``B(C(i))``) bound nothing; they
  are listed in ``StmtRanges.runtime_checked`` for the code generator to check at run time.
* Every affine access that isl cannot prove in bounds for all sizes becomes a
  :class:`Precondition`: an isl set of sizes for which it would read out of bounds, checked by
  :meth:`DefRanges.bind`. This includes accesses on ``where`` variables and holes inside a
  range (``B(i % 4)`` with ``i`` fixed elsewhere). An access out of bounds for every size with a
  non-empty domain is an error at inference time.
* A variable bounded on one side only keeps that bound and waits for the other side from a
  later round (TC would give up); with no progress in a round, inference stops with an error
  that names the variable and shows the ``where`` clause to add.
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import islpy as isl
import sympy

from ..errors import TCPreconditionError, TCRangeError, TCShapeError, TCWarning
from ..lang import ast
from ..lang.visit import index_value_uses, index_vars, inline_lets
from .affine import NotAffine
from .convert import Converter, guarded_accesses
from .index_values import check_index_results, magnitude, unchecked_magnitude
from .isl_helpers import CTX, PARAM, affine_evaluator, keep_dim, param_space, simplest, try_bound, value_at
from .report import violation_message
from .symbolic import format_expr, pw_to_sympy, requires_text


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class VarRange:
    """``lo <= var < hi``; ``lo``/``hi`` are sympy expressions of the size variables.

    ``lo_isl``/``hi_isl`` are the exact isl bounds (parameter space = size variables); where
    they are undefined (NaN) the range is empty. ``origin`` says what fixed the range.
    """

    var: str
    lo: sympy.Expr
    hi: sympy.Expr
    kind: str  # "output" or "reduction"
    origin: str = ""
    lo_isl: Optional[isl.PwAff] = field(default=None, compare=False, repr=False)
    hi_isl: Optional[isl.PwAff] = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{format_expr(self.lo)} <= {self.var} < {format_expr(self.hi)}"


@dataclass(frozen=True, slots=True)
class StmtRanges:
    """Ranges of one statement (``stmt`` has its lets inlined).

    ``domain`` is the iteration domain: an isl set with the size variables as parameters and
    ``stmt.index_vars`` as dimensions. ``defines`` is True when this statement gives its target
    its shape. ``runtime_checked`` lists accesses whose bounds only a run-time check can ensure.
    ``index_uses``: its distinct index values (:func:`~tcpy.lang.visit.index_value_uses`),
    which each call's sizes must keep in range.
    """

    stmt: ast.Stmt
    ranges: dict
    domain: isl.Set = field(compare=False, repr=False)
    defines: bool = False
    runtime_checked: tuple = ()
    index_uses: tuple = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Precondition:
    """Sizes for which an access (or an output index) would be out of bounds.

    ``violated`` is an isl parameter set over the size variables; ``text`` is the source of
    the access, ``requires`` the condition the sizes must satisfy, in words for people.
    """

    text: str
    span: ast.Span
    stmt_index: int
    kind: str  # "access" or "output"
    requires: str
    violated: isl.Set = field(compare=False, repr=False)
    detail: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class BoundRanges:
    """Ranges and shapes for concrete sizes: ``statements[k][var] == (lo, hi)``."""

    sizes: dict
    statements: tuple
    shapes: dict


@dataclass(frozen=True, slots=True)
class DefRanges:
    """Result of :func:`infer` for one def."""

    def_: ast.Def
    size_vars: tuple
    statements: tuple
    shapes: dict  # tensor name -> tuple of sympy expressions (outputs and temporaries)
    preconditions: tuple
    shapes_isl: dict = field(default_factory=dict, compare=False, repr=False)
    # what binding sizes reads, built at its first use (see _distinct_bounds, size_point)
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def bind(self, sizes: dict) -> BoundRanges:
        """Evaluate ranges and shapes for concrete ``sizes`` (every size variable, ints >= 0).

        Raises :class:`~tcpy.errors.TCPreconditionError` naming the access, its position and
        the sizes when some access would read out of bounds for these sizes, or naming the
        statement when an int32 index result would overflow.
        """
        point = None  # (isl's point of the sizes, only where isl evaluates something)
        if self.preconditions or self._isl_bounds():
            point = self.size_point(sizes)
            broken = self.violated(point)
            if broken:
                raise TCPreconditionError(violation_message(self, broken[0], sizes, point))
        else:
            self._check_sizes(sizes)
        bound = self.evaluate(sizes, point)
        safe = self.memo.get("unchecked magnitude")
        if safe is None:
            safe = self.memo.setdefault("unchecked magnitude", unchecked_magnitude(self.statements))
        if magnitude(sizes, bound.statements) > safe:
            check_index_results(self.def_, self.statements, bound.statements, sizes, bound.shapes)
        return bound

    def violated(self, point: isl.Point) -> list:
        """The preconditions these sizes (an isl point over the size variables) violate."""
        here = isl.Set.from_point(point)
        return [pre for pre in self.preconditions if not pre.violated.intersect(here).is_empty()]

    def evaluate(self, sizes: dict, point: Optional[isl.Point]) -> BoundRanges:
        """Ranges and shapes at ``point`` (``sizes`` as an isl point; None when every bound
        evaluates without isl, :meth:`_isl_bounds`), preconditions unchecked."""
        distinct, positions, affine, by_isl = self._distinct_bounds()
        values = affine(sizes)
        for position in by_isl:
            values[position] = value_at(distinct[position], point)
        at = iter(positions)
        statements = []
        for st in self.statements:
            bound = {}
            for var in st.ranges:
                lo, hi = values[next(at)], values[next(at)]
                bound[var] = (0, 0) if lo is None or hi is None or hi <= lo else (lo, hi)
            statements.append(bound)
        shapes = {name: tuple(values[next(at)] or 0 for _ in dims) for name, dims in self.shapes_isl.items()}
        return BoundRanges(dict(sizes), tuple(statements), shapes)

    def _distinct_bounds(self) -> tuple[list, list[int], Callable, tuple[int, ...]]:
        """Each bound of the ranges and shapes once (statements share most: ``0 <= b < B``),
        per bound in :meth:`evaluate`'s order its position among them, the function that
        evaluates them at a call's sizes and the positions of those isl evaluates instead
        (:func:`affine_evaluator`): a new call shape evaluates each once."""
        found = self.memo.get("bounds")
        if found is None:
            every = [pa for st in self.statements for vr in st.ranges.values() for pa in (vr.lo_isl, vr.hi_isl)]
            every += [pa for dims in self.shapes_isl.values() for pa in dims]
            index: dict = {}
            positions = [index.setdefault(None if pa is None else pa.to_str(), len(index)) for pa in every]
            distinct = [None] * len(index)
            for pa, position in zip(every, positions):
                distinct[position] = pa
            found = self.memo.setdefault("bounds", (distinct, positions, *affine_evaluator(distinct)))
        return found

    def _isl_bounds(self) -> bool:
        """Whether isl evaluates some bound (:func:`affine_evaluator` cannot)."""
        return bool(self._distinct_bounds()[3])

    def _check_sizes(self, sizes: dict) -> None:
        """Raise :class:`~tcpy.errors.TCShapeError` unless every size is given, an int >= 0."""
        missing = [s for s in self.size_vars if s not in sizes]
        if missing:
            raise TCShapeError(f"in def '{self.def_.name}': no value for size {', '.join(missing)}")
        for name in self.size_vars:
            value = sizes[name]
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
                raise TCShapeError(
                    f"in def '{self.def_.name}': size {name} must be an integer >= 0, got {value!r}"
                )

    def size_point(self, sizes: dict) -> isl.Point:
        """``sizes`` as an isl point over the size variables; each must be an int >= 0."""
        self._check_sizes(sizes)
        space = self.memo.get("space")
        if space is None:
            space = self.memo.setdefault("space", param_space(self.size_vars))
        point = isl.Point.zero(space)
        for pos, name in enumerate(self.size_vars):
            point = point.set_coordinate_val(PARAM, pos, int(sizes[name]))
        return point


def infer(def_: ast.Def, source: Optional[str] = None, filename: str = "<string>") -> DefRanges:
    """Infer the ranges of every statement of a checked def, its output shapes and preconditions.

    ``source`` (the program text) only makes errors show the offending line. Raises
    :class:`~tcpy.errors.TCRangeError` for a variable no access bounds, a range that depends on
    tensor values, inconsistent constraints, or an output index range that starts below zero.
    """
    return _DefInference(def_, source, filename).run()


# ----------------------------------------------------------------------------- inference


@dataclass(slots=True)
class _Bound:
    """One index position of one access: ``0 <= index < extent`` (wherever ``guard`` holds)."""

    access: ast.Access
    dim: int
    vars: frozenset
    index: Optional[isl.PwAff]  # None: not affine (see ``data``)
    extent: isl.PwAff
    guard: Optional[isl.Set]
    data: bool = False
    exists: bool = False


@dataclass(frozen=True, slots=True)
class _Found:
    """A bound on one side of a variable, from one access in one round; ``padding`` when a
    ``?:`` guard around the access keeps that side in bounds."""

    bound: isl.PwAff
    source: _Bound
    round: int
    padding: bool


def _intersect(lows, highs) -> tuple:
    """The range ``[lo, hi)`` the bounds ``lows`` and ``highs`` (:class:`_Found`) leave."""
    lo, hi = lows[0].bound, highs[0].bound
    for found in lows[1:]:
        lo = lo.max(found.bound)
    for found in highs[1:]:
        hi = hi.min(found.bound)
    return lo.coalesce(), hi.coalesce()


class _DefInference:
    """Infers one def, statement by statement; a statement may read the shapes earlier ones define."""

    def __init__(self, def_: ast.Def, source, filename):
        self.def_ = def_
        self.source = source
        self.filename = filename
        self.params = tuple(def_.size_vars)
        self.pspace = param_space(self.params)
        self.context = isl.Set.universe(self.pspace)
        for pos in range(len(self.params)):
            self.context = self.context.lower_bound_val(PARAM, pos, isl.Val.zero(CTX))
        self.extents: dict[str, tuple] = {}
        self.sym_shapes: dict[str, tuple] = {}
        pconv = Converter(self.params, (), self.extents)
        for p in def_.params + def_.returns:
            if p.type is not None:
                self.extents[p.name] = tuple(
                    pconv.const(d.value) if isinstance(d, ast.IntLit)
                    else pconv.affine(ast.SizeVar(d.name))
                    for d in p.type.dims
                )
        self.preconditions: list[Precondition] = []

    def error(self, message: str, span) -> TCRangeError:
        return TCRangeError(message, span, self.source, self.def_.name, self.filename)

    def run(self) -> DefRanges:
        stmts = []
        for index, stmt in enumerate(self.def_.stmts):
            stmts.append(self.statement(index, inline_lets(stmt)))
        outputs = [t.name for t in self.def_.tensors if t.role in ("output", "temporary")]
        shapes_isl = {name: self.extents[name] for name in outputs if name in self.extents}
        shapes = {name: self.sym_shapes.get(name) or tuple(pw_to_sympy(d) for d in dims)
                  for name, dims in shapes_isl.items()}
        return DefRanges(self.def_, self.params, tuple(stmts), shapes, tuple(self.preconditions), shapes_isl)

    # -- one statement

    def statement(self, index: int, stmt: ast.Stmt) -> StmtRanges:
        dims = stmt.index_vars
        conv = Converter(self.params, dims, self.extents)
        pconv = Converter(self.params, (), self.extents)
        defines = stmt.target not in self.extents

        found: list = []
        if not defines:  # writing a tensor of known shape: the left side cannot go outside it
            found.append((ast.Access(stmt.target, stmt.lhs, stmt.target_span), None))
        guarded_accesses(stmt.rhs, None, conv, found)
        exists_from = len(found)
        for clause in stmt.where:
            if isinstance(clause, ast.Exists):
                guarded_accesses(clause.expr, None, conv, found)
        bounds, runtime = self.bounds(conv, found, exists_from)

        resolved: dict[str, tuple] = {}  # var -> (lo, hi, origin) over the sizes
        for clause in stmt.where:
            if isinstance(clause, ast.RangeConstraint):
                try:
                    lo, hi = pconv.affine(clause.lo), pconv.affine(clause.hi)
                except NotAffine as exc:
                    raise self.error(
                        f"the range of '{clause.var}' must be given by affine size expressions, "
                        f"got '{exc.node}'", clause.span) from None
                origin = f"where {clause}"
                if clause.var in resolved:  # several ranges for one variable: intersect them
                    old = resolved[clause.var]
                    lo, hi, origin = lo.max(old[0]), hi.min(old[1]), f"{old[2]}, {clause}"
                resolved[clause.var] = (lo, hi, origin)
                self.check_nonempty(clause.var, lo, hi, clause.span)

        self.solve(stmt, conv, bounds, resolved)

        domain = conv.universe().intersect_params(self.context)
        ranges = {}
        for var in dims:
            lo, hi, origin = resolved[var]
            v = conv.var(var)
            domain = domain.intersect(conv.lift(lo).le_set(v)).intersect(v.lt_set(conv.lift(hi)))
            kind = "output" if var in stmt.output_vars else "reduction"
            ranges[var] = VarRange(var, pw_to_sympy(lo), pw_to_sympy(hi), kind,
                                   origin, lo, hi)
        domain = domain.coalesce()

        if defines:
            self.define_shape(index, stmt, ranges)
        self.access_preconditions(index, stmt, conv, domain, bounds, ranges)
        # (each distinct index value once: equal ones have equal bounds)
        uses = tuple(dict.fromkeys(index_value_uses(stmt.rhs)))
        return StmtRanges(stmt, ranges, domain, defines, tuple(runtime), uses)

    def bounds(self, conv, found, exists_from):
        bounds, runtime = [], []
        for k, (access, guard) in enumerate(found):
            extents = self.extents.get(access.tensor)
            if extents is None or len(extents) != len(access.indices):
                continue  # sema reports unknown tensors and wrong ranks
            checked = True
            for d, e in enumerate(access.indices):
                try:
                    index, data = conv.affine(e), False
                except NotAffine as exc:
                    index, data, checked = None, exc.data, False
                bounds.append(_Bound(access, d, index_vars(e), index, conv.lift(extents[d]),
                                     guard, data, k >= exists_from))
            if not checked and not bounds[-1].exists:
                runtime.append(access)
        return bounds, runtime

    def check_nonempty(self, var, lo, hi, span):
        if lo.lt_set(hi).intersect(self.context).is_empty():
            raise self.error(
                f"inconsistent constraints on '{var}': {format_expr(pw_to_sympy(lo))} <= {var} < "
                f"{format_expr(pw_to_sympy(hi))} is empty for all sizes", span)

    def solve(self, stmt, conv, bounds, resolved):
        """TC's rounds: bound each variable from accesses where it is the only unresolved one."""
        unresolved = [v for v in conv.dims if v not in resolved]
        pending = [b for b in bounds if b.index is not None]
        lows: dict = {v: [] for v in unresolved}
        highs: dict = {v: [] for v in unresolved}
        round_no = 0
        while unresolved:
            round_no += 1
            usable = [b for b in pending if len(b.vars & set(unresolved)) == 1]
            for b in usable:
                pending.remove(b)
                (v,) = b.vars & set(unresolved)
                pos = conv.dims.index(v)
                box = conv.universe()  # guards are ignored here, as in TC
                ctx = self.context
                for r in b.vars - {v}:
                    lo, hi, _ = resolved[r]
                    rv = conv.var(r)
                    box = box.intersect(conv.lift(lo).le_set(rv)).intersect(rv.lt_set(conv.lift(hi)))
                    ctx = ctx.intersect(lo.lt_set(hi))
                zero = conv.const(0)
                for ok in (b.index.ge_set(zero), b.index.lt_set(b.extent)):
                    bad = keep_dim(box.subtract(ok), pos)
                    good = isl.Set.universe(bad.get_space()).subtract(bad).intersect_params(ctx)
                    lo, hi = try_bound(good, "min"), try_bound(good, "max")
                    # TC's rule counts this side even when a ?: guard keeps it in bounds (padding)
                    padding = b.guard is not None and b.guard.intersect_params(self.context).is_subset(ok)
                    if lo is not None:
                        lows[v].append(_Found(lo, b, round_no, padding))
                    if hi is not None:
                        highs[v].append(_Found(hi.add_constant_val(isl.Val.one(CTX)), b, round_no, padding))
            newly = [v for v in unresolved if lows[v] and highs[v]]
            for v in newly:
                self.resolve(stmt, v, lows[v], highs[v], resolved)
            if not newly:
                self.unbounded(stmt, unresolved, lows, highs, bounds, pending)
            unresolved = [v for v in unresolved if v not in newly]
        return resolved

    def resolve(self, stmt, v, lows, highs, resolved):
        lo, hi = _intersect(lows, highs)
        self.check_nonempty(v, lo, hi, stmt.span)
        # Values inside [lo, hi) that some access rejects (holes, e.g. from `%`) are not
        # checked here: the preconditions computed over the whole domain report them.
        names = []
        for found in lows + highs:
            if str(found.source.access) not in names:
                names.append(str(found.source.access))
        origin = f"{', '.join(names)} (round {max(found.round for found in lows + highs)})"
        resolved[v] = (lo, hi, origin)
        self.warn_padding_narrows(stmt, v, lo, hi, lows, highs)

    def warn_padding_narrows(self, stmt, v, lo, hi, lows, highs):
        """TC's rule lets a read that a ``?:`` guard keeps in bounds (padding) bound ``v`` like
        any other: a padded convolution without ``where kh in 0:KH`` computes one tap. Say so
        when such reads make ``v``'s range narrower than the other accesses allow."""
        free_lows = [f for f in lows if not f.padding]
        free_highs = [f for f in highs if not f.padding]
        if not free_lows or not free_highs or len(free_lows) + len(free_highs) == len(lows) + len(highs):
            return
        wide_lo, wide_hi = _intersect(free_lows, free_highs)
        runs = wide_lo.lt_set(wide_hi).intersect(self.context)
        if lo.gt_set(wide_lo).union(hi.lt_set(wide_hi)).intersect(runs).is_empty():
            return
        reads = []
        for found in lows + highs:
            if found.padding and str(found.source.access) not in reads:
                reads.append(str(found.source.access))
        narrow = f"{format_expr(pw_to_sympy(lo))} <= {v} < {format_expr(pw_to_sympy(hi))}"
        wide_lo, wide_hi = format_expr(pw_to_sympy(wide_lo)), format_expr(pw_to_sympy(wide_hi))
        warnings.warn(
            f"line {stmt.span.line}: in def '{self.def_.name}': index variable '{v}' gets the range {narrow} "
            f"from {', '.join(reads)}, a read its ?: guard keeps in bounds (TC's range rule counts it "
            f"anyway), while the other accesses allow {wide_lo} <= {v} < {wide_hi}; if the guard is "
            f"padding, give the range: `where {v} in {wide_lo}:{wide_hi}`", TCWarning, stacklevel=2)

    def unbounded(self, stmt, unresolved, lows, highs, bounds, pending):
        v = unresolved[0]
        mine = [b for b in bounds if v in b.vars]
        for b in mine:
            if b.index is None and b.data:
                raise self.error(
                    f"the range of '{v}' depends on tensor values (in {b.access}); give it with a where "
                    f"clause, e.g. `where {v} in 0:{self.hint(v, bounds)}`", b.access.span)
        hint = f"`where {v} in 0:{self.hint(v, bounds)}`"
        if lows[v] and not highs[v]:
            what = f"index variable '{v}' has no upper bound"
        elif highs[v] and not lows[v]:
            what = f"index variable '{v}' has no lower bound"
        else:
            what = f"cannot infer the range of index variable '{v}'"
            waiting = [b for b in mine if b in pending]
            used = [b for b in mine if b.index is not None and b not in pending]
            nonaffine = [b for b in mine if b.index is None]
            if waiting:
                what += f" (it only appears together with other unresolved variables, in {waiting[0].access})"
            elif used:
                what += f" ({used[0].access} stays in bounds for arbitrarily large or small '{v}')"
            elif nonaffine:
                what += (f" (the index {nonaffine[0].access.indices[nonaffine[0].dim]} in {nonaffine[0].access} "
                         f"is not affine)")
            else:
                what += " (no tensor access bounds it)"
        raise self.error(f"{what}; add a range with a where clause, e.g. {hint}", stmt.span)

    def hint(self, v, bounds) -> str:
        # The extent of a dimension that v indexes alone, else of any dimension it appears in.
        for alone in (True, False):
            for b in bounds:
                used = index_vars(b.access.indices[b.dim])
                if (used == {v}) if alone else (v in used):
                    extent = self.def_extent_text(b.access.tensor, b.dim)
                    if extent:
                        return extent
        return "<hi>"

    def def_extent_text(self, tensor, dim) -> Optional[str]:
        for p in self.def_.params + self.def_.returns:
            if p.name == tensor and p.type is not None:
                return str(p.type.dims[dim])
        return f"{tensor}.{dim}" if tensor in self.extents else None

    # -- shapes and preconditions

    def define_shape(self, index, stmt, ranges):
        dims, sym = [], []
        zero = isl.PwAff.zero_on_domain(isl.LocalSpace.from_space(self.pspace))
        for e in stmt.lhs:
            vr = ranges[e.name]
            nonempty = vr.lo_isl.lt_set(vr.hi_isl).intersect(self.context)
            size = simplest(vr.hi_isl.intersect_domain(nonempty).union_add(
                zero.intersect_domain(self.context.subtract(nonempty))))
            dims.append(size)
            sym.append(vr.hi)
            negative = vr.lo_isl.lt_set(zero).intersect(nonempty)
            if negative.is_empty():
                continue
            text = f"{stmt.target}({', '.join(map(str, stmt.lhs))})"
            if nonempty.is_subset(negative):
                raise self.error(
                    f"output index '{e.name}' of {stmt.target} ranges over {vr}, which starts below 0; "
                    f"output indices start at 0: restrict it, e.g. `where {e.name} in 0:{format_expr(vr.hi)}`",
                    stmt.span)
            self.preconditions.append(Precondition(
                text, stmt.span, index, "output", requires_text(nonempty.subtract(negative).gist(nonempty)),
                negative.coalesce(), vr))
        self.extents[stmt.target] = tuple(dims)
        self.sym_shapes[stmt.target] = tuple(sym)

    def access_preconditions(self, index, stmt, conv, domain, bounds, ranges):
        by_access: dict = {}  # id(access) -> (bound, sizes where out of bounds, domain where read)
        zero = conv.const(0)
        for b in bounds:
            if b.index is None or b.exists:
                continue
            ok = b.index.ge_set(zero).intersect(b.index.lt_set(b.extent))
            where = domain if b.guard is None else domain.intersect(b.guard)
            bad = where.subtract(ok).params().intersect(self.context)
            if bad.is_empty():
                continue
            prev = by_access.get(id(b.access))
            by_access[id(b.access)] = (b, bad if prev is None else prev[1].union(bad), where)
        runs = domain.params().intersect(self.context)
        for b, bad, where in by_access.values():
            bad = bad.coalesce()
            if runs.is_subset(bad):
                used = [v for v in conv.dims if v in index_vars(b.access)]
                given = ", ".join(f"{format_expr(ranges[v].lo)} <= {v} < {format_expr(ranges[v].hi)}" for v in used)
                shape = ast.tuple_text(self.def_extent_text(b.access.tensor, d) or "?"
                                    for d in range(len(b.access.indices)))
                raise self.error(
                    f"{b.access} reads out of bounds of {b.access.tensor} (shape {shape}) for all sizes "
                    f"when {given}", b.access.span)
            indices = tuple((c.dim, c.index) for c in bounds if c.access is b.access and c.index is not None)
            self.preconditions.append(Precondition(
                str(b.access), b.access.span, index, "access",
                requires_text(runs.subtract(bad).gist(runs)), bad, (b.access, where, indices)))
