"""Range inference: the iteration range of every index variable, output shapes, size preconditions.

TC's rule (docs/source/inference.rst of Tensor Comprehensions): each index variable gets the
largest rectangular range ``[lo, hi)`` for which no access reads out of bounds. Ranges given by
``where i in lo:hi`` are fixed up front. The others are found in rounds: an access index
expression with exactly one unresolved variable bounds that variable *for all values* of the
variables resolved in earlier rounds; bounds found within one round are intersected. ``exists
T(...)`` constrains like an access and computes nothing. Integer division rounds toward
negative infinity.

Everything is computed with isl (islpy): sets and piecewise quasi-affine bounds whose parameters
are the def's size variables. Bounds are shown to people as sympy expressions printed in TC
syntax (``floor((H - KH)/2)`` prints as ``(H - KH)/2``).

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

import itertools
import numbers
from dataclasses import dataclass, field
from typing import Optional

import islpy as isl
import sympy

from .errors import TCPreconditionError, TCRangeError, TCShapeError
from .lang import ast
from .lang.visit import index_vars, inline_lets, reads_tensor

_CTX = isl.DEFAULT_CONTEXT
_SET = isl.dim_type.set
_PARAM = isl.dim_type.param


# ----------------------------------------------------------------------------- public results


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
    """

    stmt: ast.Stmt
    ranges: dict
    domain: isl.Set = field(compare=False, repr=False)
    defines: bool = False
    runtime_checked: tuple = ()


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

    def bind(self, sizes: dict) -> BoundRanges:
        """Evaluate ranges and shapes for concrete ``sizes`` (every size variable, ints >= 0).

        Raises :class:`~tcpy.errors.TCPreconditionError` naming the access, its position and
        the sizes when some access would read out of bounds for these sizes.
        """
        point = self._point(sizes)
        broken = self.violated(point)
        if broken:
            raise TCPreconditionError(_violation_message(self, broken[0], sizes, point))
        return self._evaluate(sizes, point)

    def violated(self, point: isl.Point) -> list:
        """The preconditions these sizes (an isl point over the size variables) violate."""
        here = isl.Set.from_point(point)
        return [pre for pre in self.preconditions if not pre.violated.intersect(here).is_empty()]

    def _evaluate(self, sizes: dict, point: isl.Point) -> BoundRanges:
        statements = []
        for st in self.statements:
            bound = {}
            for var, vr in st.ranges.items():
                lo, hi = _eval(vr.lo_isl, point), _eval(vr.hi_isl, point)
                bound[var] = (0, 0) if lo is None or hi is None or hi <= lo else (lo, hi)
            statements.append(bound)
        shapes = {name: tuple(_eval(d, point) or 0 for d in dims) for name, dims in self.shapes_isl.items()}
        return BoundRanges(dict(sizes), tuple(statements), shapes)

    def _point(self, sizes: dict) -> isl.Point:
        missing = [s for s in self.size_vars if s not in sizes]
        if missing:
            raise TCShapeError(f"in def '{self.def_.name}': no value for size {', '.join(missing)}")
        point = isl.Point.zero(_param_space(self.size_vars))
        for pos, name in enumerate(self.size_vars):
            value = sizes[name]
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
                raise TCShapeError(
                    f"in def '{self.def_.name}': size {name} must be an integer >= 0, got {value!r}"
                )
            point = point.set_coordinate_val(_PARAM, pos, int(value))
        return point


def infer(def_: ast.Def, source: Optional[str] = None, filename: str = "<string>") -> DefRanges:
    """Infer the ranges of every statement of a checked def, its output shapes and preconditions.

    ``source`` (the program text) only makes errors show the offending line. Raises
    :class:`~tcpy.errors.TCRangeError` for a variable no access bounds, a range that depends on
    tensor values, inconsistent constraints, or an output index range that starts below zero.
    """
    return _DefInference(def_, source, filename).run()


# ----------------------------------------------------------------------------- isl helpers


def _param_space(params) -> isl.Space:
    return isl.Space.create_from_names(_CTX, set=[], params=list(params)).params()


def _eval(pa: Optional[isl.PwAff], point: isl.Point) -> Optional[int]:
    if pa is None:
        return None
    value = pa.eval(point)
    return None if value.is_nan() else value.to_python()


def _lift(pa: isl.PwAff, n: int) -> isl.PwAff:
    """A bound over the sizes, as a function on a statement space with ``n`` dimensions."""
    return pa.insert_dims(isl.dim_type.in_, 0, n) if n else pa


def _keep_dim(s: isl.Set, pos: int) -> isl.Set:
    """Existentially project out every set dimension but ``pos``."""
    n = s.dim(_SET)
    return s.project_out(_SET, pos + 1, n - pos - 1).project_out(_SET, 0, pos)


def _try_bound(s: isl.Set, which: str) -> Optional[isl.PwAff]:
    try:
        return (s.dim_min(0) if which == "min" else s.dim_max(0)).coalesce()
    except isl.Error:  # unbounded optimum: this set does not bound the variable that way
        return None


def _simplest(pa: isl.PwAff) -> isl.PwAff:
    """``pa`` as one piece when one of its pieces' formulas holds on its whole domain."""
    pa = pa.coalesce()
    dom = pa.domain()
    for _, aff in pa.get_pieces():
        candidate = isl.PwAff.from_aff(aff).intersect_domain(dom)
        if candidate.ne_set(pa).is_empty():
            return candidate
    return pa


def _tuple_text(items) -> str:
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _requires_text(ok: isl.Set) -> str:
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
    for pos in range(c.dim(_PARAM)):
        coeff = c.get_coefficient_val(_PARAM, pos).to_python()
        if coeff:
            name = c.get_dim_name(_PARAM, pos)
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


# ----------------------------------------------------------------------------- isl -> sympy


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
    return sympy.Piecewise(*[(_tidy(_aff_to_sympy(a)), sympy.Symbol(_requires_text(s))) for s, a in pieces])


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
    for pos in range(aff.dim(_PARAM)):
        c = aff.get_coefficient_val(_PARAM, pos)
        if not c.is_zero():
            expr += _val(c) * sympy.Symbol(aff.get_dim_name(_PARAM, pos), integer=True)
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


# ----------------------------------------------------------------------------- AST -> isl


class _NotAffine(Exception):
    """An index expression isl cannot represent; ``data`` when it reads a tensor."""

    def __init__(self, node: ast.Expr, data: bool):
        super().__init__(str(node))
        self.node = node
        self.data = data


_COMPARE = {"<": "lt_set", "<=": "le_set", ">": "gt_set", ">=": "ge_set", "==": "eq_set", "!=": "ne_set"}


class _Converter:
    """Turns size and index expressions into isl piecewise affine functions on one space."""

    def __init__(self, params, dims, extents):
        self.space = (isl.Space.create_from_names(_CTX, set=list(dims), params=list(params)) if dims
                      else _param_space(params))
        self.ls = isl.LocalSpace.from_space(self.space)
        self.params = list(params)
        self.dims = list(dims)
        self.extents = extents  # tensor -> tuple of PwAff over the sizes

    def const(self, value: int) -> isl.PwAff:
        return isl.PwAff.from_aff(isl.Aff.val_on_domain(self.ls, isl.Val.int_from_si(_CTX, value)))

    def var(self, name: str) -> isl.PwAff:
        return isl.PwAff.from_aff(isl.Aff.var_on_domain(self.ls, _SET, self.dims.index(name)))

    def lift(self, pa: isl.PwAff) -> isl.PwAff:
        return _lift(pa, len(self.dims))

    def universe(self) -> isl.Set:
        return isl.Set.universe(self.space)

    def affine(self, e: ast.Expr, index: bool = True) -> isl.PwAff:
        """The isl function of ``e``; raises :class:`_NotAffine`.

        ``/`` and ``%`` round toward negative infinity inside index expressions only; in value
        expressions (ternary conditions) C truncates, which isl cannot express: not affine.
        """
        if isinstance(e, ast.IntLit):
            return self.const(e.value)
        if isinstance(e, ast.IndexVar):
            if e.name not in self.dims:
                raise _NotAffine(e, False)
            return self.var(e.name)
        if isinstance(e, ast.SizeVar):
            return isl.PwAff.from_aff(isl.Aff.var_on_domain(self.ls, _PARAM, self.params.index(e.name)))
        if isinstance(e, ast.DimRef):
            dims = self.extents.get(e.tensor)
            if dims is None or not 0 <= e.dim < len(dims):
                raise _NotAffine(e, False)
            return self.lift(dims[e.dim])
        if isinstance(e, ast.Cast) and e.to.is_integral:
            return self.affine(e.operand, index)
        if isinstance(e, ast.Unary) and e.op == "-":
            return self.affine(e.operand, index).neg()
        if isinstance(e, ast.Call) and e.func in ("min", "max") and len(e.args) == 2:
            a, b = self.affine(e.args[0], index), self.affine(e.args[1], index)
            return a.min(b) if e.func == "min" else a.max(b)
        if isinstance(e, ast.Ternary):
            cond = self.condition(e.cond)
            then, other = self.affine(e.then, index), self.affine(e.other, index)
            return then.intersect_domain(cond).union_add(other.intersect_domain(self.universe().subtract(cond)))
        if isinstance(e, ast.Binary) and e.op in "+-*/%":
            a, b = self.affine(e.lhs, index), self.affine(e.rhs, index)
            if e.op == "+":
                return a.add(b)
            if e.op == "-":
                return a.sub(b)
            if e.op == "*":
                if not (a.is_cst() or b.is_cst()):
                    raise _NotAffine(e, False)
                return a.mul(b)
            divisor = self._constant(b)
            if divisor in (None, 0) or not index:
                raise _NotAffine(e, False)
            quotient = a.scale_down_val(isl.Val.int_from_si(_CTX, divisor)).floor()
            if e.op == "/":
                return quotient
            return a.sub(quotient.scale_val(isl.Val.int_from_si(_CTX, divisor)))  # floor modulo
        if reads_tensor(e):
            raise _NotAffine(e, True)
        raise _NotAffine(e, False)

    @staticmethod
    def _constant(pa: isl.PwAff) -> Optional[int]:
        pieces = pa.get_pieces()
        if len(pieces) != 1 or not pieces[0][1].is_cst():
            return None
        val = pieces[0][1].get_constant_val()
        return val.to_python() if val.is_int() else None

    def condition(self, e: ast.Expr) -> isl.Set:
        """The set where a boolean expression holds; raises :class:`_NotAffine`."""
        if isinstance(e, ast.Binary) and e.op in _COMPARE:
            return getattr(self.affine(e.lhs, False), _COMPARE[e.op])(self.affine(e.rhs, False))
        if isinstance(e, ast.Binary) and e.op in ("&&", "||"):
            a, b = self.condition(e.lhs), self.condition(e.rhs)
            return a.intersect(b) if e.op == "&&" else a.union(b)
        if isinstance(e, ast.Unary) and e.op == "!":
            return self.universe().subtract(self.condition(e.operand))
        if reads_tensor(e):
            raise _NotAffine(e, True)
        raise _NotAffine(e, False)


# ----------------------------------------------------------------------------- constraints


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


def _accesses(e: ast.Expr, guard, conv: _Converter, out: list):
    """Collect (access, guard set) pairs, following the lazy branches of ternaries."""
    if isinstance(e, ast.Ternary):
        _accesses(e.cond, guard, conv, out)
        try:
            cond = conv.condition(e.cond)
        except _NotAffine:  # a condition we cannot analyse may be true: keep the outer guard
            _accesses(e.then, guard, conv, out)
            _accesses(e.other, guard, conv, out)
            return
        base = guard if guard is not None else conv.universe()
        _accesses(e.then, base.intersect(cond), conv, out)
        _accesses(e.other, base.subtract(cond), conv, out)
        return
    if isinstance(e, ast.Access):
        out.append((e, guard))
    for child in e.children():
        _accesses(child, guard, conv, out)


# ----------------------------------------------------------------------------- inference


class _DefInference:
    def __init__(self, def_: ast.Def, source, filename):
        self.def_ = def_
        self.source = source
        self.filename = filename
        self.params = tuple(def_.size_vars)
        self.pspace = _param_space(self.params)
        self.context = isl.Set.universe(self.pspace)
        for pos in range(len(self.params)):
            self.context = self.context.lower_bound_val(_PARAM, pos, isl.Val.zero(_CTX))
        self.extents: dict[str, tuple] = {}
        self.sym_shapes: dict[str, tuple] = {}
        pconv = _Converter(self.params, (), self.extents)
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
        conv = _Converter(self.params, dims, self.extents)
        pconv = _Converter(self.params, (), self.extents)
        defines = stmt.target not in self.extents

        found: list = []
        if not defines:  # writing a tensor of known shape: the left side cannot go outside it
            found.append((ast.Access(stmt.target, stmt.lhs, stmt.target_span), None))
        _accesses(stmt.rhs, None, conv, found)
        exists_from = len(found)
        for clause in stmt.where:
            if isinstance(clause, ast.Exists):
                _accesses(clause.expr, None, conv, found)
        bounds, runtime = self.bounds(conv, found, exists_from)

        resolved: dict[str, tuple] = {}  # var -> (lo, hi, origin) over the sizes
        for clause in stmt.where:
            if isinstance(clause, ast.RangeConstraint):
                try:
                    lo, hi = pconv.affine(clause.lo), pconv.affine(clause.hi)
                except _NotAffine as exc:
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
        return StmtRanges(stmt, ranges, domain, defines, tuple(runtime))

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
                except _NotAffine as exc:
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
                    bad = _keep_dim(box.subtract(ok), pos)
                    good = isl.Set.universe(bad.get_space()).subtract(bad).intersect_params(ctx)
                    lo, hi = _try_bound(good, "min"), _try_bound(good, "max")
                    if lo is not None:
                        lows[v].append((lo, b, round_no))
                    if hi is not None:
                        highs[v].append((hi.add_constant_val(isl.Val.one(_CTX)), b, round_no))
            newly = [v for v in unresolved if lows[v] and highs[v]]
            for v in newly:
                self.resolve(stmt, v, lows[v], highs[v], resolved)
            if not newly:
                self.unbounded(stmt, unresolved, lows, highs, bounds, pending)
            unresolved = [v for v in unresolved if v not in newly]
        return resolved

    def resolve(self, stmt, v, lows, highs, resolved):
        lo = lows[0][0]
        for other, _, _ in lows[1:]:
            lo = lo.max(other)
        hi = highs[0][0]
        for other, _, _ in highs[1:]:
            hi = hi.min(other)
        lo, hi = lo.coalesce(), hi.coalesce()
        self.check_nonempty(v, lo, hi, stmt.span)
        # Values inside [lo, hi) that some access rejects (holes, e.g. from `%`) are not
        # checked here: the preconditions computed over the whole domain report them.
        names = []
        for _, b, _ in lows + highs:
            if str(b.access) not in names:
                names.append(str(b.access))
        origin = f"{', '.join(names)} (round {max(r for _, _, r in lows + highs)})"
        resolved[v] = (lo, hi, origin)

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
            size = _simplest(vr.hi_isl.intersect_domain(nonempty).union_add(
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
                text, stmt.span, index, "output", _requires_text(nonempty.subtract(negative).gist(nonempty)),
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
                shape = _tuple_text(self.def_extent_text(b.access.tensor, d) or "?"
                                    for d in range(len(b.access.indices)))
                raise self.error(
                    f"{b.access} reads out of bounds of {b.access.tensor} (shape {shape}) for all sizes "
                    f"when {given}", b.access.span)
            indices = tuple((c.dim, c.index) for c in bounds if c.access is b.access and c.index is not None)
            self.preconditions.append(Precondition(
                str(b.access), b.access.span, index, "access",
                _requires_text(runs.subtract(bad).gist(runs)), bad, (b.access, where, indices)))


# ----------------------------------------------------------------------------- bind-time messages


def _violation_message(dr: DefRanges, pre: Precondition, sizes: dict, point: isl.Point) -> str:
    shown = ", ".join(f"{k}={sizes[k]}" for k in dr.size_vars)
    where = f"line {pre.span.line}" if pre.span and pre.span.line else "statement"
    head = f"in def '{dr.def_.name}', {where}: with sizes {shown}, "
    if pre.kind == "output":
        vr = pre.detail
        lo, hi = _eval(vr.lo_isl, point), _eval(vr.hi_isl, point)
        return (head + f"output index '{vr.var}' of {pre.text} would range over {lo} <= {vr.var} < {hi} "
                f"({vr}), below 0; these sizes must satisfy {pre.requires}")
    access, domain, indices = pre.detail
    fixed = domain.intersect_params(isl.Set.from_point(point))
    parts = []
    for d, index in indices:
        pa = index.intersect_domain(fixed)
        if not pa.domain().is_empty():
            parts.append(f"index {d} ({access.indices[d]}) takes values {pa.min_val()}..{pa.max_val()}")
    extent = _extent_text(dr, access.tensor, point, dr.shapes_isl)
    return (head + f"{pre.text} reads out of bounds of {access.tensor}{extent}: " + "; ".join(parts)
            + f" (these sizes must satisfy {pre.requires})")


def _extent_text(dr: DefRanges, tensor: str, point, info) -> str:
    if tensor in info:
        return f" (shape {tuple(_eval(d, point) or 0 for d in info[tensor])})"
    for p in dr.def_.params + dr.def_.returns:
        if p.name == tensor and p.type is not None:
            sizes = {name: point.get_coordinate_val(_PARAM, pos).to_python() for pos, name in enumerate(dr.size_vars)}
            return " (shape " + str(tuple(d.value if isinstance(d, ast.IntLit) else sizes[d.name]
                                          for d in p.type.dims)) + ")"
    return ""


# ----------------------------------------------------------------------------- explain


def explain(def_ranges: DefRanges, sizes: Optional[dict] = None) -> str:
    """A readable report: per statement each index variable's range (symbolic, and bound to
    numbers when ``sizes`` are given), output vs reduction, what fixed it; output shapes;
    preconditions (and whether ``sizes`` satisfy them); accesses checked at run time."""
    dr = def_ranges
    bound = point = None
    lines = [dr.def_.signature()]
    if sizes is not None:
        point = dr._point(sizes)
        bound = dr._evaluate(sizes, point)
        lines.append("  sizes: " + ", ".join(f"{k}={sizes[k]}" for k in dr.size_vars))
    roles = {t.name: t.role for t in dr.def_.tensors}
    for k, st in enumerate(dr.statements):
        lines.append(f"  statement {k + 1}: {st.stmt}")
        rows = []
        for var, vr in st.ranges.items():
            numbers = ""
            if bound is not None:
                lo, hi = bound.statements[k][var]
                numbers = f"= [{lo}, {hi})" if hi > lo else "= empty"
            rows.append((vr.kind, str(vr), numbers, f"({vr.origin})"))
        widths = [len("reduction")] + [max([len(r[c]) for r in rows] + [0]) for c in (1, 2)]
        for row in rows:
            cells = [cell.ljust(w) for cell, w in zip(row, widths)] + [row[3]]
            lines.append("    " + "  ".join(c for c in cells if c))
        for access in st.runtime_checked:
            lines.append(f"    checked at run time: {access} (index not affine in the sizes and index variables)")
    if dr.shapes:
        lines.append("  shapes:")
        for name, dims in dr.shapes.items():
            row = f"    {name}: ({', '.join(format_expr(d) for d in dims)}"
            row += "," if len(dims) == 1 else ""
            row += ")" if bound is None else f") = {bound.shapes[name]}"
            lines.append(f"{row}  ({roles.get(name, 'output')})")
    if dr.preconditions:
        lines.append("  preconditions:")
        bad = set(map(id, dr.violated(point))) if point is not None else set()
        for pre in dr.preconditions:
            what = "output index >= 0 for" if pre.kind == "output" else "in bounds:"
            row = f"    {what} {pre.text} (line {pre.span.line}) requires {pre.requires}"
            if point is not None:
                row += "  VIOLATED" if id(pre) in bad else "  ok"
            lines.append(row)
    return "\n".join(lines)
