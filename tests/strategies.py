"""Hypothesis strategies: random valid TC programs with matching inputs, and invalid ones.

:func:`programs` draws a :class:`GenProgram`: the source of one def with 1-3 statements, its
arguments, and what the generator itself expects of it (output names and shapes). Programs are
valid by construction. Sizes are drawn first, and every index expression is one of a few forms
whose range the generator computes itself with TC's rule (the largest range that keeps every
access in bounds, intersected over accesses, found in rounds):

* ``c*v + d`` (stride ``c``, offset ``d``) and ``v / c`` (floor division): bound ``v`` in round 1;
* ``c*v + w`` (a convolution window): ``v`` appears nowhere alone, so it is bounded in round 2
  from the range of ``w``, which a plain ``w`` access fixes in round 1;
* ``v + d`` for ``v`` given by ``where v in lo:hi`` (always in bounds), and the guarded padding
  read ``v + d >= 0 && v + d < S ? X(v + d) : 0`` whose untaken branch would read out of bounds;
* constant ``0``; data-dependent ``X(L(v))`` with a lookup table ``L`` whose values are in
  range (rarely one is not: then every backend must raise TCRuntimeError).

The shapes the generator computes are an oracle for range inference, independent of it.
Expressions cover + - * / %, unary - and !, comparisons, && ||, lazy ternaries (also guarding
integer divisions), builtins, min/max, casts, index and size variables used as values and
literals (float literals are float32, some not exactly: ``0.1`` in a double kernel is
``(double)0.1f``), and whole right-hand sides that are index values (int32 outputs, as in TC);
targets cover outputs, temporaries, updates of earlier outputs (half of them reading their own
target, at any index) and rank 0, with every
reduction operator with and without ``!``; dtypes cover half, float, double, signed and
unsigned integers and bool.

:func:`invalid_cases` draws mutations of valid programs and of their arguments (wrong rank,
dtype or size, missing or extra arguments, non-arrays, out-of-range ``where``, undefined names,
truncated source, random characters) for the fuzz test.
"""
from __future__ import annotations

import os
import string
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from hypothesis import strategies as st

from tcpy.lang.types import INDEX_TYPE, ScalarType, promote

# The random-strategy tests are derandomized (reruns hit the kernel cache) unless a fresh run asks
# for new examples: TCPY_FUZZ_SEED=random with the test's example count raised.
DERANDOMIZE = os.environ.get("TCPY_FUZZ_SEED", "") != "random"

S = ScalarType
FLOAT_TYPES = (S.FLOAT32, S.FLOAT64, S.FLOAT16)
INT_TYPES = (S.INT32, S.INT64, S.INT8, S.INT16, S.UINT8, S.UINT16, S.UINT32, S.UINT64)
SIZE_NAMES = ("M", "N", "K", "P")
OUT_VARS = ("i", "j", "l")
RED_VARS = ("k", "q", "r", "s", "t", "u", "v", "w")
FLOAT_BUILTINS = {"exp": 1, "tanh": 1, "sqrt": 1, "fabs": 1, "floor": 1, "sin": 1, "cos": 1,
                  "log1p": 1, "erf": 1, "fmax": 2, "fmin": 2, "atan2": 2, "ceil": 1,
                  "round": 1, "trunc": 1, "copysign": 2, "hypot": 2, "log": 1, "expm1": 1}
REDUCTIONS = ("+", "*", "min", "max")


@dataclass
class Tensor:
    """A tensor the generator knows: element type and concrete shape."""

    name: str
    type: ScalarType
    shape: tuple
    dims: tuple = ()  # signature dims (size names or digits) of parameters
    role: str = "input"  # input, table, output or temporary
    table_bound: int = 1 << 30  # lookup tables: their values index dims of this size


@dataclass
class GenProgram:
    """A generated program: source, arguments, and what the generator expects of it."""

    source: str
    name: str
    args: list
    outputs: list
    shapes: dict  # output name -> shape, from the generator's own range inference
    reduction_length: int = 1  # the longest reduction (scales float tolerances)
    bad_table: bool = False  # a lookup table holds an out-of-range index (an error if it is read)
    sizes: dict = field(default_factory=dict)
    options: Optional[dict] = None  # tcpy.Options(**options) for the compiled kernel
    volume: int = 1  # the largest iteration domain of a statement
    use_out: bool = False  # also call the compiled kernel with out= arrays full of garbage


    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        def show(a):
            if isinstance(a, np.ndarray):
                return f"np.array({a.tolist()!r}, dtype=np.{a.dtype})"
            return repr(a)
        args = ",\n    ".join(show(a) for a in self.args)
        return f"GenProgram(sizes={self.sizes}, shapes={self.shapes}, options={self.options})\nsrc = '''\n{self.source}'''\nargs = [\n    {args}]"


def _affine(name: str, c: int, d: int) -> str:
    text = name if c == 1 else f"{c} * {name}"
    return f"{text} + {d}" if d > 0 else f"{text} - {-d}" if d < 0 else text


class _Var:
    """An index variable of the statement being built and what bounds it."""

    def __init__(self, name: str, kind: str, output: bool):
        self.name = name
        self.kind = kind  # direct | window | where
        self.output = output
        self.lo: Optional[int] = None  # direct and where: the concrete range so far
        self.hi: Optional[int] = None
        self.partner: Optional["_Var"] = None  # window: the variable it slides over
        self.reserved = False  # a window partner: used only plainly and in its windows
        self.stride = 1
        self.windows: list = []  # window: sizes of the dims it indexes
        self.where = ""

    @property
    def bounded(self) -> bool:
        if self.kind == "window":
            return bool(self.windows)
        return self.lo is not None

    def range(self) -> tuple:
        if self.kind == "window":
            p = self.partner
            return 0, min((size - p.hi) // self.stride + 1 for size in self.windows)
        return self.lo, self.hi


class _Builder:
    """Draws one program; ``draw`` is hypothesis' draw function."""

    def __init__(self, draw, name: str):
        self.draw = draw
        self.name = name
        self.sizes: dict = {}
        self.tensors: dict = {}
        self.order: list = []
        self.stmts: list = []
        self.returns: list = []
        self.max_reduction = 1
        self.max_volume = 1  # the largest iteration domain (the reference evaluates it at once)
        self.bad_table = False
        self.pending_reads: list = []  # temporaries the next statement must read
        self.typed_returns: dict = {}  # name -> "float(M, N) O1"

    def pick(self, options):
        return self.draw(st.sampled_from(list(options)))

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 99)) < p * 100

    # -- signature and arguments

    def signature(self):
        sizes = {name: self.draw(st.integers(1, 6)) for name in SIZE_NAMES[: self.draw(st.integers(1, 3))]}
        if self.chance(0.2):  # one larger size: partial tiles, vector remainders, parallel loops
            sizes[self.pick(sizes)] = self.draw(st.integers(7, 45))
        self.family = self.pick(("float", "float", "float", "int", "int", "mixed"))
        self.base = self.pick(INT_TYPES) if self.family == "int" else self.pick(FLOAT_TYPES)
        for k in range(self.draw(st.integers(1, 3))):
            t = self.base
            if self.family == "mixed" and k > 0:
                t = self.pick(FLOAT_TYPES + INT_TYPES + (S.BOOL,))
            rank = self.draw(st.integers(1 if k == 0 else 0, 3))
            dims = tuple(str(self.draw(st.integers(1, 4))) if self.chance(0.12) else self.pick(sizes)
                         for _ in range(rank))
            self.add(Tensor("ABC"[k], t, tuple(int(d) if d.isdigit() else sizes[d] for d in dims), dims))
        used = {d for t in self.tensors.values() for d in t.dims}
        self.sizes = {k: v for k, v in sizes.items() if k in used}
        if self.sizes and self.chance(0.2):
            dims = tuple(self.pick(self.sizes) for _ in range(self.draw(st.integers(1, 2))))
            t = self.pick((S.INT32, S.INT64))
            self.add(Tensor("L", t, tuple(self.sizes[d] for d in dims), dims, role="table"))

    def add(self, t: Tensor):
        self.tensors[t.name] = t
        self.order.append(t.name)

    def arguments(self) -> list:
        rng = np.random.default_rng(self.draw(st.integers(0, 2**32 - 1)))
        args = []
        for name in self.order:
            t = self.tensors[name]
            if t.role == "table":
                bound = min(t.table_bound, 1000)
                values = rng.integers(0, bound, size=t.shape)
                if values.size and t.table_bound < 1 << 30 and self.chance(0.1):
                    values.flat[rng.integers(values.size)] = self.pick((bound, -1))
                    self.bad_table = True
                args.append(values.astype(t.type.numpy_name))
            elif t.role == "input":
                a = random_array(rng, t.type, t.shape, as_number=self.chance(0.3))
                if isinstance(a, np.ndarray) and a.ndim and self.chance(0.15):
                    # same values, not C-contiguous: a strided view or Fortran order
                    a = np.repeat(a, 2, axis=-1)[..., ::2] if self.chance(0.5) else np.asfortranarray(a)
                args.append(a)
        return args

    def source(self) -> str:
        params = []
        for name in self.order:
            t = self.tensors[name]
            if t.role in ("input", "table"):
                params.append(f"{t.type.tc_name}{'(' + ', '.join(t.dims) + ')' if t.dims else ''} {name}")
        body = "".join(f"    {s}\n" for s in self.stmts)
        returns = ", ".join(self.typed_returns.get(r, r) for r in self.returns)
        return f"def {self.name}({', '.join(params)}) -> ({returns}) {{\n{body}}}\n"

    # -- statements

    def statement(self, last: bool):
        written = [t for t in self.tensors.values() if t.role in ("output", "temporary")]
        if written and self.chance(0.25):
            target = self.pick(written)
            text, _, _ = _Stmt(self, len(target.shape), target).build()
            self.stmts.append(text)
            return
        role = "temporary" if not last and self.chance(0.3) else "output"
        n = sum(1 for t in self.tensors.values() if t.role == role) + 1
        name = ("T" if role == "temporary" else "O") + str(n)
        rank = self.draw(st.integers(0, 3))
        declared = None
        if role == "output" and self.sizes and rank and self.chance(0.15):
            # a typed return: its declared shape bounds the defining statement like a read
            dims = tuple(self.pick(self.sizes) for _ in range(rank))
            t = self.pick(FLOAT_TYPES + INT_TYPES) if self.family == "mixed" else self.base
            declared = Tensor(name, t, tuple(self.sizes[d] for d in dims), dims, role="output")
        stmt = _Stmt(self, rank, declared, fresh=declared is not None)
        text, ttype, shape = stmt.build()
        self.add(declared or Tensor(name, ttype, shape, role=role))
        if declared is not None:
            self.stmts.append(text)
            self.typed_returns[name] = f"{declared.type.tc_name}({', '.join(declared.dims)}) {name}"
        else:
            self.stmts.append(name + text)
        (self.returns if role == "output" else self.pending_reads).append(name)


def random_array(rng, t: ScalarType, shape, as_number: bool = False):
    """Small values: dyadic floats in [-2, 2] (sums and products stay exact), ints in [-4, 6]."""
    if t.is_float:
        a = rng.integers(-8, 9, size=shape) / 4.0
    elif t is S.BOOL:
        a = rng.integers(0, 2, size=shape).astype(bool)
    elif t.is_signed:
        a = rng.integers(-4, 5, size=shape)
    else:
        a = rng.integers(0, 7, size=shape)
    a = np.asarray(a).astype(t.numpy_name)
    if not shape and as_number and t in (S.FLOAT64, S.FLOAT32, S.INT64, S.INT32, S.BOOL):
        return a.item()  # a Python number for a rank-0 parameter
    return a


class _Stmt:
    """Builds one statement: left side, operator, right side, where clauses."""

    def __init__(self, b: _Builder, rank: int, target: Optional[Tensor], fresh: bool = False):
        self.b = b
        self.rank = rank
        self.target = target  # a tensor of known shape: an update, or a typed return (fresh)
        self.fresh = fresh  # the first write of a typed return
        # an update may read its own target, also where other iterations write (C(j, i) = C(i, j)):
        # the right-hand side sees the target as it was before the statement
        self.reads_own = target is not None and not fresh and b.chance(0.5)
        self.vars: list = []
        self.where: list = []
        self.terms: list = []  # accesses that must appear (anchors): (text, type)

    # -- variables

    def new_var(self, output: bool, kind: Optional[str] = None) -> _Var:
        b = self.b
        taken = {v.name for v in self.vars}
        name = next(n for n in (OUT_VARS if output else RED_VARS) if n not in taken)
        if kind is None:
            roll = b.draw(st.integers(0, 99))
            kind = "where" if roll < 14 and b.sizes else "window" if roll < 26 and output else "direct"
        var = _Var(name, kind, output)
        self.vars.append(var)
        if kind == "where":
            size = b.pick(b.sizes)
            n = b.sizes[size]
            lo = b.pick((0, 0, 1)) if n >= 2 else 0
            cut = b.pick((0, 0, 1)) if n - lo >= 2 else 0
            var.lo, var.hi = lo, n - cut
            var.where = f"{name} in {lo}:{size if cut == 0 else f'{size} - {cut}'}"
            self.where.append(var.where)
        if kind == "window":
            anchors = [t for t in self.readable() if t.shape]
            if not anchors:
                var.kind = "direct"
                return var
            p = self.new_var(False, "direct")
            p.reserved = True
            t = b.pick(anchors)
            dim = b.draw(st.integers(0, len(t.shape) - 1))
            if t.shape[dim] < 1:
                var.kind = "direct"
                return var
            p.lo, p.hi = 0, t.shape[dim]
            parts = [p.name if k == dim else self.index(s) for k, s in enumerate(t.shape)]
            self.terms.append((f"{t.name}({', '.join(parts)})", t.type))
            var.partner = p
            var.stride = b.pick((1, 1, 2))
        return var

    def readable(self):
        own = self.target.name if self.target is not None and not self.reads_own else None
        return [t for t in self.b.tensors.values() if t.role != "table" and t.name != own]

    # -- index expressions

    def index(self, size: int) -> str:
        """An index expression for a dimension of ``size`` that keeps every range non-empty."""
        b = self.b
        roll = b.draw(st.integers(0, 99))
        if roll < 5:
            return "0"
        table = b.tensors.get("L")
        if table is not None and roll < 15:
            table.table_bound = min(table.table_bound, size)
            return f"L({', '.join(self.index(s) for s in table.shape)})"
        candidates = [v for v in self.vars if not v.reserved and (v.kind != "window" or v.partner)]
        n_reduction = sum(1 for v in self.vars if not v.output)
        if (roll < 40 or not candidates) and n_reduction < 3:
            var = self.new_var(output=False)
            text = self.use(var, size)
            if text is None and not var.bounded and var.kind == "direct":
                self.vars.remove(var)
        elif not candidates:
            return "0"
        else:
            text = self.use(b.pick(candidates), size)
        return "0" if text is None else text

    def use(self, var: _Var, size: int) -> Optional[str]:
        """``var`` in an index of a dimension of ``size``, updating its range; None if impossible."""
        b = self.b
        if var.kind == "where":
            offsets = list(range(-var.lo, size - var.hi + 1))  # [lo+d, hi+d) within [0, size)
            return _affine(var.name, 1, b.pick(offsets)) if offsets else None
        if var.kind == "window":
            p, c = var.partner, var.stride
            if (size - p.hi) // c + 1 < 1:
                return None
            var.windows.append(size)
            return f"{'' if c == 1 else f'{c} * '}{var.name} + {p.name}"
        forms = [(1, 0), (1, 0), (1, 0), (1, -1), (1, 1), (2, 0), (2, 1), (1, -2), (3, 0), ("/", 2)]
        for form in (b.pick(forms), (1, 0)):
            if form[0] == "/":
                lo, hi, text = 0, form[1] * size, f"{var.name} / {form[1]}"
            else:
                c, d = form
                d = -abs(d) if var.output else d  # output ranges must start at 0 or above
                lo, hi, text = -(d // c), (size - 1 - d) // c + 1, _affine(var.name, c, d)
            new_lo = lo if var.lo is None else max(var.lo, lo)
            new_hi = hi if var.hi is None else min(var.hi, hi)
            if new_hi - new_lo >= 1 and not (var.output and new_lo < 0):
                var.lo, var.hi = new_lo, new_hi
                return text
        return None

    def access(self, t: Tensor) -> str:
        if not t.shape:
            return t.name
        return f"{t.name}({', '.join(self.index(size) for size in t.shape)})"

    def padded_read(self):
        """``v + d >= 0 && v + d < S ? X(.., v + d, ..) : 0`` for a where variable ``v``."""
        b = self.b
        wheres = [v for v in self.vars if v.kind == "where"]
        tensors = [t for t in self.readable() if t.shape and t.dims]
        if not wheres or not tensors:
            return None
        var, t = b.pick(wheres), b.pick(tensors)
        dim = b.draw(st.integers(0, len(t.shape) - 1))
        d = b.pick((-2, -1, 1, 2))
        idx = _affine(var.name, 1, d)
        parts = [idx if k == dim else self.index(s) for k, s in enumerate(t.shape)]
        bound = t.dims[dim]
        text = f"({idx} >= 0 && {idx} < {bound} ? {t.name}({', '.join(parts)}) : {_zero(t.type)})"
        return text, promote(t.type, S.FLOAT32 if t.type.is_float else S.INT32)

    # -- expressions, as (text, type)

    def leaf(self, want_float: bool, in_condition: bool = False):
        b = self.b
        own = self.target.name if self.target is not None else None
        pending = [n for n in b.pending_reads if n != own]  # never read the statement's own target
        if pending:  # a temporary an earlier statement wrote
            b.pending_reads.remove(pending[0])
            t = b.tensors[pending[0]]
            return self.access(t), t.type
        roll = b.draw(st.integers(0, 99))
        readable = self.readable()
        if roll < 60 and readable:
            t = b.pick(readable)
            return self.access(t), t.type
        if roll < 72:
            if want_float or b.chance(0.5):
                # (0.1 and 0.17677669 are not float32 values: a double kernel must scale by 0.1f)
                return repr(b.pick((0.5, 1.5, 2.0, 0.25, 3.0, 0.1, 0.17677669))), S.FLOAT32
            return str(b.pick((1, 2, 3))), S.INT32
        bounded = [v for v in self.vars if v.bounded]
        if roll < 86 and bounded and not in_condition:  # affine conditions would change ranges
            return b.pick(bounded).name, INDEX_TYPE
        if roll < 92 and b.sizes:
            return b.pick(b.sizes), INDEX_TYPE
        if roll < 96:
            padded = self.padded_read()
            if padded is not None:
                return padded
        if readable:
            t = b.pick(readable)
            return self.access(t), t.type
        return "1", S.INT32

    def expr(self, depth: int, want_float: bool, in_condition: bool = False):
        b = self.b
        if depth <= 0 or b.chance(0.25):
            return self.leaf(want_float, in_condition)
        sub = lambda: self.expr(depth - 1, want_float, in_condition)  # noqa: E731
        roll = b.draw(st.integers(0, 99))
        if roll < 45:
            op = b.pick(("+", "-", "*", "+", "*", "/", "%"))
            (lt, ltype), (rt, rtype) = sub(), sub()
            t = promote(ltype, rtype)
            if t is S.BOOL:
                return f"({lt} == {rt})", S.BOOL
            if op == "%" and t.is_float:
                op = "/"
            if op in ("/", "%") and not t.is_float and b.chance(0.85):
                # guarded: the lazy ternary must not divide by zero in the untaken branch
                return f"({rt} != 0 ? ({lt}) {op} ({rt}) : 7)", promote(t, S.INT32)
            return f"({lt}) {op} ({rt})", t
        if roll < 56:
            ct, _ = self.condition(depth - 1)
            (at, atype), (ot, otype) = sub(), sub()
            return f"({ct} ? {at} : {ot})", promote(atype, otype)
        if roll < 68:
            name = b.pick(sorted(FLOAT_BUILTINS))
            args = [self.expr(depth - 1, True, in_condition) for _ in range(FLOAT_BUILTINS[name])]
            t = S.FLOAT32
            for _, at in args:
                t = promote(t, at)
            return f"{name}({', '.join(a for a, _ in args)})", t
        if roll < 78:
            (lt, ltype), (rt, rtype) = sub(), sub()
            return f"{b.pick(('min', 'max'))}({lt}, {rt})", promote(ltype, rtype)
        if roll < 89:
            to = b.pick(FLOAT_TYPES + INT_TYPES + (S.BOOL,))
            inner, _ = sub()
            return f"{to.tc_name}({inner})", to
        inner, t = sub()
        return (f"!({inner})", S.BOOL) if t is S.BOOL else (f"-({inner})", t)

    def index_value(self, out_vars):
        """An index value over the output variables, sizes and literals (``(i) * N + 2``): int32
        as in TC, computed exactly in 64 bits; sometimes ``int64(...)`` around it."""
        b = self.b
        parts = [v.name for v in out_vars] + list(b.sizes) + ["2", "3"]
        text = b.pick(parts)
        for _ in range(b.draw(st.integers(0, 2))):
            op = b.pick(("+", "-", "*", "/", "%"))
            other = b.pick(("2", "3")) if op in ("/", "%") else b.pick(parts)  # never by zero
            text = f"({text}) {op} {other}"
        return (f"int64({text})", S.INT64) if b.chance(0.2) else (text, INDEX_TYPE)

    def condition(self, depth: int):
        b = self.b
        roll = b.draw(st.integers(0, 99))
        if roll < 20 and depth > 0:
            (lt, _), (rt, _) = self.condition(depth - 1), self.condition(depth - 1)
            return f"({lt} {b.pick(('&&', '||'))} {rt})", S.BOOL
        if roll < 28:
            inner, _ = self.condition(max(depth - 1, 0))
            return f"!{inner}", S.BOOL
        lt, _ = self.expr(max(depth - 1, 0), False, in_condition=True)
        rt, _ = self.expr(0, False, in_condition=True)
        return f"({lt} {b.pick(('<', '>', '<=', '>=', '==', '!='))} {rt})", S.BOOL

    # -- the statement

    def build(self):
        """(text after the target name, value type, shape of the target)."""
        b, target = self.b, self.target
        # updates: plain variables, bounded by the target's shape
        out_vars = [self.new_var(True, "direct" if target is not None else None) for _ in range(self.rank)]
        if target is not None:  # the target's shape bounds the left side like a read
            for v, n in zip(out_vars, target.shape):
                v.lo, v.hi = 0, n
        index_valued = b.chance(0.1)  # an index-valued output: int32, as in TC
        if index_valued:
            rhs, rtype = self.index_value(out_vars)
        else:
            rhs, rtype = self.expr(b.draw(st.integers(0, 3)), b.family != "int")
        if not index_valued and b.chance(0.12):  # a let binding, inlined by sema
            let_text, let_type = self.expr(1, b.family != "int")
            self.where.append(f"z0 = {let_text}")
            rhs, rtype = f"({rhs}) {b.pick(('+', '*', '-'))} z0", promote(rtype, let_type)
        if self.reads_own and not index_valued:  # the target itself, transposed or at other indices
            if len(out_vars) >= 2 and b.chance(0.5):
                order = b.draw(st.permutations(out_vars))
                text = f"{target.name}({', '.join(self.use(v, n) or '0' for v, n in zip(order, target.shape))})"
            else:
                text = self.access(target)
            rhs, rtype = f"({rhs}) {b.pick(('+', '*'))} {text}", promote(rtype, target.type)
        for text, ttype in self.terms:
            if index_valued:  # keep the value an index value: the anchor only constrains
                self.where.append(f"exists {text}")
            else:
                rhs, rtype = f"({rhs}) {b.pick(('+', '*'))} {text}", promote(rtype, ttype)
        for v in out_vars:  # every output variable needs something that bounds it
            if v.bounded:
                continue
            tensors = [t for t in self.readable() if t.shape]
            text = None
            if tensors:
                t = b.pick(tensors)
                dim = b.draw(st.integers(0, len(t.shape) - 1))
                own = self.use(v, t.shape[dim])
                if own is not None:
                    text = f"{t.name}({', '.join(own if k == dim else self.index(s) for k, s in enumerate(t.shape))})"
                    if index_valued or b.chance(0.3):  # constrains like an access, computes nothing
                        self.where.append(f"exists {text}")
                    else:
                        rhs, rtype = f"({rhs}) + {text}", promote(rtype, t.type)
            if text is None:  # a where clause over a size
                size = b.pick(b.sizes) if b.sizes else None
                v.kind, v.lo, v.hi = "where", 0, b.sizes[size] if size else 1
                v.where = f"{v.name} in 0:{size if size else 1}"
                self.where.append(v.where)
        if rtype is S.BOOL:
            rhs, rtype = f"int32({rhs})", S.INT32
        if target is None and b.family != "int" and not index_valued and b.chance(0.3):
            rhs, rtype = f"{b.base.tc_name}({rhs})", b.base
        if target is not None and rtype is not target.type:
            rhs, rtype = f"{target.type.tc_name}({rhs})", target.type
        reduction_vars = [v for v in self.vars if not v.output]
        if reduction_vars:
            red = b.pick(REDUCTIONS)
            if red == "*" and not rtype.is_float:  # integer products overflow (UB in C)
                red = b.pick(("+", "min", "max"))
            if red == "*":  # factors in [-1, 1]: an overflow to inf (then inf * 0) depends on order
                rhs = f"{rtype.tc_name}(fmin(fmax({rhs}, -1.0), 1.0))"
            op = f"{red}=" + ("" if target is not None and not self.fresh and b.chance(0.5) else "!")
        elif target is not None and not self.fresh:
            op = b.pick(("=", "+=", "max=", "min=", "*="))
        else:
            op = b.pick(("=", "=", "=", "+=!", "max=!", "min=!", "*=!"))
        length = 1
        for v in reduction_vars:
            lo, hi = v.range()
            length *= max(0, hi - lo)
        b.max_reduction = max(b.max_reduction, length)
        volume = length
        for v in out_vars:
            lo, hi = v.range()
            volume *= max(0, hi - lo)
        b.max_volume = max(b.max_volume, volume)
        shape = tuple(target.shape) if target is not None else tuple(v.range()[1] for v in out_vars)
        lhs = f"({', '.join(v.name for v in out_vars)})" if out_vars else ""
        where = f" where {', '.join(self.where)}" if self.where else ""
        text = f"{lhs} {op} {rhs}{where}"
        return (target.name + text if target is not None else text), rtype, shape


def _zero(t: ScalarType) -> str:
    return "0.0" if t.is_float else "0"


@st.composite
def programs(draw, name: str = "f") -> GenProgram:
    """A random valid TC def with matching random arguments (see the module docstring)."""
    b = _Builder(draw, name)
    b.signature()
    n = draw(st.integers(1, 3))
    for k in range(n):
        b.statement(last=k == n - 1)
    while not b.returns or b.pending_reads:
        b.statement(last=True)
    args = b.arguments()
    shapes = {o: tuple(b.tensors[o].shape) for o in b.returns}
    return GenProgram(b.source(), name, args, list(b.returns), shapes, b.max_reduction,
                      b.bad_table, dict(b.sizes), draw(schedule_options()), b.max_volume,
                      draw(st.integers(0, 3)) == 0)


@st.composite
def schedule_options(draw) -> Optional[dict]:
    """None (the default schedule) or keyword arguments of tcpy.Options: tiles, loop order,
    unrolling, threads, parallel/vector/register-tile switches."""
    if draw(st.booleans()):
        return None
    names = list(OUT_VARS + RED_VARS[:3])
    tiled = draw(st.lists(st.sampled_from(names), unique=True, max_size=3))
    return dict(
        tile_sizes={v: draw(st.sampled_from([0, 1, 2, 3, 4, 8, 32])) for v in tiled},
        loop_order=tuple(draw(st.permutations(names))[: draw(st.integers(0, 4))]),
        unroll=draw(st.sampled_from([0, 0, 2, 4])),
        num_threads=draw(st.sampled_from([None, 1, 2, 7])),
        parallel=draw(st.booleans()),
        vectorize=draw(st.booleans()),
        register_tile=draw(st.booleans()),
        fuse=draw(st.booleans()),
    )


# ----------------------------------------------------------------------------- invalid inputs


@dataclass
class Case:
    """One fuzz case: a source and arguments; ``what`` says which mutation made it."""

    what: str
    source: str
    args: list

    def __repr__(self) -> str:
        return f"Case({self.what!r})\n{self.source}\nargs: {[getattr(a, 'shape', a) for a in self.args]}"


_JUNK = string.printable + "éλ→∑\x00\x7f\u200b\ud7ff"


def _mutate_source(draw, src: str) -> tuple[str, str]:
    kind = draw(st.sampled_from(["truncate", "delete", "insert", "replace", "undefined", "swap",
                                 "where", "bang", "rank", "bytes", "duplicate"]))
    n = len(src)
    pos = draw(st.integers(0, max(n - 1, 0)))
    if kind == "truncate":
        return kind, src[:pos]
    if kind == "delete":
        return kind, src[:pos] + src[pos + draw(st.integers(1, 4)):]
    if kind == "insert":
        return kind, src[:pos] + draw(st.text(alphabet=_JUNK, min_size=1, max_size=4)) + src[pos:]
    if kind == "replace":
        return kind, src[:pos] + draw(st.sampled_from(list("()[]{},:;=+-*/%!?<>.#0123456789 \n\t\"'"))) + src[pos + 1:]
    if kind == "undefined":  # a name used but never defined
        names = [w for w in ("A", "B", "C", "M", "N", "K", "i", "j", "k", "O1", "L", "exp", "max")
                 if w in src]
        if not names:
            return kind, src + "Z"
        old = draw(st.sampled_from(names))
        start = src.find("{") if draw(st.booleans()) else 0
        return kind, src[:start] + src[start:].replace(old, draw(st.sampled_from(["Zq", "undefined_", "_", "X9"])), 1)
    if kind == "swap":  # exchange two tokens
        tokens = src.split(" ")
        if len(tokens) > 2:
            a, c = draw(st.integers(0, len(tokens) - 1)), draw(st.integers(0, len(tokens) - 1))
            tokens[a], tokens[c] = tokens[c], tokens[a]
        return kind, " ".join(tokens)
    if kind == "where":  # a where range beyond the sizes
        line_end = src.rfind("\n}")
        clause = draw(st.sampled_from([" where i in 0:M + 3", " where k in -2:N", " where i in 5:2",
                                       " where i in 0:i", " where k in 0:A(0)", " where zz in 0:3"]))
        sep = ", " if " where " in src[src.rfind("\n", 0, line_end) : line_end] else ""
        return kind, src[:line_end] + (clause.replace(" where ", ", ") if sep else clause) + src[line_end:]
    if kind == "bang":  # drop or add the '!' of reductions
        return kind, src.replace("=!", "=", 1) if "=!" in src else src.replace(" = ", " +=! ", 1)
    if kind == "rank":  # one index too many or too few
        p = src.find("(", src.find("{"))
        if p < 0:
            return kind, src + ")"
        return kind, src[: p + 1] + ("0, " if draw(st.booleans()) else "") + src[p + 1:].replace(", ", ") + (", 1)
    if kind == "duplicate":
        return kind, src.replace("->", ", float X, float X) -> (", 1) if draw(st.booleans()) else src + src
    raw = draw(st.binary(min_size=1, max_size=40))
    return kind, src[:pos] + raw.decode("latin-1") + src[pos:]


def _mutate_args(draw, prog: GenProgram) -> tuple[str, list]:
    args = list(prog.args)
    kind = draw(st.sampled_from(["rank", "dtype", "size", "count", "kind", "noncontig_bad", "table"]))
    if not args:
        return "count", [np.zeros(1)]
    k = draw(st.integers(0, len(args) - 1))
    a = np.asarray(args[k])
    if kind == "rank":
        args[k] = a[..., None] if draw(st.booleans()) or a.ndim == 0 else a.reshape(-1)[:0] if a.ndim == 1 else a[0]
    elif kind == "dtype":
        others = [t for t in FLOAT_TYPES + INT_TYPES + (S.BOOL,) if t.numpy_name != a.dtype.name]
        args[k] = a.astype(draw(st.sampled_from(others)).numpy_name)
        if a.ndim == 0 and draw(st.booleans()):
            args[k] = draw(st.sampled_from(["1.5", None, [1, 2], 1j, object()]))
    elif kind == "size":
        if a.ndim == 0:
            args[k] = np.zeros((2,), a.dtype)
        else:
            shape = list(a.shape)
            d = draw(st.integers(0, a.ndim - 1))
            shape[d] += draw(st.sampled_from([1, 2, -1])) if shape[d] > 0 else 1
            args[k] = np.zeros(tuple(max(s, 0) for s in shape), a.dtype)
    elif kind == "count":
        args = args[:-1] if draw(st.booleans()) else args + [a]
    elif kind == "kind":
        args[k] = draw(st.sampled_from(["not an array", None, {"a": 1}, [[1.0, 2.0]], (1,), b"xy"]))
    elif kind == "noncontig_bad":
        args[k] = np.asfortranarray(a).astype(">f8") if a.ndim else np.float16(1)
    elif " L) ->" in prog.source:
        # the lookup table (always the last parameter) indexes far out of range
        table = np.asarray(args[-1])
        args[-1] = np.full(table.shape, 10**6, table.dtype)
    else:
        kind = "reversed"  # no table: reversed values, still valid (success is allowed too)
        args[k] = a[::-1].copy() if a.ndim else a
    return kind, args


@st.composite
def invalid_cases(draw) -> Case:
    """A mutated program or mutated arguments of a valid program (see the module docstring)."""
    prog = draw(programs())
    if draw(st.integers(0, 9)) < 6:
        kind, src = _mutate_source(draw, prog.source)
        return Case(f"source:{kind}", src, list(prog.args))
    kind, args = _mutate_args(draw, prog)
    return Case(f"args:{kind}", prog.source, args)


# ----------------------------------------------------------------------------- standard kernels

# (name, source template with {t} for the dtype and {s} for a stride, inputs as (name, dims),
#  output shape as a function of the sizes and the stride, reduction length as a function)
KERNELS = [
    ("matmul", "C(m, n) +=! A(m, k) * B(k, n)", [("A", "MK"), ("B", "KN")],
     lambda z, s: (z["M"], z["N"]), lambda z, s: z["K"]),
    ("matmul_tn", "C(m, n) +=! A(k, m) * B(k, n)", [("A", "KM"), ("B", "KN")],
     lambda z, s: (z["M"], z["N"]), lambda z, s: z["K"]),
    ("matmul_nt", "C(m, n) +=! A(m, k) * B(n, k)", [("A", "MK"), ("B", "NK")],
     lambda z, s: (z["M"], z["N"]), lambda z, s: z["K"]),
    ("bmm", "C(b, m, n) +=! A(b, m, k) * B(b, k, n)", [("A", "PMK"), ("B", "PKN")],
     lambda z, s: (z["P"], z["M"], z["N"]), lambda z, s: z["K"]),
    ("gemv", "C(m) +=! A(m, k) * B(k)", [("A", "MK"), ("B", "K")],
     lambda z, s: (z["M"],), lambda z, s: z["K"]),
    ("conv", "C(n, o, h, w) +=! A(n, c, {s} * h + kh, {s} * w + kw) * B(o, c, kh, kw)",
     [("A", "PKHW"), ("B", "MKRS")],
     lambda z, s: (z["P"], z["M"], (z["H"] - z["R"]) // s + 1, (z["W"] - z["S"]) // s + 1),
     lambda z, s: z["K"] * z["R"] * z["S"]),
    ("conv_nhwc", "C(n, h, w, o) +=! A(n, {s} * h + kh, {s} * w + kw, c) * B(kh, kw, c, o)",
     [("A", "PHWK"), ("B", "RSKM")],
     lambda z, s: (z["P"], (z["H"] - z["R"]) // s + 1, (z["W"] - z["S"]) // s + 1, z["M"]),
     lambda z, s: z["K"] * z["R"] * z["S"]),
    # padded: the guard around the product (the padding adds nothing) or around the image's read
    # (it adds 0 x the weight: NaN for an inf weight); float weights hold inf and NaN at times
    ("conv_padded", "C(n, o, h, w) +=! ((h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W) "
     "? A(n, c, h + kh - 1, w + kw - 1) * B(o, c, kh, kw) : 0) where h in 0:H, w in 0:W, kh in 0:R, kw in 0:S",
     [("A", "PKHW"), ("B", "MKRS")],
     lambda z, s: (z["P"], z["M"], z["H"], z["W"]), lambda z, s: z["K"] * z["R"] * z["S"]),
    ("conv_padded_image", "C(n, o, h, w) +=! ((h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W) "
     "? A(n, c, h + kh - 1, w + kw - 1) : 0) * B(o, c, kh, kw) where h in 0:H, w in 0:W, kh in 0:R, kw in 0:S",
     [("A", "PKHW"), ("B", "MKRS")],
     lambda z, s: (z["P"], z["M"], z["H"], z["W"]), lambda z, s: z["K"] * z["R"] * z["S"]),
    ("maxpool", "C(n, h, w) max=! A(n, {s} * h + kh, {s} * w + kw) where kh in 0:R, kw in 0:S",
     [("A", "PHW"), ("B", "RS")],
     lambda z, s: (z["P"], (z["H"] - z["R"]) // s + 1, (z["W"] - z["S"]) // s + 1),
     lambda z, s: z["R"] * z["S"]),
    ("rowsum_scaled", "C(m) +=! A(m, k) * B(k) / {t}(K)", [("A", "MK"), ("B", "K")],
     lambda z, s: (z["M"],), lambda z, s: z["K"]),
    ("colmax", "C(n) max=! A(k, n) + B(k)", [("A", "KN"), ("B", "K")],
     lambda z, s: (z["N"],), lambda z, s: z["K"]),
]


@st.composite
def kernel_programs(draw, name: str = "f") -> GenProgram:
    """A standard kernel (matmul and variants, conv NCHW/NHWC, padded convolutions whose weights
    may hold inf and NaN, pooling, row/column reductions) with random sizes up to ~70, dtype,
    stride and schedule options: the nests the schedule's
    tiling, register blocking, vectorization and parallelization work on."""
    kname, body, inputs, shape_of, length_of = draw(st.sampled_from(KERNELS))
    t = draw(st.sampled_from((S.FLOAT32, S.FLOAT32, S.FLOAT64, S.FLOAT16, S.INT32, S.INT64, S.INT16)))
    stride = draw(st.sampled_from((1, 2)))
    small = {"R", "S"}
    z = {}
    for letter in sorted({c for _, dims in inputs for c in dims}):
        z[letter] = draw(st.integers(1, 4)) if letter in small else draw(st.integers(1, 70))
    for a, b in (("H", "R"), ("W", "S")):  # windows must fit
        if a in z:
            z[a] = max(z[a], z[b])
    body = body.format(t=t.tc_name, s=stride)
    if t.is_float and draw(st.integers(0, 3)) == 0:  # a float32 literal scale, also in double kernels
        body = body.replace("=! ", f"=! {draw(st.sampled_from(['0.1', '0.17677669', '-0.3']))} * ", 1)
    params = ", ".join(f"{t.tc_name}({', '.join(dims)}) {n}" for n, dims in inputs)
    source = f"def {name}({params}) -> (C) {{\n    {body}\n}}\n"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    args = [random_array(rng, t, tuple(z[c] for c in dims)) for _, dims in inputs]
    if kname.startswith("conv_padded") and t.is_float:
        for _ in range(draw(st.sampled_from([0, 1, 2]))):  # inf and NaN weights
            args[1].flat[draw(st.integers(0, args[1].size - 1))] = draw(st.sampled_from([np.inf, -np.inf, np.nan]))
    shape = shape_of(z, stride)
    volume = int(np.prod(shape)) * length_of(z, stride)
    return GenProgram(source, name, args, ["C"], {"C": shape}, length_of(z, stride), False,
                      {k: v for k, v in z.items()}, draw(schedule_options()), volume,
                      draw(st.integers(0, 3)) == 0)


# ----------------------------------------------------------------------------- the probe's categories

# Names that are keywords of a language a name passes through (isl, C, C++, Python, libm) or
# of tcpy's generated C, and that TC accepts as identifiers (issue 15, item 2).
KEYWORD_NAMES = ("nan", "NaN", "NAN", "Nan", "and", "or", "not", "implies", "mod", "floord", "ceild",
                 "true", "false", "True", "False", "infty", "infinity", "INFINITY", "rat", "exists_",
                 "int", "char", "while", "for", "return", "static", "restrict", "auto", "register",
                 "NULL", "I", "errno", "main", "class", "new", "delete", "this", "template", "xor",
                 "lambda", "None", "self", "yield", "import", "err", "tcpy_err", "c0", "x0", "t_A",
                 "sin_", "y0_", "half_", "S0", "domain", "schedule", "omp", "asm")
_GENERATED_NAMES = ("M", "N", "K", "P", "i", "j", "l", "k", "q", "r", "s", "t", "u", "v", "w",
                    "A", "B", "C", "L", "O0", "O1", "O2", "T0", "T1", "T2")


@st.composite
def renamed_programs(draw) -> GenProgram:
    """A valid program whose sizes, index variables and tensors are renamed to keywords."""
    import re

    prog = draw(programs())
    present = [n for n in _GENERATED_NAMES if re.search(rf"\b{n}\b", prog.source)]
    new = draw(st.lists(st.sampled_from(KEYWORD_NAMES), min_size=len(present), max_size=len(present),
                        unique=True))
    mapping = dict(zip(present, new))
    source = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b", lambda m: mapping.get(m.group(0), m.group(0)),
                    prog.source)
    return GenProgram(source, prog.name, prog.args, [mapping.get(o, o) for o in prog.outputs],
                      {mapping.get(o, o): s for o, s in prog.shapes.items()}, prog.reduction_length,
                      prog.bad_table, prog.sizes, None, prog.volume, prog.use_out)


@st.composite
def stress_cases(draw) -> Case:
    """Programs at the edges: many statements, deep nesting, high rank, zero and one sizes,
    huge constants, long names, many parameters; arguments that fit them."""
    kind = draw(st.sampled_from(["chain", "nesting", "rank", "zero", "constant", "name", "params", "gather"]))
    f32 = np.float32
    if kind == "chain":
        n = draw(st.integers(2, 60))
        body = "\n".join(f"T{k}(i) = T{k - 1}(i) * 0.5 + {k}.0" for k in range(1, n))
        return Case("stress:chain", f"def f(float(N) A) -> (O) {{\nT0(i) = A(i)\n{body}\nO(i) = T{n - 1}(i)\n}}",
                    [np.arange(draw(st.integers(0, 5)), dtype=f32)])
    if kind == "nesting":
        depth = draw(st.integers(1, 260))
        op = draw(st.sampled_from(["(", "-(", "exp(", "max(1.0, "]))
        expr = op * depth + "A(i)" + ")" * depth
        return Case("stress:nesting", f"def f(float(N) A) -> (O) {{ O(i) = {expr} }}", [np.ones(3, f32)])
    if kind == "rank":
        rank = draw(st.integers(1, 34))
        dims = ", ".join(f"D{k}" for k in range(rank))
        idx = ", ".join(f"x{k}" for k in range(rank))
        shape = tuple(draw(st.sampled_from([1, 1, 2])) for _ in range(rank))
        return Case("stress:rank", f"def f(float({dims}) A) -> (O) {{ O({idx}) = A({idx}) + 1 }}",
                    [np.ones(shape if rank <= 32 else (1,) * 32, f32)])
    if kind == "zero":
        shape = (draw(st.sampled_from([0, 1, 3])), draw(st.sampled_from([0, 1, 4])))
        src = draw(st.sampled_from([
            "def f(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
            "def f(float(M,K) A, float(K,N) B) -> (C) { C(m, n) max=! A(m, k) + B(k, n) }",
            "def f(float(M,K) A, float(K,N) B) -> (C) { C(m, n) = A(m, 0) * B(0, n) }",
            "def f(float(M,K) A, int32(N) I) -> (C) { C(i, k) = A(I(i), k) }",
        ]))
        second = (shape[1], draw(st.sampled_from([0, 2]))) if "B" in src else (draw(st.sampled_from([0, 1, 2])),)
        args = [np.ones(shape, f32), np.ones(second, f32) if "B" in src else np.zeros(second, np.int32)]
        return Case("stress:zero", src, args)
    if kind == "constant":
        value = draw(st.sampled_from(["2147483647", "2147483648", "9223372036854775807", "1e308", "1e39",
                                      "0.0000001", "4294967296", "1" + "0" * draw(st.integers(19, 30))]))
        t = draw(st.sampled_from(["float", "double", "int32", "int64", "uint8"]))
        return Case("stress:constant", f"def f({t}(N) A) -> (O) {{ O(i) = A(i) + {value} }}",
                    [np.ones(3, np.dtype({"float": "float32", "double": "float64"}.get(t, t)))])
    if kind == "name":
        name = "a" * draw(st.integers(1, 3000))
        return Case("stress:name", f"def f(float(N) {name}) -> (O) {{ O(i) = {name}(i) }}", [np.ones(2, f32)])
    if kind == "params":
        n = draw(st.integers(1, 70))
        params = ", ".join(f"float(N) A{k}" for k in range(n))
        total = " + ".join(f"A{k}(i)" for k in range(n))
        return Case("stress:params", f"def f({params}) -> (O) {{ O(i) = {total} }}", [np.ones(2, f32)] * n)
    table = np.array(draw(st.lists(st.integers(-3, 6), min_size=0, max_size=4)), np.int32)
    return Case("stress:gather", "def f(float(N) A, int32(M) I) -> (O) { O(i) = A(I(i)) }",
                [np.arange(draw(st.integers(0, 4)), dtype=f32), table])


_JUNK_VALUES = (None, 0, -1, 1.5, 2**70, -2**70, "x", b"x", (), [], {}, object(), True, np.float32(1),
                np.int64(3), np.zeros(2), float("nan"), 1j)


@st.composite
def api_calls(draw):
    """(description, thunk): one call of the public API with hostile values. It must return or
    raise a TCError."""
    import tcpy

    src = "def f(float(N) A, float s) -> (O) { O(i) = A(i) * s }"
    junk = draw(st.sampled_from(_JUNK_VALUES))
    what = draw(st.sampled_from(["options", "define", "keyword", "out", "explain", "library", "autotune",
                                 "scalar", "specialize", "with_options"]))
    A = np.ones(3, np.float32)
    field = draw(st.sampled_from(["tile_sizes", "loop_order", "unroll", "num_threads", "parallel", "vectorize",
                                  "fast_math", "check_indices", "cflags", "register_tile", "target"]))
    calls = {
        "options": lambda: tcpy.Options(**{field: junk}),
        "define": lambda: tcpy.define(junk),
        "keyword": lambda: tcpy.define(src)(A, s=junk),
        "out": lambda: tcpy.define(src)(A, 2.0, out=junk),
        "explain": lambda: tcpy.define(src).explain(N=junk),
        "library": lambda: tcpy.define(src + "\n" + src.replace("def f", "def g"))[junk],
        "autotune": lambda: tcpy.autotune(tcpy.define(src), A, 2.0, options=junk, progress=False),
        "scalar": lambda: tcpy.define(src)(A, junk),
        "specialize": lambda: tcpy.define(src).c_source(junk),
        "with_options": lambda: tcpy.define(src, options=junk),
    }
    return f"{what}({field if what == 'options' else ''}={junk!r})", calls[what]


@st.composite
def cli_arguments(draw, files: dict) -> list:
    """A command line for ``tcpy.cli.main`` built from valid and hostile pieces; ``files`` maps
    "good", "bad", "binary", "missing" to paths."""
    command = draw(st.sampled_from(["check", "explain", "emit", "tune", "cache", "nonsense", "--version"]))
    argv = [command]
    if command in ("check", "explain", "emit", "tune"):
        argv.append(files[draw(st.sampled_from(["good", "good", "bad", "binary", "missing"]))])
    pieces = [["--sizes", draw(st.sampled_from(["M=4,N=3,K=2", "M=0,N=0,K=0", "M=-1,N=2,K=2", f"M={10**40},N=1,K=1",
                                               "M=x", "M=4", "", ",,,", "M=4,N=3,K=2,Q=1"]))],
              ["--name", draw(st.sampled_from(["mm", "zz", ""]))],
              ["--threads", draw(st.sampled_from(["0", "-3", "2", "x", str(10**9)]))],
              ["--tile", draw(st.sampled_from(["m=4", "m=-1", "zz=4", "m", "m=99999999999999999999"]))],
              ["--order", draw(st.sampled_from(["m,n,k", "q", ",", "m,m"]))],
              ["--no-parallel"], ["--fast-math"], ["-o", files["missing"] + "/x.c"], ["--repeat", "0"],
              [draw(st.sampled_from(["info", "clear", "bogus"]))]]
    for piece in draw(st.lists(st.sampled_from(pieces), max_size=4)):
        argv += piece
    return argv
