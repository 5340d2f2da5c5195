"""Reverse mode on a checked def: the backward def, as TC source.

Statements are visited last to first. Each statement ``T(o) op rhs`` hands the cotangent of its
target, ``dT(o)``, to the tensor reads of ``rhs`` (:func:`~.derivatives.partials`); each read
``X(e)`` then becomes one statement accumulating into ``dX``, a comprehension over the forward
statement's own index variables, pinned to their forward ranges by ``where`` clauses:

* an index that is a loop variable is kept: ``dA(m, k) +=! dC(m, n) * B(k, n)`` (gather form;
  GEMM's backward is two GEMMs, conv's weight gradient a contraction);
* an affine index with a unit coefficient on some variable ``v`` gets a new variable ``x``
  and ``v`` is solved for (``v = x - rest``), guarded by ``v``'s forward range: a convolution's
  input gradient becomes a transposed convolution;
* an index ``s*x + y + a`` (``s > 1``, ``x`` an output and ``y`` a reduction variable: a
  strided window) is split by phase: one gather per residue of the input index modulo ``s``,
  over the taps of that residue, then one statement interleaving the phases (a strided
  convolution's input gradient is ``s*s`` transposed convolutions of stride 1);
* any other index (data-dependent, ``2*i``, ``i + j`` with both used) gets a new variable
  ``x`` over the whole dimension and a mask ``index == x``: the scatter of a gather, as a sum.

``max=!``/``min=!`` send the cotangent to the first arg-max/min in the reduction order (as
PyTorch), found by a ``min=!`` over the linear position of the reduction variables among the
points equal to the forward value (except a softmax's row maximum, which the normalised
quotient does not depend on: :meth:`_Reverse.normalising_shift`); ``*=!`` gives each factor the
product of the others. Forward tensors the backward reads are recomputed by their
forward statements inside the backward def (``value_and_grad`` returns them as outputs
instead of computing them twice); the statements are ordered so that the fusion pass can group
them (:func:`_fusable_order`), and it then runs on the backward like on any def.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import sympy

from ..errors import TCArgumentError, TCSemanticError
from ..lang import ast, parse
from ..lang.builtins import BUILTINS, MIN_MAX
from ..lang.visit import accesses, index_vars, inline_lets, map_expr
from ..lang.writer import fresh_name
from ..ranges import DefRanges, format_expr
from .derivatives import NotDifferentiable, add, conj, depends, div, mul, neg, partials, ternary, ZERO

__all__ = ["backward_source", "default_wrt"]

# A strided read's cotangent is split into at most this many phases (one statement each, to
# compile and run); a larger stride (a 7x7 pooling window moved by 7) keeps the masked sum.
MAX_PHASES = 16


def default_wrt(def_: ast.Def) -> tuple[str, ...]:
    """Every floating-point input, in signature order."""
    return tuple(p.name for p in def_.params if def_.tensor(p.name).scalar.is_float)


def backward_source(def_: ast.Def, def_ranges: DefRanges, source: str, wrt: tuple[str, ...],
                    *, with_values: bool = False) -> str:
    """The TC source of the backward def of ``def_`` (checked, with its inferred ranges).

    Its parameters are the forward's plus one cotangent per floating-point output (``dC`` for
    ``C``, same shape); its outputs are the cotangents of ``wrt`` (``dA`` for ``A``), preceded
    by the forward outputs when ``with_values``. Raises :class:`~tcpy.TCArgumentError` for a
    ``wrt`` that is not a floating-point input and :class:`~tcpy.TCSemanticError`, naming the
    statement, for what has no derivative.
    """
    return _Reverse(def_, def_ranges, source, wrt, with_values).source()


@dataclass(frozen=True)
class _Contribution:
    """A cotangent ``term`` for the read ``access`` of forward statement ``index``."""

    index: int
    access: ast.Access
    term: ast.Expr
    outside: tuple[str, ...] = ()  # reduction variables the term is not summed over


def _is_atom(text: str) -> bool:
    return text.replace("_", "").replace(".", "").isalnum()


def _atom(text: str) -> ast.Expr:
    """Size-expression text as an expression node (printed as is, parenthesised)."""
    return ast.Name(text if _is_atom(text) else f"({text})")


def _scaled(scale: int, text: str) -> str:
    """``scale * text`` as size-expression text."""
    if text == "0":
        return text
    return f"{scale} * {text}" if _is_atom(text) else f"{scale} * ({text})"


class _Reverse:
    """One backward def in the making: the reverse walk's state and the text it emits."""

    def __init__(self, def_: ast.Def, def_ranges: DefRanges, source: str, wrt, with_values: bool):
        self.def_ = def_
        self.ranges = def_ranges
        self.src = source
        self.with_values = with_values
        self.stmts = tuple(inline_lets(s) for s in def_.stmts)
        self.params = {p.name: p for p in def_.params}
        self.returns = {r.name: r for r in def_.returns}
        self.taken = set(BUILTINS) | set(MIN_MAX) | set(def_.size_vars) | {t.name for t in def_.tensors}
        for s in self.stmts:
            self.taken.update(s.index_vars)
        self.wrt = self.check_wrt(wrt)
        self.writers: dict[str, list[int]] = {}
        for k, s in enumerate(self.stmts):
            self.writers.setdefault(s.target, []).append(k)
        self.check_writes()
        self.active = self.active_tensors()
        self.adjoint: dict[str, str] = {}   # tensor -> name of its cotangent in the backward
        self.written: set[str] = set()      # cotangents that have a statement yet
        self.cotangents: dict[str, str] = {}  # float output -> cotangent parameter
        self.lines: list[str] = []          # backward statements, in order
        self.needed: set[str] = set()       # forward tensors the backward reads
        self.replaced: dict[int, list[str]] = {}  # forward statements computed otherwise
        self.outside: dict[int, tuple[str, ...]] = {}  # id(read) -> reduction variables it is outside
        self.whole: list[str] = []          # index variables of statements over whole tensors
        self.scaled: dict[str, ast.Access] = {}  # scaled operand text -> the temporary holding it

    # -- checks

    def error(self, message: str, span) -> TCSemanticError:
        return TCSemanticError(message, span, self.src, self.def_.name)

    def check_wrt(self, wrt) -> tuple[str, ...]:
        names = []
        for name in wrt:
            if name not in self.params:
                raise TCArgumentError(
                    f"wrt names an input of def '{self.def_.name}': got {name!r}, its inputs are "
                    f"{', '.join(self.params) or 'none'}")
            scalar = self.def_.tensor(name).scalar
            if not scalar.is_float:
                raise TCArgumentError(
                    f"input '{name}' of def '{self.def_.name}' is {scalar}: only floating-point "
                    "inputs have gradients")
            if name in names:
                raise TCArgumentError(f"wrt names input '{name}' twice")
            names.append(name)
        if not names:
            raise TCArgumentError(f"wrt names no input of def '{self.def_.name}' to differentiate")
        return tuple(names)

    def check_writes(self) -> None:
        """A tensor written twice must be accumulated (``+=``) after its first write, and read
        only after its last: then every read sees the final value, whose cotangent is one."""
        for tensor, ks in self.writers.items():
            for k in ks[1:]:
                s = self.stmts[k]
                if s.reduction != "+" or s.init:
                    raise self.error(
                        f"cannot differentiate '{s}': '{tensor}' is written again with '{s.op}' after "
                        f"line {self.stmts[ks[0]].span.line}; only '+=' may add to a written tensor", s.span)
            for k, s in enumerate(self.stmts):
                reads = {a.tensor for a in s.rhs.walk() if isinstance(a, ast.Access)}
                if tensor in reads and ks[0] < k < ks[-1]:
                    raise self.error(
                        f"cannot differentiate '{s}': it reads '{tensor}' between two of its writes "
                        f"(lines {self.stmts[ks[0]].span.line} and {self.stmts[ks[-1]].span.line})", s.span)

    def active_tensors(self) -> set[str]:
        """The tensors whose values depend on ``wrt``; an integer output among them is an error.
        A softmax's shift (:meth:`normalising_shift`) is not among them: nothing depends on it."""
        active = set(self.wrt)
        for k, s in enumerate(self.stmts):
            if self.normalising_shift(k):
                continue
            if depends(s.rhs, self.is_active_with(active)):
                info = self.def_.tensor(s.target)
                if info.scalar.is_float:
                    active.add(s.target)
                elif info.role == "output":
                    raise self.error(
                        f"cannot differentiate '{s}': output '{s.target}' is {info.scalar} and depends on "
                        f"{', '.join(self.wrt)}; integer values have no derivative", s.span)
        return active

    def normalising_shift(self, k: int) -> bool:
        """Whether statement ``k`` is ``M(r) max=! X(r, c)`` (or ``min=!``) read only by ``E(r, c)
        = exp(u)``, ``u`` one of ``X - M``, ``a * (X - M)``, ``(X - M) * a``, ``(X - M) / a``
        with ``a`` free of ``c``, whose ``E`` is read only by ``S(r) +=! E(r, c)`` and ``P(r, c)
        = E(r, c) / S(r)``, ``S`` only by ``P``, all temporaries written once (the same
        variable names throughout). Then ``P`` is the same for any value of ``M`` (``exp(-a M)``
        cancels), so ``M`` passes no cotangent on: its derivative terms (a sum over the row and
        the arg-max's mask) would add up to rounding noise."""
        s = self.stmts[k]
        temporaries = {t.name for t in self.def_.temporaries}

        def names(indices):
            return [getattr(e, "name", None) for e in indices]

        def readers(tensor):
            return [j for j, t in enumerate(self.stmts)
                    if any(isinstance(a, ast.Access) and a.tensor == tensor for a in t.rhs.walk())]

        def once(tensor):
            return tensor in temporaries and len(self.writers.get(tensor, ())) == 1

        if (s.reduction not in ("max", "min") or not s.init or s.where or not once(s.target)
                or not isinstance(s.rhs, ast.Access) or None in names(s.rhs.indices)):
            return False
        rows, point = names(s.lhs), names(s.rhs.indices)
        shifted = readers(s.target)
        if len(shifted) != 1 or None in rows:
            return False
        e = self.stmts[shifted[0]]
        if (e.reduction is not None or e.where or not once(e.target) or sorted(names(e.lhs)) != sorted(point)
                or not isinstance(e.rhs, ast.Call) or e.rhs.func != "exp"):
            return False

        def same(node, tensor, want):
            return isinstance(node, ast.Access) and node.tensor == tensor and names(node.indices) == want

        def difference(node):
            return (isinstance(node, ast.Binary) and node.op == "-" and same(node.lhs, s.rhs.tensor, point)
                    and same(node.rhs, s.target, rows))

        u = e.rhs.args[0]
        if not difference(u):
            if not isinstance(u, ast.Binary) or u.op not in ("*", "/"):
                return False
            factor = u.rhs if difference(u.lhs) else u.lhs if u.op == "*" and difference(u.rhs) else None
            if factor is None or index_vars(factor) & set(s.reduction_vars) or any(
                    isinstance(a, ast.Access) and a.tensor in (s.target, e.target) for a in factor.walk()):
                return False
        users = readers(e.target)
        if len(users) != 2:
            return False
        total, quotient = (self.stmts[j] for j in users)
        if not (total.reduction == "+" and total.init and not total.where and once(total.target)
                and names(total.lhs) == rows and same(total.rhs, e.target, point)
                and quotient.reduction is None and not quotient.where and once(quotient.target)
                and isinstance(quotient.rhs, ast.Binary) and quotient.rhs.op == "/"
                and same(quotient.rhs.lhs, e.target, point) and same(quotient.rhs.rhs, total.target, rows)):
            return False
        return readers(total.target) == [users[1]]

    @staticmethod
    def is_active_with(active: set[str]):
        return lambda a: a.tensor in active and a.type is not None and a.type.is_float

    # -- names and texts

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def dim_text(self, tensor: str, d: int) -> str:
        if tensor in self.params:
            return str(self.params[tensor].type.dims[d])
        return self.size_text(self.ranges.shapes[tensor][d], f"dimension {d} of '{tensor}'")

    def size_text(self, expr, what: str) -> str:
        if isinstance(expr, sympy.Piecewise):
            raise self.error(f"cannot differentiate def '{self.def_.name}': {what} is piecewise ({expr})",
                             self.def_.name_span)
        return format_expr(expr)

    def range_texts(self, k: int) -> dict[str, tuple[str, str]]:
        return {v: (self.size_text(r.lo, f"the start of '{v}'"), self.size_text(r.hi, f"the end of '{v}'"))
                for v, r in self.ranges.statements[k].ranges.items()}

    # -- the walk

    def source(self) -> str:
        for name in self.wrt:
            self.adjoint[name] = self.fresh("d" + name)
        for r in self.def_.returns:
            if self.def_.tensor(r.name).scalar.is_float:
                self.cotangents[r.name] = self.adjoint[r.name] = self.fresh("d" + r.name)
        for k in reversed(range(len(self.stmts))):
            self.statement(k)
        return self.assemble()

    def statement(self, k: int) -> None:
        s = self.stmts[k]
        if s.target not in self.active or s.target not in self.adjoint:
            return
        seed: ast.Expr = ast.Access(self.adjoint[s.target], tuple(ast.IndexVar(v) for v in s.output_vars))
        extremum = s.reduction in ("max", "min")
        if extremum and s.init and s.reduction_vars:
            seed = ternary(self.first_extremum(k), seed, ZERO)
        elif s.reduction == "*" and s.init and s.reduction_vars:
            seed = mul(seed, self.product_cofactor(k))
        elif s.reduction in ("max", "min", "*") and not s.init:
            raise self.error(f"cannot differentiate '{s}': '{s.op}' into earlier values has no derivative "
                             f"in tcpy (write '{s.op}!')", s.span)
        active = self.is_active_with(self.active)
        try:
            found = self.normalized_partials(k, seed) or partials(s.rhs, active, seed)
        except NotDifferentiable as exc:
            raise self.error(f"cannot differentiate '{s}': {exc.why}", exc.node.span or s.span) from None
        grouped: dict[tuple, _Contribution] = {}
        for access, term in found:
            # a read reached outside the sum (see normalized_partials) adds once per output point
            outside = self.outside.get(id(access), ())
            key = (access.tensor, str(access), outside)
            if key in grouped:
                term = add(grouped[key].term, term)
            grouped[key] = _Contribution(k, access, term, outside)
        for contribution in grouped.values():
            self.contribute(contribution)

    def normalized_partials(self, k: int, seed: ast.Expr) -> list:
        """``T(o) +=! N / D`` with ``D`` free of the reduction variables (attention's ``p * V /
        l``, a mean): ``D``'s cotangent is ``-dT(o) * T(o) / D``, once per output point, instead
        of a sum over the reduction of ``N / D / D`` (a contraction's worth of loop-nest work).
        The same for ``T(o) = N / D`` when the backward reads ``T`` anyway (softmax's ``P = E /
        Sm``, read by the gradient of ``P * V``): then ``N`` need not be kept for ``D``'s
        cotangent (a fused group's row buffer instead of a whole tensor). An empty list when the
        statement has another form."""
        s = self.stmts[k]
        rhs = s.rhs
        summed = s.reduction == "+" and s.init and s.reduction_vars
        kept = s.reduction is None and s.target in self.needed
        if not ((summed or kept) and len(self.writers[s.target]) == 1
                and isinstance(rhs, ast.Binary) and rhs.op == "/"
                and not index_vars(rhs.rhs) & set(s.reduction_vars)):
            return []
        active = self.is_active_with(self.active)
        if not depends(rhs.rhs, active):
            return []
        value = ast.Access(s.target, tuple(ast.IndexVar(v) for v in s.output_vars))
        self.needed.add(s.target)
        outer = partials(rhs.rhs, active, neg(mul(seed, div(value, rhs.rhs))))
        for access, _ in outer:
            self.outside[id(access)] = s.reduction_vars
        return partials(rhs.lhs, active, div(seed, rhs.rhs)) + outer

    def first_extremum(self, k: int) -> ast.Expr:
        """The mask of the first point (in reduction order) where ``rhs`` equals the forward
        max/min; emits the statement that finds that point's position."""
        s = self.stmts[k]
        ranges = self.range_texts(k)
        position, count = None, None
        for v in s.reduction_vars:
            lo, hi = ranges[v]
            extent = _atom(f"{hi} - {lo}") if lo != "0" else _atom(hi)
            offset = ast.IndexVar(v) if lo == "0" else ast.Binary("-", ast.IndexVar(v), _atom(lo))
            position = offset if position is None else ast.Binary("+", ast.Binary("*", position, extent), offset)
            count = extent if count is None else ast.Binary("*", count, extent)
        value = ast.Access(s.target, tuple(ast.IndexVar(v) for v in s.output_vars))
        compared = self.stored_values(k)
        equal = ast.Binary("==", compared, value)
        arg = self.fresh(f"{s.target}_first")
        lhs = f"{arg}({', '.join(s.output_vars)})" if s.output_vars else arg
        self.lines.append(f"{lhs} min=! {ternary(equal, position, count)}{self.where(ranges)}")
        return ast.Binary("&&", equal, ast.Binary("==", position, ast.Access(arg, value.indices)))

    def stored_values(self, k: int) -> ast.Expr:
        """The values a max/min/product reduces, as an expression the backward compares with
        zero or with the result: a computed value is stored once and read by the reduction and
        the backward (computed again, a vectorized exp may differ in the last bit)."""
        s = self.stmts[k]
        self.needed.add(s.target)
        self.needed.update(a.tensor for a in s.rhs.walk() if isinstance(a, ast.Access))
        if isinstance(s.rhs, ast.Access):
            return s.rhs
        ranges = self.range_texts(k)
        values = ast.Access(self.fresh(f"{s.target}_values"), tuple(ast.IndexVar(v) for v in s.index_vars))
        declared = self.def_.tensor(s.target).scalar
        reduced = values if declared is s.rhs.type else ast.Cast(declared, values)
        lhs = f"({', '.join(s.output_vars)})" if s.output_vars else ""
        self.replaced[k] = [f"{values} = {s.rhs}{self.where(ranges)}",
                            f"{s.target}{lhs} {s.op} {reduced}{self.where(ranges)}"]
        return values

    def product_cofactor(self, k: int) -> ast.Expr:
        """For ``T(o) *=! x``: the product of the other factors, as PyTorch's prod: ``T / x``
        without zeros, the product of the others at a single zero, zero with two zeros."""
        s = self.stmts[k]
        x = self.stored_values(k)
        ranges = self.range_texts(k)
        outputs = tuple(ast.IndexVar(v) for v in s.output_vars)
        lhs = f"({', '.join(s.output_vars)})" if s.output_vars else ""
        zero = ast.Binary("==", x, ZERO)
        zeros, nonzero = self.fresh(f"{s.target}_zeros"), self.fresh(f"{s.target}_nonzero")
        self.lines.append(f"{zeros}{lhs} +=! {ternary(zero, ast.IntLit(1), ZERO)}{self.where(ranges)}")
        self.lines.append(f"{nonzero}{lhs} *=! {ternary(zero, ast.Cast(s.rhs.type, ast.IntLit(1)), x)}{self.where(ranges)}")
        count, others = ast.Access(zeros, outputs), ast.Access(nonzero, outputs)
        single = ast.Binary("&&", ast.Binary("==", count, ast.IntLit(1)), zero)
        return ternary(ast.Binary("==", count, ZERO), div(others, x), ternary(single, others, ZERO))

    def where(self, ranges: dict[str, tuple[str, str]]) -> str:
        return (" where " + ", ".join(f"{v} in {lo}:{hi}" for v, (lo, hi) in ranges.items())) if ranges else ""

    def contribute(self, c: _Contribution) -> None:
        """One statement adding ``c.term`` into the cotangent of the tensor ``c.access`` reads
        (or, for a strided read, one per phase and one interleaving them: :meth:`by_phase`)."""
        s = self.stmts[c.index]
        tensor = c.access.tensor
        ranges = {v: r for v, r in self.range_texts(c.index).items() if v not in c.outside}
        dims = [self.dim_text(tensor, d) for d in range(len(c.access.indices))]
        if self.by_phase(c, ranges, dims):
            return
        lhs, term, all_ranges = self.gathered(s, c.access, c.term, ranges, dims)
        self.accumulate(tensor, lhs, term, all_ranges, s)

    def by_phase(self, c: _Contribution, ranges, dims: list[str]) -> bool:
        """For a read whose index along some dimensions is ``s*x + e*y + a`` (``s > 1`` a literal,
        ``x`` an output variable, ``y`` a reduction variable from 0 or absent, neither in another
        index, ``e >= 1`` a dilation): one gather-form statement per phase ``r`` (input
        positions ``s*p + r``) over the taps that reach it, ``y = (s/g)*t + q`` with ``e*q = r -
        a (mod s)`` (``g = gcd(e, s)``; none when ``g`` does not divide ``r - a``: that phase is
        zero), into a temporary indexed by ``p``, then
        one element-wise statement interleaving the phases into the cotangent. A strided
        convolution's input gradient is then a few transposed convolutions of stride 1, which
        the contraction engine runs, instead of one sum masked by ``% s``. False (nothing
        emitted) for any other read, or for more than :data:`MAX_PHASES` phases."""
        s = self.stmts[c.index]
        indices = c.access.indices
        strided: dict[int, tuple[int, str, Optional[str], int, int]] = {}  # d -> (s, x, y, a, e)
        for d, index in enumerate(indices):
            others = set().union(*(index_vars(e) for j, e in enumerate(indices) if j != d))
            if isinstance(index, ast.IndexVar):
                if ranges.get(index.name, ("0", dims[d])) != ("0", dims[d]):
                    return False  # the phase temporaries would not cover their dimension
                continue
            terms = _linear(index)
            if terms is None:
                continue
            scaled = [v for v, k in terms.items() if v is not None and k > 1 and v in s.output_vars]
            taps = [v for v, k in terms.items() if v is not None and k >= 1 and v in s.reduction_vars]
            if (len(scaled) != 1 or len(taps) > 1 or len(terms) != 1 + len(taps) + (None in terms)
                    or (set(scaled) | set(taps)) & others or scaled[0] not in ranges
                    or not self.guard_range(s, scaled[0], ranges)
                    or any(ranges.get(y, ("",))[0] != "0" for y in taps)):
                continue
            strided[d] = (terms[scaled[0]], scaled[0], taps[0] if taps else None, terms.get(None, 0),
                          terms[taps[0]] if taps else 1)
        if not strided or math.prod(stride for stride, *_ in strided.values()) > MAX_PHASES:
            return False
        tensor = c.access.tensor
        phase_dims = [f"({dims[d]} + {strided[d][0] - 1}) / {strided[d][0]}" if d in strided else dims[d]
                      for d in range(len(dims))]
        phases: dict[tuple[int, ...], Optional[str]] = {}  # None: no tap reaches it
        combos = [()]
        for d in strided:
            combos = [combo + (r,) for combo in combos for r in range(strided[d][0])]
        for combo in combos:
            subst: dict[str, ast.Expr] = {}
            phase_ranges = dict(ranges)
            phase_indices = list(indices)
            empty = False
            for (d, (stride, x, y, a, dilation)), r in zip(strided.items(), combo):
                # the taps y = period*t + q that reach phase r: dilation*q = r - a (mod s)
                common = math.gcd(dilation, stride)
                period = stride // common
                if (r - a) % common:
                    empty = True
                    break
                q = (r - a) // common * pow(dilation // common, -1, period) % period if period > 1 else 0
                if y is None:
                    if q:
                        empty = True
                        break
                    shifted: ast.Expr = ast.IndexVar(x)
                else:
                    t = self.fresh(f"{y}_{q}")
                    tap = ast.Binary("*", ast.IntLit(period), ast.IndexVar(t)) if period > 1 else ast.IndexVar(t)
                    subst[y] = ast.Binary("+", tap, ast.IntLit(q)) if q else tap
                    hi = ranges[y][1]
                    phase_ranges[t] = ("0", hi if period == 1 else f"({hi} + {period - 1 - q}) / {period}"
                                       if period - 1 - q else f"{hi} / {period}")
                    del phase_ranges[y]
                    step = dilation // common
                    shifted = ast.Binary("+", ast.IndexVar(x), ast.Binary("*", ast.IntLit(step), ast.IndexVar(t))
                                         if step > 1 else ast.IndexVar(t))
                # s*x + dilation*(period*t + q) + a = s*p + r: p = x + step*t + (dilation*q + a - r) / s
                phase_indices[d] = _canonical(ast.Binary("+", shifted, ast.IntLit((dilation * q + a - r) // stride)))
            if empty:
                phases[combo] = None
                continue
            name = self.fresh(f"{self.adjoint.get(tensor, 'd' + tensor)}_phase{''.join(map(str, combo))}")
            phase = ast.Access(name, tuple(phase_indices))
            lhs, term, all_ranges = self.gathered(s, phase, _substitute(c.term, subst), phase_ranges, phase_dims,
                                                  fresh=set(strided))
            term = map_expr(term, _canonical_comparison)  # a guard's 2 * (p - t) + 2 * t is 2 * p
            self.lines.append(f"{name}({', '.join(lhs)}) +=! {term}{self.where(all_ranges)}")
            phases[combo] = name
        # the cotangent: position i of a strided dimension is phase i % s, at i / s
        lhs = [self.fresh(f"{tensor.lower()}{d}") for d in range(len(dims))]
        steps = [(d, strided[d][0]) for d in strided]

        def interleave(level: int, combo: tuple[int, ...]) -> ast.Expr:
            if level == len(steps):
                if phases[combo] is None:
                    return ZERO
                return ast.Access(phases[combo], tuple(
                    ast.Binary("/", ast.IndexVar(v), ast.IntLit(strided[d][0])) if d in strided else ast.IndexVar(v)
                    for d, v in enumerate(lhs)))
            d, stride = steps[level]
            result = interleave(level + 1, combo + (stride - 1,))
            for r in reversed(range(stride - 1)):
                branch = interleave(level + 1, combo + (r,))
                if branch != result:  # (phases no tap reaches are all zero: no test between them)
                    test = ast.Binary("==", ast.Binary("%", ast.IndexVar(lhs[d]), ast.IntLit(stride)), ast.IntLit(r))
                    result = ternary(test, branch, result)
            return result

        self.accumulate(tensor, lhs, interleave(0, ()), {v: ("0", dims[d]) for d, v in enumerate(lhs)}, s)
        return True

    def gathered(self, s: ast.Stmt, access: ast.Access, term: ast.Expr, ranges, dims: list[str],
                 fresh: set[int] = frozenset()):
        """``term``, the cotangent of the read ``access`` of statement ``s``, as a gather: the
        index variables of the cotangent (of dimensions ``dims``), the term over them and the
        ranges of all its variables. Dimensions in ``fresh`` get a new variable over the whole
        dimension even when the index is a loop variable (whose range may be shorter)."""
        tensor = access.tensor
        candidates = list(s.output_vars) + list(s.reduction_vars)
        lhs: list[str] = []
        subst: dict[str, ast.Expr] = {}
        bounds: list[ast.Expr] = []   # affine: range inference sees which reads they guard
        checks: list[ast.Expr] = []   # divisibility and masks: tested inside the bounds
        new_ranges: dict[str, tuple[str, str]] = {}
        for d, index in enumerate(access.indices):
            index = _substitute(index, subst)
            if (isinstance(index, ast.IndexVar) and index.name in ranges and index.name not in lhs
                    and d not in fresh):
                lhs.append(index.name)
                continue
            x = self.fresh(f"{tensor.lower()}{d}")
            new_ranges[x] = ("0", dims[d])
            lhs.append(x)
            # solve for an output variable if one appears (it has the long range: a strided
            # window's input gradient then sums over the window, not over all outputs)
            solvable = [(v, _coefficient(index, v)) for v in candidates
                        if v in ranges and v not in lhs and v not in subst and self.guard_range(s, v, ranges)]
            solvable = sorted(((v, coef) for v, coef in solvable if coef),
                              key=lambda vc: (vc[0] not in s.output_vars, abs(vc[1]) != 1))
            if solvable:
                v, coef = solvable[0]
                rest = _substitute(index, {v: ZERO})
                offset = _canonical(ast.Binary("-", ast.IndexVar(x), rest) if coef > 0
                                    else ast.Binary("-", rest, ast.IndexVar(x)))
                scale = abs(coef)
                subst[v] = offset if scale == 1 else ast.Binary("/", offset, ast.IntLit(scale))
                lo, hi = self.guard_range(s, v, ranges)
                del ranges[v]
                if scale != 1:
                    checks.append(ast.Binary("==", ast.Binary("%", offset, ast.IntLit(scale)), ZERO))
                    lo, hi = _scaled(scale, lo), _scaled(scale, hi)
                bounds.append(ast.Binary("&&", ast.Binary(">=", offset, _atom(lo)), ast.Binary("<", offset, _atom(hi))))
            else:
                checks.append(ast.Binary("==", _canonical(index), ast.IndexVar(x)))
        read = ast.Access(tensor, tuple(ast.IndexVar(v) for v in lhs))
        term = map_expr(term, lambda n: read if n == access else None)
        inner = None
        for extra in checks:
            inner = conj(inner, extra)
        outer = None
        for extra in bounds:
            outer = conj(outer, extra)
        if inner is not None:
            term = ternary(inner, term, ZERO)
        if outer is not None:
            term = ternary(outer, term, ZERO)
        for _ in range(len(subst) + 1):  # a solution may use variables solved for later
            term = _substitute(term, subst)
        term = _flip_taps(term, {v: r for v, r in ranges.items() if v not in lhs}, set(new_ranges))
        self.needed.update(a.tensor for a in term.walk() if isinstance(a, ast.Access))
        all_ranges = {**ranges, **new_ranges}
        if set(all_ranges) - set(lhs):  # summed: make it a product of two reads if it nearly is
            term = self.two_reads(term, all_ranges)
        return lhs, term, all_ranges

    def two_reads(self, term: ast.Expr, ranges) -> ast.Expr:
        """``A * B * f`` (``f`` factors over ``A``'s variables, or constants) as ``S * B`` with
        ``S = A * f`` stored first: the contraction engine takes products of two reads only
        (``dO(t, e) / l(t) * V(s, e)``, attention's backward, is then a GEMM)."""
        sign, factors = _factors(term)
        reads = [f for f in factors if isinstance(f[0], ast.Access) and not f[1]]
        if len(reads) != 2 or len(factors) == 2:
            return term
        sides = []
        for read, _ in reads:
            names = [i.name for i in read.indices if isinstance(i, ast.IndexVar)]
            if len(names) != len(read.indices) or len(set(names)) != len(names):
                return term
            sides.append((read, set(names)))
        (_, va), (_, vb) = sides
        if va <= vb or vb <= va:
            return term  # a dot product along rows, not a contraction
        extra = [f for f in factors if all(f[0] is not read for read, _ in sides)]
        spans = set().union(*(index_vars(f[0]) for f in extra))

        def scale(read):
            for factor, divides in extra:
                read = div(read, factor) if divides else mul(read, factor)
            return read

        # scale a side the factors' variables belong to; of two, one already scaled, else an input
        fits = [(read, names) for read, names in sides if spans <= names]
        fits.sort(key=lambda side: (str(scale(side[0])) not in self.scaled, side[0].tensor not in self.params))
        if not fits:
            return term
        a, va = fits[0]
        b = sides[1][0] if a is sides[0][0] else sides[0][0]
        scaled = scale(a)
        key = str(scaled)
        if key not in self.scaled:
            name = self.fresh(f"{a.tensor}_scaled")
            self.scaled[key] = ast.Access(name, a.indices)
            self.lines.append(f"{self.scaled[key]} = {scaled}{self.where({v: ranges[v] for v in ranges if v in va})}")
        product = mul(self.scaled[key], b)
        return neg(product) if sign < 0 else product

    def guard_range(self, s: ast.Stmt, v: str, ranges) -> Optional[tuple[str, str]]:
        """``v``'s range as bounds a condition can test, or None: a bound with a division cannot
        be tested (C's `/` truncates in conditions, and range inference cannot read it), except
        an output variable's whole dimension, which is that of the target's cotangent."""
        lo, hi = ranges[v]
        if "/" not in lo + hi:
            return lo, hi
        if v in s.output_vars and lo == "0":
            d = s.output_vars.index(v)
            if hi == self.dim_text(s.target, d):
                return lo, f"{self.adjoint[s.target]}.{d}"
        return None

    def accumulate(self, tensor: str, lhs: list[str], term: ast.Expr, ranges, s: ast.Stmt) -> None:
        """Emit ``d<tensor>(lhs) += term``: the first contribution to a cotangent initialises
        it (``+=!`` when it covers the whole tensor, else after a statement writing zeros)."""
        info = self.def_.tensor(tensor)
        covers = all(ranges[v] == ("0", self.dim_text(tensor, d)) for d, v in enumerate(lhs))
        if tensor not in self.adjoint:
            self.adjoint[tensor] = self.fresh("d" + tensor)
        target = self.adjoint[tensor]
        if target not in self.written:
            if tensor in self.cotangents:
                # an output read by later statements: its cotangent is the caller's plus theirs
                total = self.fresh(f"{target}_total")
                self.lines.append(self.full(total, tensor, ast.Access(target, tuple(map(ast.IndexVar, self.full_vars(tensor))))))
                self.adjoint[tensor] = target = total
            elif tensor not in self.params and not covers:
                self.lines.append(self.full(target, tensor, ast.Cast(info.scalar, ZERO)))
            self.written.add(target)
            # (an output that is not covered is filled with zeros before the first statement)
            op = "+=!" if tensor in self.params or (covers and tensor not in self.cotangents) else "+="
        else:
            op = "+="
        if info.scalar is not s.rhs.type or self.def_.tensor(s.target).scalar is not info.scalar:
            term = ast.Cast(info.scalar, term)
        head = f"{target}({', '.join(lhs)})" if lhs else target
        self.lines.append(f"{head} {op} {term}{self.where(ranges)}")

    def full_vars(self, tensor: str) -> list[str]:
        """Index variables for a whole tensor (``i0, i1, ...``; names no tensor or size uses)."""
        while len(self.whole) < self.def_.tensor(tensor).rank:
            self.whole.append(self.fresh(f"i{len(self.whole)}"))
        return self.whole[:self.def_.tensor(tensor).rank]

    def full(self, target: str, tensor: str, value: ast.Expr) -> str:
        """``target(i0, ...) = value`` over the whole shape of ``tensor``."""
        names = self.full_vars(tensor)
        head = f"{target}({', '.join(names)})" if names else target
        return f"{head} = {value}{self.where({n: ('0', self.dim_text(tensor, d)) for d, n in enumerate(names)})}"

    # -- the def

    def forward_lines(self) -> list[str]:
        """The forward statements the backward reads the results of (all, with values)."""
        if self.with_values:
            return [line for k, s in enumerate(self.def_.stmts) for line in self.replaced.get(k, [str(s)])]
        needed = self.needed & set(self.writers)
        changed = True
        while changed:
            changed = False
            for t in list(needed):
                for k in self.writers[t]:
                    for a in self.stmts[k].rhs.walk():
                        if isinstance(a, ast.Access) and a.tensor in self.writers and a.tensor not in needed:
                            needed.add(a.tensor)
                            changed = True
        lines = []
        for k, s in enumerate(self.def_.stmts):
            if s.target not in needed:
                continue
            if k == self.writers[s.target][0] and s.reduction is not None and not s.init:
                raise self.error(f"cannot differentiate '{s}': the backward needs '{s.target}', which adds to "
                                 "the caller's out= array", s.span)
            declared = self.def_.tensor(s.target).scalar
            if declared is not s.rhs.type:  # an output's declared type: keep it as a temporary
                s = dataclasses.replace(s, rhs=ast.Cast(declared, s.rhs))
            lines.extend(self.replaced.get(k, [str(s)]))
        return lines

    def assemble(self) -> str:
        d = self.def_
        params = [str(p) for p in d.params]
        for output, name in self.cotangents.items():
            info = d.tensor(output)
            dims = self.output_dims(output)
            params.append(f"{info.scalar.tc_name}({', '.join(dims)}) {name}" if dims else f"{info.scalar.tc_name} {name}")
        returns = [str(r) for r in d.returns] if self.with_values else []
        for name in self.wrt:
            p = self.params[name]
            returns.append(f"{p.type} {self.adjoint[name]}")
        body = self.forward_lines() + self.lines
        for name in self.wrt:
            if self.adjoint[name] not in self.written:
                body.append(self.full(self.adjoint[name], name, ast.Cast(d.tensor(name).scalar, ZERO)))
        suffix = "value_and_grad" if self.with_values else "grad"
        head = f"def {d.name}_{suffix}({', '.join(params)}) -> ({', '.join(returns)}) {{\n"

        def text(lines):
            return head + "".join(f"    {line}\n" for line in lines) + "}\n"

        (checked,) = parse(text(body)).defs
        return text([body[k] for k in _fusable_order(checked.stmts)])

    def output_dims(self, output: str) -> list[str]:
        declared = self.returns[output].type
        if declared is not None:
            return [str(x) for x in declared.dims]
        dims = []
        for d, extent in enumerate(self.ranges.shapes[output]):
            if isinstance(extent, (sympy.Symbol, sympy.Integer)):
                dims.append(str(extent))
            else:  # not a size variable: the cotangent's own size, checked by its reads
                dims.append(self.fresh(f"{output}_{d}"))
        return dims


def _fusable_order(stmts) -> list[int]:
    """An order of ``stmts`` that keeps every dependence and lets the fusion pass group them:
    each statement as early as its inputs allow (its level: one more than the statements it
    depends on), then the statements whose result nothing reads (the cotangents returned),
    those reading the latest statements first. Attention's backward is then the two products
    of a block of query rows (scores, the probabilities' cotangent), the statements on those
    rows, then the products reading them (dQ, dK, dV): one chain, no score-sized tensor. In
    the reverse walk's order the products reading the probabilities came between the rows."""
    touched = [[(a.tensor, write) for a, write in accesses(s)] for s in stmts]
    before: list[list[int]] = []
    for j, mine in enumerate(touched):
        writes = {t for t, w in mine if w}
        reads = {t for t, w in mine if not w}
        before.append([i for i in range(j) if any(t in writes | reads if w else t in writes for t, w in touched[i])])
    level: list[int] = []
    for j in range(len(stmts)):
        level.append(1 + max((level[i] for i in before[j]), default=-1))
    read = {t for mine in touched for t, w in mine if not w}
    sinks = [j for j, s in enumerate(stmts) if s.target not in read]
    order = sorted((j for j in range(len(stmts)) if j not in sinks), key=lambda j: (level[j], j))
    waiting = list(sinks)
    while waiting:  # (a sink may add to another's target: it waits for it)
        ready = [j for j in waiting if not set(before[j]) & set(waiting)]
        chosen = max(ready, key=lambda j: (level[j], -j))
        order.append(chosen)
        waiting.remove(chosen)
    return order


def _substitute(expr: ast.Expr, subst: dict[str, ast.Expr]) -> ast.Expr:
    """``expr`` with index variables replaced, affine index expressions written canonically
    (``2*h + (i1 - 2*h)`` is ``i1``: the engines recognise plain variables)."""
    def replace(node):
        if isinstance(node, ast.IndexVar):
            return subst.get(node.name)
        if isinstance(node, ast.Access):
            return dataclasses.replace(node, indices=tuple(_canonical(i) for i in node.indices))
        return None
    return map_expr(expr, replace)


def _flip_taps(term: ast.Expr, summed: dict[str, tuple[str, str]], solved: set[str]) -> ast.Expr:
    """``term`` with each summed variable ``y`` over ``0:n`` that some read indexes as ``x - y``
    (``x`` a cotangent variable solved for: a transposed convolution's image index, ``i - kh +
    1``) run backwards (``y`` replaced by ``n - 1 - y``): the image is then read as ``x + y``,
    a forward convolution's window, and the reversed taps fall on the other operand (the
    weights, ``Wt(f, c, KH - 1 - kh, ...)``), so the engine's Winograd and direct-convolution
    forms take the input gradient as they take the forward. Only the order of the sum
    changes."""
    flips: dict[str, ast.Expr] = {}
    for read in term.walk():
        if not isinstance(read, ast.Access):
            continue
        for index in read.indices:
            terms = _linear(index) or {}
            if not any(terms.get(x) == 1 for x in solved):
                continue
            for y, coef in terms.items():
                if coef != -1 or y not in summed or y in flips:
                    continue
                lo, hi = summed[y]
                extent = ast.IntLit(int(hi)) if hi.isdigit() else ast.SizeVar(hi) if hi.isidentifier() else None
                if lo == "0" and extent is not None:
                    flips[y] = _canonical(ast.Binary("-", ast.Binary("-", extent, ast.IntLit(1)), ast.IndexVar(y)))
    if not flips:
        return term
    return map_expr(_substitute(term, flips), _canonical_comparison)


def _canonical_comparison(node: ast.Expr) -> Optional[ast.Expr]:
    """A comparison with each affine side written canonically (a side that is not affine, such
    as a size-expression atom, kept as is), else None."""
    if isinstance(node, ast.Binary) and node.op in ("<", "<=", ">", ">=", "==", "!="):
        return dataclasses.replace(node, lhs=_canonical(node.lhs), rhs=_canonical(node.rhs))
    return None


def _factors(expr: ast.Expr) -> tuple[int, list[tuple[ast.Expr, bool]]]:
    """``expr`` as a sign and ``(factor, divides)`` pairs: ``-(a / b * c)`` is ``-1, [(a, False),
    (b, True), (c, False)]``; anything but ``*``, ``/`` and unary ``-`` is one factor."""
    if isinstance(expr, ast.Unary) and expr.op == "-":
        sign, factors = _factors(expr.operand)
        return -sign, factors
    if isinstance(expr, ast.Binary) and expr.op in ("*", "/"):
        sign_a, a = _factors(expr.lhs)
        if expr.op == "/":
            return sign_a, a + [(expr.rhs, True)]
        sign_b, b = _factors(expr.rhs)
        return sign_a * sign_b, a + b
    return 1, [(expr, False)]


def _linear(expr: ast.Expr) -> Optional[dict]:
    """``expr`` as {variable name (None for the constant): integer coefficient} when it is a
    sum of index variables, size variables and literals times literals, else None."""
    if isinstance(expr, ast.IntLit):
        return {None: expr.value}
    if isinstance(expr, (ast.IndexVar, ast.SizeVar)):
        return {expr.name: 1}
    if isinstance(expr, ast.Unary) and expr.op == "-":
        inner = _linear(expr.operand)
        return None if inner is None else {k: -v for k, v in inner.items()}
    if isinstance(expr, ast.Binary) and expr.op in ("+", "-"):
        a, b = _linear(expr.lhs), _linear(expr.rhs)
        if a is None or b is None:
            return None
        sign = 1 if expr.op == "+" else -1
        return {k: a.get(k, 0) + sign * b.get(k, 0) for k in a.keys() | b.keys()}
    if isinstance(expr, ast.Binary) and expr.op == "*":
        a, b = _linear(expr.lhs), _linear(expr.rhs)
        if a is None or b is None:
            return None
        for factor, other in ((a, b), (b, a)):
            if set(factor) == {None}:
                return {k: v * factor[None] for k, v in other.items()}
    return None


def _canonical(expr: ast.Expr) -> ast.Expr:
    """An affine index as ``2*h + kh - 1``: variables in order of appearance, then the constant."""
    terms = _linear(expr)
    if terms is None:
        return expr
    names = {n.name: n for n in expr.walk() if isinstance(n, (ast.IndexVar, ast.SizeVar))}
    result = None
    for name, node in names.items():
        coef = terms.get(name, 0)
        if coef == 0:
            continue
        term = node if abs(coef) == 1 else ast.Binary("*", ast.IntLit(abs(coef)), node)
        if result is None:
            result = term if coef > 0 else ast.Unary("-", term)
        else:
            result = ast.Binary("+" if coef > 0 else "-", result, term)
    constant = terms.get(None, 0)
    if result is None:
        return ast.IntLit(constant) if constant >= 0 else ast.Unary("-", ast.IntLit(-constant))
    if constant:
        result = ast.Binary("+" if constant > 0 else "-", result, ast.IntLit(abs(constant)))
    return result


def _coefficient(expr: ast.Expr, var: str) -> Optional[int]:
    """The integer coefficient of index variable ``var`` in ``expr`` if ``expr`` is affine in it
    (``+ - *`` by literals), else None."""
    if var not in index_vars(expr):
        return 0
    if isinstance(expr, ast.IndexVar):
        return 1
    if isinstance(expr, ast.Unary) and expr.op == "-":
        inner = _coefficient(expr.operand, var)
        return None if inner is None else -inner
    if isinstance(expr, ast.Binary) and expr.op in ("+", "-"):
        a, b = _coefficient(expr.lhs, var), _coefficient(expr.rhs, var)
        if a is None or b is None:
            return None
        return a + b if expr.op == "+" else a - b
    if isinstance(expr, ast.Binary) and expr.op == "*":
        for factor, other in ((expr.lhs, expr.rhs), (expr.rhs, expr.lhs)):
            if isinstance(factor, ast.IntLit):
                inner = _coefficient(other, var)
                return None if inner is None else inner * factor.value
    return None
