"""Tiny IR programs (seed ``004_*``) read and checked: node kinds, dtypes and symbolic shapes.

:func:`check` turns a program (the ``{"uops": [...]}`` dict) into a :class:`Graph` of
:class:`Node` values in dependency order, each with its shape (sympy expressions over size
symbols) and dtype, and its ``arg`` normalised into ``params``. Every rule the spec states is
checked here and reported with the spec's error names (:mod:`.errors`).

Symbols in shapes are resolved in this order: a value given in ``sizes`` (an int); a dimension
of an INPUT (a size variable of the generated def); else an *unknown*, bound by the first
equation that fixes it (a RESHAPE axis that must equal one source axis, an EXPAND axis that
must equal its source). Two input size symbols that a RESHAPE needs equal are unified (the
generated def names both dimensions alike, so the call checks them).
"""
from __future__ import annotations

import ast as pyast
import math
import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional

import sympy

from .errors import (AccDtypeMissing, AxisSizeMismatch, BroadcastMismatch, DtypeMismatch,
                     InvalidPermutation, TinyIRError)

DTYPES = ("fp16", "bf16", "fp32", "i32", "bool")
FLOATS = ("fp16", "bf16", "fp32")
MOVEMENT = ("RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "VIEW", "POOL")
UNARY = ("NEG", "EXP2", "RELU", "RSQRT", "CAST")
BINARY = ("ADD", "SUB", "MUL", "FDIV", "MAX", "MIN")
FLOAT_ONLY = ("FDIV", "EXP2", "RSQRT")
REDUCE_OPS = ("SUM", "MAX", "MIN")
_IDENT = re.compile(r"[_A-Za-z][_A-Za-z0-9]*\Z")


@dataclass(frozen=True)
class Node:
    """One checked UOp: ``src`` holds node ids (str) and immediates (numbers), ``params`` the
    normalised ``arg`` (axes as ints, pads as sympy values, ...)."""

    id: str
    uop: str
    src: tuple
    params: Mapping[str, object]
    shape: tuple
    dtype: str

    def sources(self) -> tuple[str, ...]:
        """The node ids among ``src`` (immediates left out)."""
        return tuple(s for s in self.src if isinstance(s, str))


@dataclass(frozen=True)
class Graph:
    """A checked program: nodes in dependency order, its INPUT and output node ids, the size
    symbols the inputs bind (in order of first appearance), and the names of the symbols that
    shapes bound to size expressions (``{expression: "Oy"}``, for readable index names)."""

    nodes: Mapping[str, Node]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    size_symbols: tuple[sympy.Symbol, ...]
    names: Mapping[object, str]

    def __repr__(self) -> str:
        return (f"<tinyir.Graph of {len(self.nodes)} nodes: inputs {list(self.inputs)}, outputs "
                f"{list(self.outputs)}, sizes {[s.name for s in self.size_symbols]}>")


def size_symbol(name: str) -> sympy.Symbol:
    """The sympy symbol of a Tiny IR shape symbol (a positive integer)."""
    return sympy.Symbol(name, integer=True, positive=True)


def provably_nonnegative(expr) -> bool:
    """Whether ``expr`` (sizes positive integers, index variables non-negative) is >= 0."""
    expr = sympy.expand(expr)
    if expr.is_number:
        return bool(expr >= 0)
    return bool(expr.is_nonnegative)


def same(a, b) -> bool:
    """Whether two size expressions are provably equal."""
    return sympy.expand(a - b) == 0


def _divides(a, b) -> bool:
    """Whether ``a`` properly divides ``b`` (``b = a * q`` with ``q`` an integer polynomial > 1)."""
    q = sympy.cancel(b / a)
    if q.is_number:
        return bool(q.is_integer and q > 1)
    free = sorted(q.free_symbols, key=str)
    return q.is_polynomial(*free) and all(c.is_integer for c in sympy.Poly(q, *free).coeffs())


def reshape_groups(src, out, equal: Callable[[object, object, bool], bool]):
    """Align a RESHAPE's source and result axes into groups of equal element count.

    Returns ``[(source axes, result axes), ...]`` over the axes not of size 1, or None when no
    alignment exists. ``equal(a, b, first)`` compares (``first``: the group's first pair, where
    the checker may bind an unknown symbol).
    """
    ins = [k for k, d in enumerate(src) if d != 1]
    outs = [k for k, d in enumerate(out) if d != 1]
    groups, i, j = [], 0, 0
    while i < len(ins) or j < len(outs):
        if i == len(ins) or j == len(outs):
            return None
        gi, go = [ins[i]], [outs[j]]
        pi, po = src[ins[i]], out[outs[j]]
        i, j = i + 1, j + 1
        first = True
        while not equal(pi, po, first):
            first = False
            if j < len(outs) and _divides(po, pi):
                go.append(outs[j])
                po, j = po * out[outs[j]], j + 1
            elif i < len(ins) and _divides(pi, po):
                gi.append(ins[i])
                pi, i = pi * src[ins[i]], i + 1
            else:
                return None
        groups.append((gi, go))
    return groups


class _Checker:
    def __init__(self, program: Mapping, sizes: Mapping[str, int]):
        self.program = program
        self.values: dict[str, object] = {}
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TinyIRError(None, f"size {name!r} must be an int >= 0, got {value!r}")
            self.values[name] = sympy.Integer(value)
        self.unknown: dict[sympy.Symbol, str] = {}  # unknown symbol -> node that introduced it
        self.size_symbols: list[sympy.Symbol] = []
        self.subst: dict[sympy.Symbol, object] = {}
        self.nodes: dict[str, Node] = {}
        self.names: dict[object, str] = {}

    # -- symbols -------------------------------------------------------------------------------

    def norm(self, expr):
        return sympy.sympify(expr).xreplace(self.subst) if self.subst else sympy.sympify(expr)

    def bind(self, symbol, value):
        value = self.norm(value)
        self.subst = {k: v.xreplace({symbol: value}) for k, v in self.subst.items()}
        self.subst[symbol] = value
        if self.unknown.pop(symbol, None) is not None:
            self.names.setdefault(value, symbol.name)
        if symbol in self.size_symbols:
            self.size_symbols.remove(symbol)

    def equal(self, a, b, may_bind: bool, unify: bool = False) -> bool:
        """``a == b``, binding an unknown symbol (``may_bind``) or unifying two input size
        symbols (``unify``) when that makes it so."""
        a, b = self.norm(a), self.norm(b)
        if same(a, b):
            return True
        if may_bind:
            for x, y in ((a, b), (b, a)):
                if x in self.unknown:
                    self.bind(x, y)
                    return True
            if unify and a in self.size_symbols and b in self.size_symbols:
                self.bind(b, a)
                return True
        return False

    def dim(self, value, node: str, is_input: bool = False):
        """A shape entry (int or symbol name) as a sympy value."""
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TinyIRError(node, f"a shape entry must be an int or a symbol name, got {value!r}")
        if isinstance(value, int):
            if value < 1:  # TC ranges are never empty for constant sizes
                raise TinyIRError(node, f"a shape entry must be >= 1, got {value}")
            return sympy.Integer(value)
        if not _IDENT.match(value):
            raise TinyIRError(node, f"a shape symbol must be an identifier, got {value!r}")
        if value in self.values and self.values[value] == 0:
            raise TinyIRError(node, f"shape symbol {value!r} is 0; TC ranges are never empty")
        if value not in self.values:
            symbol = size_symbol(value)
            self.values[value] = symbol
            if is_input:
                self.size_symbols.append(symbol)
            else:
                self.unknown[symbol] = node
        return self.norm(self.values[value])

    def offset(self, value, node: str):
        """A position along an axis: an int >= 0 or a symbol."""
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return sympy.Integer(value)
        return self.dim(value, node)

    def integer(self, value, node: str, what: str, minimum: int = 0) -> int:
        """A parameter that must be a known int (a literal, or a symbol given in ``sizes``)."""
        if isinstance(value, int) and not isinstance(value, bool):
            expr = sympy.Integer(value)
        else:
            expr = self.norm(self.values[value]) if isinstance(value, str) and value in self.values else None
        if not isinstance(expr, sympy.Integer) or int(expr) < minimum:
            hint = f"; give {value!r} a value with sizes=" if isinstance(value, str) else ""
            raise TinyIRError(node, f"{what} must be an int >= {minimum}, got {value!r}{hint}")
        return int(expr)

    # -- the program ---------------------------------------------------------------------------

    def order(self) -> list[Mapping]:
        """The UOps in dependency order (sources first); ids unique, sources defined, no cycle."""
        uops = self.program.get("uops") if isinstance(self.program, Mapping) else None
        if not isinstance(uops, list) or not uops:
            raise TinyIRError(None, "a program is an object with a non-empty list 'uops'")
        by_id: dict[str, Mapping] = {}
        for raw in uops:
            if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str):
                raise TinyIRError(None, f"every UOp needs a string 'id', got {raw!r}")
            if raw["id"] in by_id:
                raise TinyIRError(raw["id"], "the id is used by two UOps")
            by_id[raw["id"]] = raw
        ordered, state = [], {}
        for root in by_id:
            stack = [(root, False)]
            while stack:
                nid, done = stack.pop()
                if done:
                    state[nid] = "done"
                    ordered.append(by_id[nid])
                    continue
                if state.get(nid) == "done":
                    continue
                state[nid] = "open"
                stack.append((nid, True))
                src = by_id[nid].get("src", [])
                if not isinstance(src, list):
                    raise TinyIRError(nid, f"'src' must be a list, got {src!r}")
                for s in src:
                    if isinstance(s, str):
                        if s not in by_id:
                            raise TinyIRError(nid, f"source {s!r} is not a node of the program")
                        if state.get(s) == "open":
                            raise TinyIRError(nid, f"the graph has a cycle through {s!r}")
                        if s not in state:
                            stack.append((s, False))
        return ordered

    def run(self, outputs: Optional[list]) -> Graph:
        for raw in self.order():
            node = self.node(raw)
            self.nodes[node.id] = node
        if self.unknown:
            symbol, nid = next(iter(self.unknown.items()))
            raise TinyIRError(nid, f"symbol {symbol} has no value: no input binds it and no "
                                   f"shape fixes it; give it with sizes={{'{symbol}': ...}}")
        nodes = {nid: replace(n, shape=tuple(self.norm(d) for d in n.shape),
                              params=self.norm_params(n.params)) for nid, n in self.nodes.items()}
        inputs = tuple(n.id for n in nodes.values() if n.uop == "INPUT")
        if outputs is None:
            used = {s for n in nodes.values() for s in n.sources()}
            outputs = [n.id for n in nodes.values() if n.id not in used and n.uop != "INPUT"]
        if not outputs:
            raise TinyIRError(None, "the program computes nothing (no node other than INPUT)")
        for out in outputs:
            if out not in nodes:
                raise TinyIRError(out, "an output names no node of the program")
        names = {self.norm(k): v for k, v in self.names.items()}
        return Graph(nodes, inputs, tuple(dict.fromkeys(outputs)), tuple(self.size_symbols), names)

    def norm_params(self, params):
        def norm(v):
            if isinstance(v, sympy.Basic):
                return self.norm(v)
            if isinstance(v, tuple):
                return tuple(norm(x) for x in v)
            return v
        return {k: norm(v) for k, v in params.items()}

    def source(self, node: str, src, index: int) -> Node:
        if index >= len(src) or not isinstance(src[index], str):
            raise TinyIRError(node, f"source {index} must be a node id, got {src[index:index + 1]!r}")
        return self.nodes[src[index]]

    def node(self, raw: Mapping) -> Node:
        nid, uop = raw["id"], raw.get("uop")
        arg = raw.get("arg", {}) or {}
        src = list(raw.get("src", []))
        if not isinstance(arg, Mapping):
            raise TinyIRError(nid, f"'arg' must be an object, got {arg!r}")
        arity = {"INPUT": 0, "WHERE": 3, **{u: 1 for u in (*MOVEMENT, *UNARY, "REDUCE")},
                 **{u: 2 for u in BINARY}}
        if uop not in arity:
            raise TinyIRError(nid, f"unknown uop {uop!r}; expected one of {', '.join(arity)}")
        if len(src) != arity[uop]:
            raise TinyIRError(nid, f"{uop} takes {arity[uop]} source(s), got {len(src)}")
        for s in src:
            if not isinstance(s, (str, bool)) and (not isinstance(s, (int, float)) or not math.isfinite(s)):
                raise TinyIRError(nid, f"a source is a node id or a finite number, got {s!r}")
        if uop == "INPUT":
            return self.input(nid, arg)
        if uop in MOVEMENT:
            x = self.source(nid, src, 0)
            shape, params = getattr(self, uop.lower())(nid, list(x.shape), arg)
            return Node(nid, uop, tuple(src), params, tuple(shape), x.dtype)
        if uop == "REDUCE":
            return self.reduce(nid, self.source(nid, src, 0), arg, src)
        return self.elementwise(nid, uop, src, arg)

    def input(self, nid, arg) -> Node:
        tensor, dtype, shape = arg.get("tensor_id"), arg.get("dtype"), arg.get("shape")
        if not isinstance(tensor, str) or not _IDENT.match(tensor):
            raise TinyIRError(nid, f"INPUT needs a 'tensor_id' that is an identifier, got {tensor!r}")
        if dtype not in DTYPES:
            raise TinyIRError(nid, f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if not isinstance(shape, list):
            raise TinyIRError(nid, f"INPUT needs a 'shape' list, got {shape!r}")
        for other in self.nodes.values():
            if other.uop == "INPUT" and other.params["tensor_id"] == tensor:
                raise TinyIRError(nid, f"tensor_id {tensor!r} is also the input of node {other.id!r}")
        dims = tuple(self.dim(d, nid, is_input=True) for d in shape)
        return Node(nid, "INPUT", (), {"tensor_id": tensor}, dims, dtype)

    def shape_arg(self, nid, arg, key="result_shape"):
        shape = arg.get(key)
        if not isinstance(shape, list):
            raise TinyIRError(nid, f"needs {key!r} (a list), got {shape!r}")
        return [self.dim(d, nid) for d in shape]

    def axes(self, nid, values, shape, what="axes", allow_names=False) -> tuple[int, ...]:
        """Axis numbers (negative from the end; symbol names where ``allow_names``), distinct."""
        if not isinstance(values, list):
            raise TinyIRError(nid, f"{what} must be a list, got {values!r}")
        out = []
        for a in values:
            if allow_names and isinstance(a, str):
                value = self.norm(self.values[a]) if a in self.values else None
                hits = [k for k, d in enumerate(shape) if value is not None and same(self.norm(d), value)]
                if len(hits) != 1:
                    found = "no axis" if not hits else f"axes {hits}"
                    raise TinyIRError(nid, f"{what}: {a!r} must name exactly one axis of shape "
                                           f"{_show(shape, self.norm)}, found {found}")
                a = hits[0]
            if isinstance(a, bool) or not isinstance(a, int) or not -len(shape) <= a < len(shape):
                raise TinyIRError(nid, f"{what}: {a!r} is not an axis of a rank-{len(shape)} value")
            out.append(a % len(shape))
        if len(set(out)) != len(out):
            raise TinyIRError(nid, f"{what} {values!r} name an axis twice")
        return tuple(out)

    # -- movement ------------------------------------------------------------------------------

    def reshape(self, nid, shape, arg):
        out = self.shape_arg(nid, arg)
        total_in, total_out = sympy.Mul(*shape), sympy.Mul(*out)
        if not self.equal(total_in, total_out, may_bind=False):
            reshape_groups(shape, out, lambda a, b, first: self.equal(a, b, first, unify=first))
            if not same(self.norm(sympy.Mul(*shape)), self.norm(sympy.Mul(*out))):
                raise AxisSizeMismatch(nid, f"RESHAPE from {_show(shape, self.norm)} "
                                            f"({self.norm(total_in)} elements) to {_show(out, self.norm)} "
                                            f"({self.norm(total_out)} elements)")
        return out, {}

    def permute(self, nid, shape, arg):
        perm = arg.get("perm")
        if (not isinstance(perm, list) or any(isinstance(p, bool) or not isinstance(p, int) for p in perm)
                or sorted(perm) != list(range(len(shape)))):
            raise InvalidPermutation(nid, f"perm must hold each of 0..{len(shape) - 1} once, got {perm!r}")
        return [shape[p] for p in perm], {"perm": tuple(perm)}

    def expand(self, nid, shape, arg):
        out = self.shape_arg(nid, arg)
        lead = len(out) - len(shape)
        if lead < 0:
            raise BroadcastMismatch(nid, f"EXPAND to rank {len(out)} from rank {len(shape)}")
        kept = []
        for k, s in enumerate(shape):
            r = out[lead + k]
            if self.equal(s, r, may_bind=self.norm(s) != 1):
                kept.append(lead + k)
            elif self.norm(s) != 1:
                raise BroadcastMismatch(nid, f"EXPAND axis {lead + k}: source size {self.norm(s)} is "
                                             f"neither 1 nor the result's {self.norm(r)}")
        given = arg.get("broadcast_dimensions")
        if given is not None:
            named = set(self.axes(nid, given, out, "broadcast_dimensions"))
            must = {k for k in kept if self.norm(out[k]) != 1}
            if not must <= named <= set(kept):
                raise BroadcastMismatch(nid, f"broadcast_dimensions {given!r} must name the result axes "
                                             f"taken from the source, {sorted(must)}")
        return out, {}

    def pad(self, nid, shape, arg):
        pads = arg.get("pad")
        if not isinstance(pads, list) or len(pads) != len(shape) or any(
                not isinstance(p, list) or len(p) != 2 for p in pads):
            raise TinyIRError(nid, f"pad must be {len(shape)} pairs [lo, hi], got {pads!r}")
        amounts = tuple((self.integer(lo, nid, "a pad"), self.integer(hi, nid, "a pad")) for lo, hi in pads)
        value = arg.get("value", 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TinyIRError(nid, f"the pad value must be a finite number, got {value!r}")
        return ([d + lo + hi for d, (lo, hi) in zip(shape, amounts)], {"pad": amounts, "value": value})

    def shrink(self, nid, shape, arg):
        lo, hi = arg.get("lo"), arg.get("hi")
        step = arg.get("step") or [1] * len(shape)
        if not all(isinstance(v, list) and len(v) == len(shape) for v in (lo, hi, step)):
            raise TinyIRError(nid, f"SHRINK needs lo, hi (and step) lists of {len(shape)} entries")
        out, starts, steps = [], [], []
        for k, d in enumerate(shape):
            a, b = self.offset(lo[k], nid), self.offset(hi[k], nid)
            s = self.integer(step[k], nid, "a step", minimum=1)
            if not (provably_nonnegative(a) and provably_nonnegative(b - a - 1) and provably_nonnegative(d - b)):
                raise TinyIRError(nid, f"SHRINK axis {k}: need 0 <= lo < hi <= {self.norm(d)}, "
                                       f"got lo={a}, hi={b}")
            out.append(sympy.floor((b - a + s - 1) / s))
            starts.append(a)
            steps.append(s)
        return out, {"lo": tuple(starts), "step": tuple(steps)}

    def flip(self, nid, shape, arg):
        return list(shape), {"axes": self.axes(nid, arg.get("axes"), shape)}

    def view(self, nid, shape, arg):
        out = self.shape_arg(nid, arg)
        index_map = arg.get("index_map")
        if isinstance(index_map, Mapping):
            index_map = [index_map.get(str(k), index_map.get(k)) for k in range(len(shape))]
        if not isinstance(index_map, list) or len(index_map) != len(shape) or not all(
                isinstance(e, str) for e in index_map):
            raise TinyIRError(nid, f"index_map must give one expression per source axis "
                                   f"({len(shape)}), got {arg.get('index_map')!r}")
        names = {f"i{k}": view_axis(k) for k in range(len(out))}
        exprs = tuple(self.affine_text(nid, text, names) for text in index_map)
        return out, {"index_map": exprs}

    def affine_text(self, nid, text, names):
        """An index_map expression: ints, ``i<k>`` (result axis k), size symbols, ``+ - *`` and
        ``//`` by a positive int."""
        def walk(e):
            if isinstance(e, pyast.Constant) and isinstance(e.value, int) and not isinstance(e.value, bool):
                return sympy.Integer(e.value)
            if isinstance(e, pyast.Name):
                if e.id in names:
                    return names[e.id]
                if e.id in self.values:
                    return self.norm(self.values[e.id])
                raise TinyIRError(nid, f"index_map {text!r}: unknown name {e.id!r}")
            if isinstance(e, pyast.UnaryOp) and isinstance(e.op, pyast.USub):
                return -walk(e.operand)
            if isinstance(e, pyast.BinOp) and isinstance(e.op, (pyast.Add, pyast.Sub, pyast.Mult, pyast.FloorDiv)):
                a, b = walk(e.left), walk(e.right)
                if isinstance(e.op, pyast.Add):
                    return a + b
                if isinstance(e.op, pyast.Sub):
                    return a - b
                if isinstance(e.op, pyast.Mult):
                    if not (a.is_number or b.is_number or not (a.free_symbols | b.free_symbols) & set(names.values())):
                        raise TinyIRError(nid, f"index_map {text!r}: a product of two index terms is not affine")
                    return a * b
                if not (b.is_Integer and b > 0):
                    raise TinyIRError(nid, f"index_map {text!r}: // needs a positive int divisor")
                return sympy.floor(a / b)
            raise TinyIRError(nid, f"index_map {text!r}: only ints, names, + - * and // are allowed")
        try:
            tree = pyast.parse(text, mode="eval")
        except SyntaxError as err:
            raise TinyIRError(nid, f"index_map {text!r} does not parse: {err.msg}") from None
        return walk(tree.body)

    def pool(self, nid, shape, arg):
        kernel = arg.get("kernel")
        if not isinstance(kernel, list) or not 0 < len(kernel) <= len(shape):
            raise TinyIRError(nid, f"POOL needs 'kernel' with 1..{len(shape)} sizes, got {kernel!r}")
        n = len(kernel)
        stride = arg.get("stride") or [1] * n
        dilation = arg.get("dilation") or [1] * n
        if not (isinstance(stride, list) and isinstance(dilation, list) and len(stride) == len(dilation) == n):
            raise TinyIRError(nid, f"POOL: stride and dilation need {n} entries")
        ks = [self.dim(k, nid) for k in kernel]
        ss = [self.integer(s, nid, "a stride", 1) for s in stride]
        ds = [self.integer(d, nid, "a dilation", 1) for d in dilation]
        lead = len(shape) - n
        windows = []
        for d, k, s, dil in zip(shape[lead:], ks, ss, ds):
            span = dil * (k - 1) + 1
            if provably_nonnegative(span - d - 1):  # (symbolic sizes: checked by the call)
                raise TinyIRError(nid, f"POOL: a window of {self.norm(span)} does not fit a size-{self.norm(d)} axis")
            windows.append(sympy.floor((d - span) / s) + 1)
        return [*shape[:lead], *windows, *ks], {"stride": tuple(ss), "dilation": tuple(ds)}

    # -- compute -------------------------------------------------------------------------------

    def reduce(self, nid, x: Node, arg, src) -> Node:
        if "dtype" not in arg or arg["dtype"] is None:
            raise AccDtypeMissing(nid, "REDUCE needs its accumulation 'dtype' (e.g. \"fp32\")")
        acc = arg["dtype"]
        if acc not in DTYPES or acc == "bool":
            raise TinyIRError(nid, f"the accumulation dtype must be one of fp16, bf16, fp32, i32, got {acc!r}")
        op = arg.get("op")
        if op not in REDUCE_OPS:
            raise TinyIRError(nid, f"REDUCE op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        axes = self.axes(nid, arg.get("axes"), x.shape, allow_names=True)
        init = arg.get("init")
        if init is not None and (isinstance(init, bool) or not isinstance(init, (int, float))):
            raise TinyIRError(nid, f"init must be a number, got {init!r}")
        shape = tuple(d for k, d in enumerate(x.shape) if k not in axes)
        return Node(nid, "REDUCE", tuple(src), {"op": op, "axes": axes, "init": init}, shape, acc)

    def elementwise(self, nid, uop, src, arg) -> Node:
        operands = [self.nodes[s] for s in src if isinstance(s, str)]
        if not operands:
            raise TinyIRError(nid, f"{uop} needs at least one node operand, got only immediates")
        shape = self.broadcast(nid, [list(o.shape) for o in operands])
        if uop == "WHERE":
            if isinstance(src[0], str) and self.nodes[src[0]].dtype != "bool":
                raise DtypeMismatch(nid, f"WHERE's condition must be bool, got {self.nodes[src[0]].dtype}")
            values = [s for s in src[1:] if isinstance(s, str)]
            kinds = {self.nodes[s].dtype for s in values}
            if not values:
                raise TinyIRError(nid, "WHERE needs a node among its two values")
        else:
            kinds = {o.dtype for o in operands}
        if len(kinds) > 1:
            raise DtypeMismatch(nid, f"{uop} of {' and '.join(sorted(kinds))}: implicit casts are not "
                                     f"allowed, insert a CAST")
        dtype = kinds.pop()
        params = {}
        if uop == "CAST":
            dtype = arg.get("to")
            if dtype not in DTYPES:
                raise TinyIRError(nid, f"CAST 'to' must be one of {', '.join(DTYPES)}, got {dtype!r}")
            if dtype == "bf16":
                raise TinyIRError(nid, "CAST to bf16 is not supported: tcpy has no bfloat16 type "
                                       "(bf16 values are computed and returned as fp32)")
        elif uop in FLOAT_ONLY and dtype not in FLOATS:
            raise DtypeMismatch(nid, f"{uop} needs a float operand, got {dtype}")
        elif dtype == "bool" and uop not in ("WHERE", "MAX", "MIN"):
            raise DtypeMismatch(nid, f"{uop} of bool values; CAST them first")
        return Node(nid, uop, tuple(src), params, tuple(shape), dtype)

    def broadcast(self, nid, shapes) -> list:
        """Right-aligned broadcasting of operand shapes (sizes equal, or 1)."""
        rank = max(len(s) for s in shapes)
        out = []
        for k in reversed(range(rank)):  # from the right, where the axes are aligned
            dims = [self.norm(s[k - rank + len(s)]) for s in shapes if k - rank + len(s) >= 0]
            big = [d for d in dims if d != 1]
            for d in big[1:]:
                if not self.equal(big[0], d, may_bind=True):
                    raise BroadcastMismatch(nid, f"shapes {' and '.join(_show(s, self.norm) for s in shapes)} "
                                                 f"do not broadcast (right-aligned): axis {k} is "
                                                 f"{self.norm(big[0])} and {self.norm(d)}")
            out.append(big[0] if big else sympy.Integer(1))
        return out[::-1]


def view_axis(k: int) -> sympy.Symbol:
    """The placeholder a VIEW index map uses for result axis ``k``."""
    return sympy.Symbol(f"_view{k}", integer=True, nonnegative=True)


def _show(shape, norm) -> str:
    return "[" + ", ".join(str(norm(d)) for d in shape) + "]"


def check(program: Mapping, sizes: Optional[Mapping[str, int]] = None,
          outputs: Optional[list] = None) -> Graph:
    """Check a Tiny IR ``program`` (``{"uops": [...]}``) and return its :class:`Graph`.

    ``sizes`` gives values to shape symbols (on top of the program's own ``"sizes"`` object);
    ``outputs`` the node ids to return (default: the program's ``"outputs"`` list, else every
    node no other node reads). Raises a :class:`~tcpy.tinyir.TinyIRError` subclass.
    """
    if not isinstance(program, Mapping):
        raise TinyIRError(None, f"a program is a JSON object, got {type(program).__name__}")
    given = dict(program.get("sizes") or {})
    given.update(sizes or {})
    if outputs is None:
        outputs = program.get("outputs")
    if outputs is not None and (not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs)):
        raise TinyIRError(None, f"outputs must be a list of node ids, got {outputs!r}")
    return _Checker(program, given).run(outputs)
