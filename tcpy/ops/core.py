"""What every builder of :mod:`tcpy.ops` shares: tensor descriptions, the graph that collects TC
statements, the ``@operation`` decorator, dtype names, axes and literals.

A builder is written once, as a function that appends comprehension statements to a
:class:`Graph` and returns the :class:`Value` it defined. Called on descriptions of tensors
(:class:`TensorSpec`, arrays, anything with ``.shape`` and ``.dtype``) it opens a graph of its own
and returns the compiled :class:`~tcpy.Kernel`; called on values inside :func:`compose` it adds to
that graph, so a composition is one TC def that the compiler sees whole (and fuses).
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np
import sympy

from ..api import Kernel, define
from ..errors import TCOpError
from ..lang import writer
from ..lang.ast import tuple_text
from ..lang.types import TYPE_NAMES, ScalarType
from ..options import Options

#: One dimension: a concrete size, or a symbolic one (a TC size variable or an affine expression).
Dim = Union[int, sympy.Expr]

# PTIR's dtype names (spec.rs::DType) next to NumPy's; the ones tcpy kernels cannot hold are
# named in the error instead of being silently mapped to something else.
_PTIR_DTYPES = {
    "i1": ScalarType.BOOL, "si8": ScalarType.INT8, "si16": ScalarType.INT16, "si32": ScalarType.INT32,
    "si64": ScalarType.INT64, "ui8": ScalarType.UINT8, "ui16": ScalarType.UINT16, "ui32": ScalarType.UINT32,
    "ui64": ScalarType.UINT64, "f16": ScalarType.FLOAT16, "f32": ScalarType.FLOAT32, "f64": ScalarType.FLOAT64,
}
_UNSUPPORTED_DTYPES = ("si4", "ui4", "fp8_e4m3", "fp8_e5m2", "bf16", "cf32", "cf64")
_SIZE_NAME = re.compile(r"[A-Z][A-Za-z0-9_]*\Z")


def dtype_of(dtype, what: str = "dtype") -> ScalarType:
    """The scalar type of a PTIR dtype name (``"f32"``, ``"si64"``, ``"i1"``), a NumPy dtype or a
    TC type name; raises :class:`~tcpy.TCOpError` for anything else."""
    if isinstance(dtype, ScalarType):
        return dtype
    if dtype is None:  # NumPy would read None as float64
        raise TCOpError(f"{what} must be a PTIR dtype ({', '.join(_PTIR_DTYPES)}) or a NumPy dtype, got None")
    if isinstance(dtype, str) and dtype in _PTIR_DTYPES:
        return _PTIR_DTYPES[dtype]
    if isinstance(dtype, str) and dtype in _UNSUPPORTED_DTYPES:
        raise TCOpError(f"{what} {dtype} is not supported by tcpy kernels; expected one of "
                        f"{', '.join(_PTIR_DTYPES)} (or a NumPy dtype of the same kind)")
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):  # ValueError: an object whose .dtype is no NumPy dtype
        name = None
    if name in TYPE_NAMES:
        return TYPE_NAMES[name]
    raise TCOpError(f"{what} must be a PTIR dtype ({', '.join(_PTIR_DTYPES)}) or a NumPy dtype of the same "
                    f"kind, got {dtype!r}")


def _dim(d, where: str) -> Dim:
    if isinstance(d, (bool, np.bool_)):
        raise TCOpError(f"{where} must be a size (int >= 0 or a size name), got {d!r}")
    if isinstance(d, (int, np.integer)):
        if d < 0:
            raise TCOpError(f"{where} must be >= 0, got {d}")
        return int(d)
    if isinstance(d, str):
        if not _SIZE_NAME.match(d):
            raise TCOpError(f"{where}: a symbolic size is a name starting with an upper-case letter "
                            f"(like 'N' or 'Seq'), got {d!r}")
        return sympy.Symbol(d, integer=True, nonnegative=True)
    if isinstance(d, sympy.Expr):
        return int(d) if d.is_Integer else d
    raise TCOpError(f"{where} must be an int or a size name, got {type(d).__name__} {d!r}")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's static description: a shape (ints and size names) and a dtype."""

    shape: tuple
    dtype: ScalarType

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"{self.dtype.numpy_name}[{', '.join(str(d) for d in self.shape)}]"


def tensor(shape, dtype="float32") -> TensorSpec:
    """Describe an operand: ``tensor(("B", "S", 64), "f32")``. A size is an int or a name (an upper-case
    identifier); operands that share a name must agree on that size when the kernel is called."""
    if isinstance(shape, (int, str, np.integer)):
        shape = (shape,)
    if not isinstance(shape, Sequence):
        raise TCOpError(f"a shape must be a tuple of sizes (ints or size names), got {shape!r}")
    return TensorSpec(tuple(_dim(d, f"dimension {k} of the shape") for k, d in enumerate(shape)),
                      dtype_of(dtype))


def spec_of(obj, what: str) -> TensorSpec:
    """The :class:`TensorSpec` of an operand: a spec, a :class:`Value`, or anything with
    ``.shape`` and ``.dtype`` (a NumPy array gives its concrete shape)."""
    if isinstance(obj, TensorSpec):
        return obj
    if isinstance(obj, Value):
        return obj.spec
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        return TensorSpec(tuple(_dim(d, f"{what}.shape[{k}]") for k, d in enumerate(obj.shape)),
                          dtype_of(obj.dtype, f"{what}.dtype"))
    raise TCOpError(f"{what} must be a tensor description (tcpy.ops.tensor(shape, dtype), an array, or a "
                    f"value inside tcpy.ops.compose), got {type(obj).__name__}")


# ----------------------------------------------------------------------------- dims as TC text


def dim_text(d: Dim) -> str:
    """A dimension as a TC size expression (sympy prints sums and integer multiples as TC does)."""
    return str(d)


def same_dim(a: Dim, b: Dim) -> bool:
    """Whether two dimensions are equal for all sizes."""
    return sympy.simplify(sympy.Integer(a) - b if isinstance(a, int) else a - b) == 0


class ConstantEmptyAxis(TCOpError):
    """A kernel that would loop over an axis of constant size 0 (``err.loop``), which TC ranges cannot be."""

    def __init__(self, graph_name: str, loop: str):
        self.loop = loop
        super().__init__(f"{graph_name}: the kernel would loop over {loop}, and TC ranges are never empty; an "
                         f"operand's empty axis can be a size name bound to 0 at call time "
                         f"(tcpy.ops.tensor(('N', 3))), an empty result of constant size cannot be built")


class ConcreteSizeNeeded(TCOpError):
    """An operation needs a number where its operand has a symbolic size (``err.op``, ``err.what``)."""

    def __init__(self, op: str, what: str, size: Dim):
        self.op, self.what = op, what
        super().__init__(f"{op}: {what} must be a concrete size (the index arithmetic needs the number), "
                         f"got the symbolic size {size}")


def concrete(d: Dim, op: str, what: str) -> int:
    """``d`` as an int; raises when it is symbolic and ``op`` needs the number to write its indices."""
    if isinstance(d, int):
        return d
    raise ConcreteSizeNeeded(op, what, d)


def shape_text(shape) -> str:
    """A shape as Python prints a tuple, for messages."""
    return tuple_text(map(str, shape))


# ----------------------------------------------------------------------------- graph


class Value:
    """A tensor inside a :class:`Graph`: its TC name and its description."""

    def __init__(self, graph: "Graph", name: str, spec: TensorSpec):
        self.graph, self.name, self.spec = graph, name, spec

    @property
    def shape(self) -> tuple:
        return self.spec.shape

    @property
    def dtype(self) -> ScalarType:
        return self.spec.dtype

    @property
    def rank(self) -> int:
        return self.spec.rank

    def at(self, indices: Sequence[str]) -> str:
        """TC text of a read at ``indices`` (a rank-0 tensor is read by its name)."""
        return writer.read(self.name, indices)

    def __repr__(self) -> str:
        return f"<tcpy.ops value {self.name}: {self.spec!r}>"


@dataclass(frozen=True)
class Loop:
    """An index variable of a statement and the extent it runs over."""

    var: str
    extent: Dim


class Graph:
    """TC statements being collected into one def."""

    def __init__(self, name: str):
        self.name = name
        self.params: list[Value] = []
        self.lines: list[str] = []
        self._count = 0
        self.empty_loop: Optional[str] = None  # the first loop over a constant 0, which TC cannot range over

    def input(self, spec: TensorSpec) -> Value:
        """A new parameter of the def."""
        value = Value(self, f"in{len(self.params)}", spec)
        self.params.append(value)
        return value

    def define(self, shape, out_vars: Sequence[str], op: str, rhs: str, loops: Sequence[Loop],
               lets: Sequence[str] = (), dtype: Optional[ScalarType] = None, target: Optional[Value] = None) -> Value:
        """Append ``v(out_vars) op rhs where <loops>, <lets>`` and return ``v``.

        Every index variable gets an explicit range, so the output shape is the one the builder
        computed, and accesses become size preconditions checked at call time. ``target``
        writes a value defined earlier (a reduction without ``!`` accumulating into it).
        """
        if target is None:
            self._count += 1
            target = Value(self, f"v{self._count}", TensorSpec(tuple(shape), dtype))
        empty = next((loop.var for loop in loops if isinstance(loop.extent, int) and loop.extent == 0), None)
        if empty is not None and self.empty_loop is None:
            self.empty_loop = f"'{empty} in 0:0' for a value of shape {shape_text(target.shape)}"
        ranges = [(loop.var, dim_text(loop.extent)) for loop in loops]
        self.lines.append(writer.statement(target.at(out_vars), op, rhs, ranges, lets))
        return target

    def source(self, outputs: Sequence[Value]) -> str:
        """The TC def returning ``outputs``."""
        returns = []
        for value in outputs:
            if value in self.params or value.name in returns:  # a returned input is copied out
                value = copy(value)
            returns.append(value.name)
        params = [(p.dtype, [dim_text(d) for d in p.shape], p.name) for p in self.params]
        return writer.def_source(self.name, params, returns, self.lines)


_ACTIVE: contextvars.ContextVar[Optional[Graph]] = contextvars.ContextVar("tcpy_ops_graph", default=None)


def active_graph(op: str) -> Graph:
    """The graph an operation without tensor operands (``iota``) adds to."""
    graph = _ACTIVE.get()
    if graph is None:  # only reachable through a helper called outside an operation
        raise TCOpError(f"{op} must be called on tensor descriptions or inside tcpy.ops.compose")
    return graph


def operation(*operands: str, literals: Sequence[str] = ()):
    """Make a builder from ``impl(*args, **attrs) -> Value``.

    ``operands`` names the parameters that are tensors (a name starting with ``*`` holds a list
    of them). Outside :func:`compose` the builder opens a graph, turns each operand description
    into an input, and returns the compiled :class:`~tcpy.Kernel` (``options=`` passes
    :class:`~tcpy.Options`); inside, operands must be values of that composition and the
    builder returns the new value. A number given for an operand named in ``literals`` stays a
    number: an inline literal (PTIR's ``Operand::Literal``) that the builder writes as a constant.
    """
    def wrap(impl: Callable):
        signature = inspect.signature(impl)

        @functools.wraps(impl)
        def builder(*args, options: Optional[Options] = None, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as err:
                raise TCOpError(f"{impl.__name__}: {err}") from None
            bound.apply_defaults()
            graph = _ACTIVE.get()
            if graph is not None:
                if options is not None:
                    raise TCOpError(f"{impl.__name__}: inside compose, options belong to the composed kernel; "
                                    "pass them to compose")
                for name in operands:
                    for k, value in _operand_items(bound.arguments, name):
                        if is_number(value) and name in literals:
                            continue
                        if not isinstance(value, Value) or value.graph is not graph:
                            raise TCOpError(f"{impl.__name__}: inside compose, operand {k} must be a value of the "
                                            f"composition, got {type(value).__name__}")
                return impl(*bound.args, **bound.kwargs)
            graph = Graph(f"ptir_{impl.__name__}")
            for name in operands:
                items = _operand_items(bound.arguments, name)
                values = [value if is_number(value) and name in literals else graph.input(spec_of(value, k))
                          for k, value in items]
                bound.arguments[name.lstrip("*")] = values if name.startswith("*") else values[0]
            outputs = run_in(graph, lambda: impl(*bound.args, **bound.kwargs))
            return _kernel(graph, outputs, options)

        return builder
    return wrap


def is_number(value) -> bool:
    """Whether an operand is an inline scalar literal (a Python or NumPy number, not a bool)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _operand_items(arguments, name: str):
    if name.startswith("*"):
        values = arguments[name[1:]]
        if isinstance(values, (TensorSpec, Value, np.ndarray)) or not isinstance(values, Sequence) or not values:
            raise TCOpError(f"{name[1:]} must be a non-empty list of tensors, got {type(values).__name__}")
        return [(f"{name[1:]}[{k}]", v) for k, v in enumerate(values)]
    return [(name, arguments[name])]


def run_in(graph: Graph, body: Callable):
    """``body()`` with ``graph`` as the active graph: operations called in it add to ``graph``."""
    token = _ACTIVE.set(graph)
    try:
        outputs = body()
    finally:
        _ACTIVE.reset(token)
    return outputs


def _kernel(graph: Graph, outputs, options: Optional[Options]) -> Kernel:
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    for k, value in enumerate(outputs):
        if not isinstance(value, Value) or value.graph is not graph:
            raise TCOpError(f"{graph.name}: output {k} must be a value of the composition, got {type(value).__name__}")
    if graph.empty_loop is not None:
        raise ConstantEmptyAxis(graph.name, graph.empty_loop)
    return define(run_in(graph, lambda: graph.source(outputs)), options=options)


def compose(fn: Callable, *inputs, name: str = "composed", options: Optional[Options] = None) -> Kernel:
    """One kernel from several operations: ``fn`` receives one value per input description and
    returns a value (or a tuple of them) built with ``tcpy.ops`` builders; the result is a single
    TC def (``kernel.source``), so the compiler fuses across operations."""
    if not re.match(r"[A-Za-z_][A-Za-z0-9_]*\Z", name):
        raise TCOpError(f"compose: name must be an identifier, got {name!r}")
    graph = Graph(name)
    values = [graph.input(spec_of(spec, f"input {k}")) for k, spec in enumerate(inputs)]
    return _kernel(graph, run_in(graph, lambda: fn(*values)), options)


# ----------------------------------------------------------------------------- shared helpers


def axis_of(axis, rank: int, op: str, what: str = "axis") -> int:
    """``axis`` in ``[0, rank)``; negative axes count from the end (PTIR's rule)."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TCOpError(f"{op}: {what} must be an int, got {axis!r}")
    if not -rank <= axis < rank:
        raise TCOpError(f"{op}: {what} must be in [{-rank}, {rank}) for a rank-{rank} operand, got {axis}")
    return int(axis) % rank


def axes_of(axes, rank: int, op: str, what: str = "axes") -> tuple[int, ...]:
    """Unique axes in ``[0, rank)`` (negative ones normalised), in the order given."""
    if isinstance(axes, (int, np.integer)):
        axes = (axes,)
    if not isinstance(axes, Sequence):
        raise TCOpError(f"{op}: {what} must be an int or a list of ints, got {axes!r}")
    normal = tuple(axis_of(a, rank, op, what) for a in axes)
    if len(set(normal)) != len(normal):
        raise TCOpError(f"{op}: {what} must be unique, got {list(axes)} (normalised {list(normal)})")
    return normal


def ints_of(values, length: Optional[int], op: str, what: str, minimum: Optional[int] = 0) -> tuple[int, ...]:
    """A list of ``length`` ints (any number of them when ``length`` is None; each ``>= minimum``
    when given)."""
    if isinstance(values, (int, np.integer)) or not isinstance(values, Sequence) or \
            not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        count = "" if length is None else f"{length} "
        raise TCOpError(f"{op}: {what} must be a list of {count}ints, got {values!r}")
    if length is not None and len(values) != length:
        raise TCOpError(f"{op}: {what} must have {length} entries (one per axis), got {len(values)}: {list(values)}")
    if minimum is not None and any(v < minimum for v in values):
        raise TCOpError(f"{op}: {what} must be >= {minimum}, got {list(values)}")
    return tuple(int(v) for v in values)


def check_same(op: str, values: Sequence[Value], names: Sequence[str], *, shape=True, dtype=True) -> None:
    """PTIR's no-implicit-broadcast, no-implicit-promotion rule for operands of one op."""
    first, name0 = values[0], names[0]
    for value, name in zip(values[1:], names[1:]):
        if dtype and value.dtype is not first.dtype:
            raise TCOpError(f"{op}: {name} must have the dtype of {name0} ({first.dtype.numpy_name}), got "
                            f"{value.dtype.numpy_name} (insert a cast)")
        if shape and (value.rank != first.rank or not all(map(same_dim, value.shape, first.shape))):
            raise TCOpError(f"{op}: {name} must have the shape of {name0} {shape_text(first.shape)}, got "
                            f"{shape_text(value.shape)} (use broadcast_to)")


def check_kind(op: str, value: Value, what: str, kinds: Sequence[str]) -> None:
    """``value``'s dtype is of one of ``kinds`` ("float", "int", "uint", "bool")."""
    if value.dtype.kind not in kinds:
        raise TCOpError(f"{op}: {what} must have a {' or '.join(kinds)} dtype, got {value.dtype.numpy_name}")


def index_vars(n: int, prefix: str = "i") -> list[str]:
    """``n`` index variable names: ``i0, i1, ...``."""
    return [f"{prefix}{k}" for k in range(n)]


def loops(variables: Sequence[str], extents) -> list[Loop]:
    """One :class:`Loop` per variable, over the extent at its position."""
    return [Loop(v, e) for v, e in zip(variables, extents)]


def literal(value, dtype: ScalarType) -> str:
    """TC text of a constant of ``dtype`` (:func:`tcpy.lang.writer.literal`); a value ``dtype``
    cannot hold is a :class:`~tcpy.TCOpError`."""
    try:
        return writer.literal(value, dtype)
    except writer.LiteralError as err:
        raise TCOpError(str(err)) from None


def copy(x: Value) -> Value:
    """``x`` written to a new value (an output that must not alias an input)."""
    out = index_vars(x.rank)
    return x.graph.define(x.shape, out, "=", x.at(out), loops(out, x.shape), dtype=x.dtype)
