"""A checked Tiny IR graph as the source of one TC def.

Movement ops never copy: walking from a consumer to its sources, each movement op rewrites the
index expressions it is read at (RESHAPE by floor division and modulo, kept only where an
axis is really split or merged; PERMUTE, EXPAND, SHRINK, FLIP, VIEW and POOL affinely) and PAD
wraps the read in a guard ``cond ? X(...) : value``. Element-wise ops become expressions. A
value becomes a tensor of its own (a TC statement) only where it must: a REDUCE (a reduction
statement in its accumulation dtype), an output, or a computed value that several consumers
read (so it is computed once, as a hand-written TC would name it). Temporaries drop axes of
size 1, so a naive graph's index maps come out as the plain affine reads the contraction
engine and the fusion pass recognise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sympy

from ..lang.builtins import BUILTINS
from ..lang.parser import KEYWORDS
from ..lang.types import ScalarType
from ..lang.writer import LiteralError, cast, def_source, fresh_name, literal, read, statement
from .errors import DtypeMismatch, ExcessivePiecewise, TinyIRError
from .graph import MOVEMENT, Graph, Node, provably_nonnegative, reshape_groups, same, view_axis

# bf16 values are computed and returned as float32 (tcpy has no bfloat16 type)
SCALAR_TYPES = {"fp16": ScalarType.FLOAT16, "bf16": ScalarType.FLOAT32, "fp32": ScalarType.FLOAT32,
                "i32": ScalarType.INT32, "bool": ScalarType.BOOL}
_BINARY = {"ADD": "+", "SUB": "-", "MUL": "*", "FDIV": "/"}
_REDUCTIONS = {"SUM": "+=", "MAX": "max=", "MIN": "min="}
MAX_PIECEWISE = 16


@dataclass(frozen=True)
class _Context:
    """How a value is being computed: ``widen`` evaluates fp16 arithmetic in float (inside a
    REDUCE whose accumulation dtype is wider); ``guards`` counts the PAD guards above."""

    widen: bool = False
    guards: int = 0


class _Lowering:
    """The statements of one def for a checked graph: which values are tensors, and the TC
    expression of every other value at the index it is read at."""

    def __init__(self, graph: Graph, name: str, max_piecewise: int):
        self.graph = graph
        self.nodes = graph.nodes
        self.max_piecewise = max_piecewise
        self.taken = set(KEYWORDS) | set(BUILTINS)
        self.tensor_names = {}
        for nid in graph.inputs:
            tensor = self.nodes[nid].params["tensor_id"]
            if tensor in self.taken:
                raise TinyIRError(nid, f"tensor_id {tensor!r} is a reserved word of TC; rename it")
            self.tensor_names[nid] = tensor
            self.taken.add(tensor)
        self.size_names = {s: fresh_name(s.name, self.taken) for s in graph.size_symbols}
        self.name = name
        self.statements: list[str] = []
        self.stored: dict[str, tuple[str, tuple[int, ...]]] = {}  # node -> (tensor, axes kept)
        self.loop_extents: dict[sympy.Symbol, object] = {}
        self.uses = self.count_uses()
        self.output_names = {self.value_of(o): o for o in graph.outputs}  # value node -> output id

    # -- which values are tensors --------------------------------------------------------------

    def count_uses(self) -> dict[str, int]:
        """Reads of each computed value, movement ops seen through (they are free)."""
        uses: dict[str, int] = {}
        for node in self.nodes.values():
            for s in node.sources():
                while self.nodes[s].uop in MOVEMENT:
                    s = self.nodes[s].src[0]
                uses[s] = uses.get(s, 0) + 1
        return uses

    def value_of(self, nid: str) -> str:
        """The node whose tensor an output can be: seen through CASTs to the same dtype of
        values nothing else reads (an fp32 GEMM's final CAST then copies nothing)."""
        node = self.nodes[nid]
        while (node.uop == "CAST" and node.dtype == self.nodes[node.src[0]].dtype
               and self.uses.get(node.src[0]) == 1 and self.nodes[node.src[0]].uop != "INPUT"
               and node.src[0] not in self.graph.outputs):
            node = self.nodes[node.src[0]]
        return node.id

    def cheap(self, nid: str) -> bool:
        """Reads, movement, casts and negations only: recomputing is cheaper than storing."""
        node = self.nodes[nid]
        if node.uop in ("INPUT", *MOVEMENT, "CAST", "NEG"):
            return all(self.cheap(s) for s in node.sources())
        return False

    def must_store(self, nid: str) -> bool:
        node = self.nodes[nid]
        return (node.uop == "REDUCE" or nid in self.output_names
                or (node.uop != "INPUT" and self.uses.get(nid, 0) > 1 and not self.cheap(nid)))

    # -- the def -------------------------------------------------------------------------------

    def run(self) -> str:
        for nid, node in self.nodes.items():
            if node.uop != "INPUT" and self.must_store(nid):
                self.store(node)
        params = [(SCALAR_TYPES[self.nodes[n].dtype], [self.size(d, n) for d in self.nodes[n].shape],
                   self.tensor_names[n]) for n in self.graph.inputs]
        outputs = []
        for nid in self.graph.outputs:
            value = self.value_of(nid)
            if value not in self.stored:  # an output that is an input: copy it
                self.store(self.nodes[value])
            outputs.append(self.stored[value][0])
        return def_source(self.name, params, outputs, self.statements)

    def store(self, node: Node) -> None:
        """Emit the statement(s) that compute ``node`` into a tensor of its own."""
        nid = node.id
        output = self.output_names.get(nid)
        keep = tuple(k for k, d in enumerate(node.shape) if output or d != 1)
        name = output or nid
        tensor = fresh_name(name if name.isidentifier() else "t", self.taken)
        self.loop_extents = {}
        taken = set()
        lhs = {k: self.loop_var(node.shape[k], taken) for k in keep}
        ranges = [(v, node.shape[k]) for k, v in lhs.items()]
        if node.uop == "REDUCE":
            x = self.nodes[node.src[0]]
            axes = node.params["axes"]
            out_axes = [k for k in range(len(x.shape)) if k not in axes]
            index: list = [sympy.Integer(0)] * len(x.shape)
            for k_out, k_in in enumerate(out_axes):
                if k_out in lhs:
                    index[k_in] = lhs[k_out]
            for k in axes:
                if x.shape[k] != 1:
                    index[k] = self.loop_var(x.shape[k], taken)
                    ranges.append((index[k], x.shape[k]))
            widen = x.dtype == "fp16" and node.dtype in ("fp32", "bf16")
            text, tc_type = self.value(x.id, index, _Context(widen=widen))
            rhs = _convert(text, tc_type, SCALAR_TYPES[node.dtype])
            op = _REDUCTIONS[node.params["op"]]
            init = node.params["init"]
            if init is not None:
                start = _literal(init, node.dtype, SCALAR_TYPES[node.dtype], nid)
                self.emit(tensor, lhs, "=", start, ranges[:len(lhs)])
                self.emit(tensor, lhs, op, rhs, ranges)
            else:
                self.emit(tensor, lhs, op + "!", rhs, ranges)
        else:
            index = [lhs.get(k, sympy.Integer(0)) for k in range(len(node.shape))]
            text, tc_type = self.value(nid, index, _Context())
            self.emit(tensor, lhs, "=", _convert(text, tc_type, SCALAR_TYPES[node.dtype]), ranges)
        self.stored[nid] = (tensor, keep)

    def emit(self, tensor, lhs, op, rhs, ranges) -> None:
        rhs = _unwrap(rhs)
        target = read(tensor, [str(v) for v in lhs.values()])
        self.statements.append(statement(target, op, rhs, [(str(v), self.size(e, None)) for v, e in ranges]))

    def loop_var(self, extent, taken: set) -> sympy.Symbol:
        """A fresh index variable for an axis, named after its size symbol when it has one."""
        name = self.graph.names.get(extent, str(extent) if extent.is_Symbol else "i")
        base = name.lower() if name.isidentifier() else "i"
        name, k = base, 0
        while name in taken or name in self.taken:
            k += 1
            name = f"{base}{k}"
        taken.add(name)
        var = sympy.Symbol(name, integer=True, nonnegative=True)
        self.loop_extents[var] = extent
        return var

    # -- values --------------------------------------------------------------------------------

    def value(self, nid: str, index, ctx: _Context) -> tuple[str, ScalarType]:
        """``(TC expression, its scalar type)`` of node ``nid`` at ``index``."""
        if nid in self.stored:
            tensor, keep = self.stored[nid]
            text = read(tensor, [self.render(index[k]) for k in keep])
            return self.widened(text, self.nodes[nid].dtype, ctx)
        if self.nodes[nid].uop == "INPUT":
            tensor = self.tensor_names[nid]
            text = read(tensor, [self.render(i) for i in index])
            return self.widened(text, self.nodes[nid].dtype, ctx)
        return self.compute(self.nodes[nid], index, ctx)

    @staticmethod
    def widened(text, dtype, ctx) -> tuple[str, ScalarType]:
        tc_type = SCALAR_TYPES[dtype]
        if ctx.widen and tc_type is ScalarType.FLOAT16:
            return cast(text, ScalarType.FLOAT32), ScalarType.FLOAT32
        return text, tc_type

    def compute(self, node: Node, index, ctx: _Context) -> tuple[str, ScalarType]:
        if node.uop in MOVEMENT:
            return self.move(node, index, ctx)
        tc_type = ScalarType.FLOAT32 if ctx.widen and node.dtype == "fp16" else SCALAR_TYPES[node.dtype]
        operands = []
        for s in node.src:
            if isinstance(s, str):
                src = self.nodes[s]
                operands.append(self.value(s, _broadcast_index(index, node.shape, src.shape), ctx))
            else:
                operands.append((_literal(s, node.dtype, tc_type, node.id), tc_type))
        if node.uop == "CAST":
            (text, src_type), to = operands[0], SCALAR_TYPES[node.dtype]
            return _convert(text, src_type, to), to
        if node.uop == "WHERE":
            (cond, _), (a, a_type), (b, b_type) = operands
            return f"({cond} ? {_convert(a, a_type, tc_type)} : {_convert(b, b_type, tc_type)})", tc_type
        args = [_convert(text, operand_type, tc_type) for text, operand_type in operands]
        if node.uop in _BINARY:
            return f"({args[0]} {_BINARY[node.uop]} {args[1]})", tc_type
        if node.uop in ("MAX", "MIN"):
            return f"{node.uop.lower()}({_unwrap(args[0])}, {_unwrap(args[1])})", tc_type
        if node.uop == "NEG":
            return f"(-{args[0]})", tc_type
        if node.uop == "RELU":
            return f"max({_unwrap(args[0])}, {_literal(0, node.dtype, tc_type, node.id)})", tc_type
        # EXP2, RSQRT: TC's builtins compute in float
        return _convert(f"{node.uop.lower()}({_unwrap(args[0])})", ScalarType.FLOAT32, tc_type), tc_type

    def move(self, node: Node, index, ctx: _Context) -> tuple[str, ScalarType]:
        """Read the source of a movement op at the index its result is read at."""
        x = self.nodes[node.src[0]]
        p = node.params
        conds = []
        if node.uop == "RESHAPE":
            inner = self.reshape_index(x.shape, node.shape, index)
        elif node.uop == "PERMUTE":
            inner = [None] * len(index)
            for k, axis in enumerate(p["perm"]):
                inner[axis] = index[k]
        elif node.uop == "EXPAND":
            lead = len(node.shape) - len(x.shape)
            inner = [sympy.Integer(0) if d == 1 else index[lead + k] for k, d in enumerate(x.shape)]
        elif node.uop == "PAD":
            if any(i.has(sympy.floor, sympy.Mod) for i in index):
                # TC analyses guards without divisions only: read a stored copy of the padding
                return self.value(self.stored_copy(node), index, ctx)
            inner = []
            for i, d, (lo, hi) in zip(index, x.shape, p["pad"]):
                inner.append(i - lo)
                low, high = self.bounds(i)
                if lo and not provably_nonnegative(low - lo):
                    conds.append(f"{self.render(i)} >= {lo}")
                if hi and not provably_nonnegative(d + lo - 1 - high):
                    conds.append(f"{self.render(i)} < {self.size(d + lo, node.id)}")
        elif node.uop == "SHRINK":
            inner = [lo + step * i for i, lo, step in zip(index, p["lo"], p["step"])]
        elif node.uop == "FLIP":
            inner = [d - 1 - i if k in p["axes"] else i for k, (i, d) in enumerate(zip(index, x.shape))]
        elif node.uop == "VIEW":
            subs = {view_axis(k): i for k, i in enumerate(index)}
            inner = [e.xreplace(subs) for e in p["index_map"]]
        else:  # POOL: [..., windows..., kernel...] reads [..., window * stride + tap * dilation]
            n = len(p["stride"])
            lead = len(x.shape) - n
            inner = list(index[:lead]) + [index[lead + j] * s + index[lead + n + j] * d
                                          for j, (s, d) in enumerate(zip(p["stride"], p["dilation"]))]
        inner = [self.simplify(sympy.expand(e)) for e in inner]
        pieces = ctx.guards + len(conds) + sum(len(e.atoms(sympy.floor, sympy.Mod)) for e in inner)
        if pieces > self.max_piecewise:
            raise ExcessivePiecewise(node.id, f"a read through this {node.uop} is split into {pieces} "
                                              f"pieces (guards and floor divisions), more than the "
                                              f"limit of {self.max_piecewise}")
        sub = _Context(ctx.widen, ctx.guards + len(conds))
        text, tc_type = self.value(x.id, inner, sub)
        if not conds:
            return text, tc_type
        return f"({' && '.join(conds)} ? {text} : {_literal(p['value'], x.dtype, tc_type, node.id)})", tc_type

    def stored_copy(self, node: Node) -> str:
        """Store ``node`` as a temporary (outside the statement being built); its id."""
        if node.id not in self.stored:
            extents = self.loop_extents
            self.store(node)
            self.loop_extents = extents
        return node.id

    def reshape_index(self, src, out, index) -> list:
        """Source indices of a RESHAPE: unchanged across axes that match one to one, floor
        division and modulo only where axes are merged or split."""
        groups = reshape_groups(src, out, lambda a, b, first: same(a, b))
        if groups is None:  # no finer alignment: one group of all axes
            groups = [([k for k, d in enumerate(src) if d != 1], [k for k, d in enumerate(out) if d != 1])]
        inner: list = [sympy.Integer(0)] * len(src)
        for gi, go in groups:
            linear = sympy.Integer(0)
            for k in go:
                linear = linear * out[k] + index[k]
            for pos, k in enumerate(gi):
                stride = sympy.Mul(*(src[j] for j in gi[pos + 1:]))
                value = sympy.floor(linear / stride) if stride != 1 else linear
                inner[k] = value if pos == 0 else sympy.Mod(value, src[k])
        return inner

    # -- index arithmetic ----------------------------------------------------------------------

    def bounds(self, expr):
        """``(lo, hi)`` of an index expression over the loop ranges, or ``(None, None)``."""
        if expr.is_Integer:
            return expr, expr
        if expr in self.loop_extents:
            return sympy.Integer(0), self.loop_extents[expr] - 1
        if expr.is_Symbol:
            return expr, expr
        if expr.is_Add:
            parts = [self.bounds(a) for a in expr.args]
            if any(lo is None for lo, _ in parts):
                return None, None
            return sympy.Add(*(lo for lo, _ in parts)), sympy.Add(*(hi for _, hi in parts))
        if expr.is_Mul:
            coeff, rest = expr.as_coeff_Mul()
            lo, hi = sympy.Integer(1), sympy.Integer(1)
            for f in sympy.Mul.make_args(rest):
                flo, fhi = self.bounds(f)
                if flo is None or not provably_nonnegative(flo):
                    return None, None
                lo, hi = lo * flo, hi * fhi
            return (coeff * lo, coeff * hi) if coeff >= 0 else (coeff * hi, coeff * lo)
        if isinstance(expr, sympy.floor):
            lo, hi = self.bounds(expr.args[0])
            return (None, None) if lo is None else (sympy.floor(lo), sympy.floor(hi))
        if isinstance(expr, sympy.Mod):
            return sympy.Integer(0), expr.args[1] - 1
        return None, None

    def within(self, expr, divisor) -> bool:
        """Whether ``0 <= expr < divisor`` on the whole domain."""
        lo, hi = self.bounds(expr)
        return lo is not None and provably_nonnegative(lo) and provably_nonnegative(divisor - 1 - hi)

    def split(self, expr, divisor):
        """``expr`` as ``quotient * divisor + rest`` with the terms ``divisor`` divides."""
        quotient, rest = sympy.Integer(0), sympy.Integer(0)
        for term in sympy.Add.make_args(sympy.expand(expr)):
            q = sympy.cancel(term / divisor)
            if q.is_polynomial(*q.free_symbols) and sympy.fraction(sympy.together(q))[1] == 1:
                quotient += q
            else:
                rest += term
        return quotient, rest

    def simplify(self, expr):
        """Drop floor divisions and modulos that the loop ranges make exact (x // N where
        0 <= x < N is 0; (q*N + r) % N is r)."""
        if not expr.args or expr.is_Symbol or expr.is_Number:
            return expr
        args = [self.simplify(a) for a in expr.args]
        if isinstance(expr, sympy.floor):
            num, den = sympy.fraction(sympy.together(args[0]))
            quotient, rest = self.split(num, den)
            if self.within(rest, den):
                return quotient
            return sympy.floor(args[0])
        if isinstance(expr, sympy.Mod):
            quotient, rest = self.split(args[0], args[1])
            return rest if self.within(rest, args[1]) else sympy.Mod(rest, args[1])
        if expr.is_Add:
            return _undo_division(sympy.Add(*args))
        return expr.func(*args)

    def render(self, expr) -> str:
        """TC text of an index expression (sums of integer multiples, ``/`` and ``%``)."""
        return _render(expr, self.size_names)

    def size(self, expr, nid: Optional[str]) -> str:
        """TC text of a size expression; TC needs them affine in the size variables."""
        if not _affine(expr):
            raise TinyIRError(nid, f"size {expr} is not affine in the input sizes, which TC ranges "
                                   f"need; give the symbols values with sizes=")
        return _render(expr, self.size_names)


def _undo_division(expr):
    """``k*c*floor(x/c) + k*(x % c)`` is ``k*x``: a merge undone by a split."""
    terms = list(sympy.Add.make_args(expr))
    for t in terms:
        k, mod = t.as_coeff_Mul()
        if not isinstance(mod, sympy.Mod):
            continue
        x, c = mod.args
        partner = k * c * sympy.floor(x / c)
        if partner in terms:
            terms.remove(t)
            terms.remove(partner)
            return _undo_division(sympy.Add(*terms) + k * x)
    return expr


def _affine(expr) -> bool:
    if expr.is_Number or expr.is_Symbol:
        return True
    if expr.is_Add:
        return all(_affine(a) for a in expr.args)
    if expr.is_Mul:
        return sum(not a.is_Number for a in expr.args) <= 1 and all(_affine(a) for a in expr.args)
    if isinstance(expr, sympy.floor):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        return den.is_Integer and _affine(sympy.expand(num))
    return False


def _render(expr, names) -> str:
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return names.get(expr, expr.name)
    if expr.is_Add:
        terms = sorted(expr.args, key=lambda t: (t.is_Number, bool(t.as_coeff_Mul()[0] < 0), str(t)))
        out = _render(terms[0], names)
        for t in terms[1:]:
            coeff, rest = t.as_coeff_Mul()
            if coeff < 0:
                out += f" - {_render(-t, names)}"
            else:
                out += f" + {_render(t, names)}"
        return out
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        factors = [_render_factor(f, names) for f in sympy.Mul.make_args(rest)]
        if coeff == -1:
            return "-" + "*".join(factors)
        return "*".join(([str(coeff)] if coeff != 1 else []) + factors)
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return "*".join([_render_factor(expr.base, names)] * int(expr.exp))
    if isinstance(expr, sympy.floor):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        return f"({_render(sympy.expand(num), names)}) / {_render_factor(den, names)}"
    if isinstance(expr, sympy.Mod):
        return f"({_render(expr.args[0], names)}) % {_render_factor(expr.args[1], names)}"
    raise TinyIRError(None, f"cannot write {expr} as a TC index expression")


def _render_factor(expr, names) -> str:
    text = _render(expr, names)
    return f"({text})" if expr.is_Add or isinstance(expr, (sympy.floor, sympy.Mod)) else text


def _broadcast_index(index, shape, src_shape) -> list:
    """The index of a right-aligned broadcast operand (axes of size 1 read element 0)."""
    lead = len(shape) - len(src_shape)
    return [sympy.Integer(0) if d == 1 and shape[lead + k] != 1 else index[lead + k]
            for k, d in enumerate(src_shape)]


def _literal(value, dtype: str, tc_type: ScalarType, node: Optional[str] = None) -> str:
    """A number as a TC expression of type ``tc_type`` (``dtype``: the Tiny IR dtype it stands for;
    ``node``: whose immediate it is)."""
    if tc_type is ScalarType.INT32 and float(value) != int(value):
        raise DtypeMismatch(node, f"the immediate {value!r} is not an integer, as {dtype} needs")
    try:
        return literal(value, tc_type)
    except LiteralError as err:
        raise TinyIRError(node, f"immediate of a {dtype} value: {err}") from None


def _unwrap(text: str) -> str:
    """``text`` without parentheses around the whole of it."""
    depth = 0
    for k, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0 and k < len(text) - 1:
            return text
    return text[1:-1] if text.startswith("(") else text


def _convert(text: str, tc_type: ScalarType, to: ScalarType) -> str:
    """``text`` (of type ``tc_type``) as a ``to`` value."""
    return text if tc_type is to else cast(_unwrap(text), to)


def to_tc(graph: Graph, name: str = "tinyir", max_piecewise: int = MAX_PIECEWISE) -> str:
    """The TC source of one def that computes ``graph``'s outputs from its inputs.

    Raises :class:`~tcpy.tinyir.ExcessivePiecewise` when a read would be split into more than
    ``max_piecewise`` pieces (PAD guards plus floor divisions and modulos of its indices).
    """
    if not name.isidentifier():
        raise TinyIRError(None, f"the def name must be an identifier, got {name!r}")
    return _Lowering(graph, name, max_piecewise).run()
