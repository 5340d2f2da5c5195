"""Element-wise PTIR operations: unary and binary arithmetic, compare, select, cast, clamp.

PTIR broadcasts nothing implicitly and promotes no dtype: operands of one op have the same
shape and dtype (``broadcast_to`` and ``cast`` say otherwise explicitly).
"""
from __future__ import annotations

from ..errors import TCOpError
from ..lang.types import ScalarType
from ..lang.writer import cast as cast_text
from .core import Value, check_kind, check_same, copy, dtype_of, index_vars, is_number, literal, loops, operation

# unary op -> TC text of the result for an operand written as {x}; floats only unless listed in _ANY_DTYPE
_UNARY = {
    "neg": "-{x}", "abs": "fabs({x})", "exp": "exp({x})", "log": "log({x})", "tanh": "tanh({x})",
    "erf": "erf({x})", "rsqrt": "rsqrt({x})", "reciprocal": "{one} / {x}",
}
_ANY_DTYPE = ("neg", "abs")
_BINARY = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
    "maximum": "max({a}, {b})", "minimum": "min({a}, {b})",
}
_COMPARE = {"lt": "<", "le": "<=", "eq": "==", "ge": ">=", "gt": ">", "ne": "!="}


def _elementwise(x: Value, text: str, dtype: ScalarType) -> Value:
    out = index_vars(x.rank)
    return x.graph.define(x.shape, out, "=", text, loops(out, x.shape), dtype=dtype)


@operation("x")
def unary(x, op: str) -> Value:
    """``op`` applied to every element: ``neg``, ``abs`` (any numeric dtype), ``exp``, ``log``,
    ``tanh``, ``erf``, ``rsqrt``, ``reciprocal`` (float dtypes). Same shape and dtype as ``x``."""
    if not isinstance(op, str) or op not in _UNARY:
        raise TCOpError(f"unary: op must be one of {', '.join(_UNARY)}, got {op!r}")
    check_kind(f"unary {op}", x, "x", ("float", "int", "uint") if op in _ANY_DTYPE else ("float",))
    read = x.at(index_vars(x.rank))
    if op == "abs" and not x.dtype.is_float:
        text = f"{read} < {literal(0, x.dtype)} ? -{read} : {read}"  # wraps at the minimum, like NumPy
    else:
        text = _UNARY[op].format(x=read, one=literal(1, x.dtype))
    # builtins compute in float32 at least: a half result is cast back
    natural = x.dtype if op in ("neg", "reciprocal") or not x.dtype.is_float else None
    return _elementwise(x, cast_text(text, x.dtype, natural), x.dtype)


@operation("lhs", "rhs", literals=("lhs", "rhs"))
def binary(lhs, rhs, op: str) -> Value:
    """``op`` per element of two operands of the same shape and dtype: ``add``, ``sub``, ``mul``,
    ``div``, ``maximum``, ``minimum``. One operand may be a number (an inline literal of the
    other's dtype). ``maximum``/``minimum`` propagate NaN; integer division truncates toward zero
    and a division by zero raises :class:`~tcpy.TCRuntimeError`."""
    if not isinstance(op, str) or op not in _BINARY:
        raise TCOpError(f"binary: op must be one of {', '.join(_BINARY)}, got {op!r}")
    name = f"binary {op}"
    like = _tensor_of(name, (lhs, rhs), ("lhs", "rhs"))
    like_name = "lhs" if like is lhs else "rhs"
    check_kind(name, like, like_name, ("float", "int", "uint"))
    out = index_vars(like.rank)
    a = operand_text(name, lhs, like, out, "lhs", like_name) if like is not lhs else lhs.at(out)
    b = operand_text(name, rhs, like, out, "rhs", like_name) if like is not rhs else rhs.at(out)
    return _elementwise(like, _BINARY[op].format(a=a, b=b), like.dtype)


@operation("lhs", "rhs")
def compare(lhs, rhs, op: str) -> Value:
    """Element-wise comparison giving a bool (PTIR ``i1``) tensor. ``op`` is one of ``<``, ``<=``,
    ``==``, ``>=``, ``>``, ``!=`` (or ``lt``, ``le``, ``eq``, ``ge``, ``gt``, ``ne``). IEEE rules:
    every comparison with NaN is false except ``!=``."""
    symbol = _COMPARE.get(op, op) if isinstance(op, str) else None
    if symbol not in _COMPARE.values():
        raise TCOpError(f"compare: op must be one of {', '.join(_COMPARE.values())} "
                        f"(or {', '.join(_COMPARE)}), got {op!r}")
    check_same("compare", [lhs, rhs], ["lhs", "rhs"])
    out = index_vars(lhs.rank)
    return _elementwise(lhs, f"{lhs.at(out)} {symbol} {rhs.at(out)}", ScalarType.BOOL)


@operation("pred", "on_true", "on_false")
def select(pred, on_true, on_false) -> Value:
    """``pred ? on_true : on_false`` per element; ``pred`` is bool, the branches share a dtype,
    all three share a shape."""
    check_kind("select", pred, "pred", ("bool",))
    check_same("select", [on_true, on_false], ["on_true", "on_false"])
    check_same("select", [on_true, pred], ["on_true", "pred"], dtype=False)
    out = index_vars(pred.rank)
    return _elementwise(on_true, f"{pred.at(out)} ? {on_true.at(out)} : {on_false.at(out)}", on_true.dtype)


@operation("x")
def cast(x, dtype) -> Value:
    """``x`` converted to ``dtype``: float to float rounds to nearest even, float to int truncates
    toward zero and saturates (NaN gives 0), int to int saturates."""
    to = dtype_of(dtype)
    if to is x.dtype:
        return copy(x)
    return _elementwise(x, cast_text(x.at(index_vars(x.rank)), to), to)


@operation("x")
def stop_gradient(x) -> Value:
    """``x`` itself (a gradient barrier; tcpy.ops has no autograd, so a copy)."""
    return copy(x)


def operand_text(op: str, value, like: Value, out, what: str, like_name: str) -> str:
    """A tensor operand read at ``out``, or a number written as a constant of ``like``'s dtype."""
    if is_number(value):
        return literal(value, like.dtype)
    check_same(op, [like, value], [like_name, what])
    return value.at(out)


def _tensor_of(op: str, values, names) -> Value:
    for value in values:
        if not is_number(value):
            return value
    raise TCOpError(f"{op}: at least one of {', '.join(names)} must be a tensor, got numbers")


@operation("x", "lo", "hi", literals=("lo", "hi"))
def clamp(x, lo, hi) -> Value:
    """``min(max(x, lo), hi)`` per element; ``lo`` and ``hi`` are tensors of ``x``'s shape and
    dtype, or numbers (inlined as constants of ``x``'s dtype). NaN in ``x`` stays NaN."""
    check_kind("clamp", x, "x", ("float", "int", "uint"))
    out = index_vars(x.rank)
    text = (f"min(max({x.at(out)}, {operand_text('clamp', lo, x, out, 'lo', 'x')}), "
            f"{operand_text('clamp', hi, x, out, 'hi', 'x')})")
    return _elementwise(x, text, x.dtype)


def _named_unary(op):
    def fn(x, **kwargs):
        return unary(x, op, **kwargs)
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"``unary(x, {op!r})``: see :func:`unary`."
    return fn


def _named_binary(op):
    def fn(lhs, rhs, **kwargs):
        return binary(lhs, rhs, op, **kwargs)
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"``binary(lhs, rhs, {op!r})``: see :func:`binary`."
    return fn


neg, abs, exp, log, tanh, erf, rsqrt, reciprocal = map(_named_unary, _UNARY)  # noqa: A001 (PTIR's names)
add, sub, mul, div, maximum, minimum = map(_named_binary, _BINARY)
