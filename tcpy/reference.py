"""The reference evaluator: what a TC def means, computed directly from its checked AST.

``tcpy.define(src, backend="reference")`` (or :func:`define_reference`) gives a kernel with the
same call interface as a compiled one that evaluates each statement with NumPy over its whole
rectangular iteration domain. It generates no code and shares nothing with the loop-nest IR
or the C emitter, so a bug there cannot hide in both; it uses the same front end
(:mod:`tcpy.lang`), argument binding (:mod:`tcpy.binding`) and range inference
(:mod:`tcpy.ranges`) as compiled kernels. Slow is fine: exact semantics are the point.

Semantics (the contract the compiled kernels are tested against):

* Outputs and temporaries start zero-filled; statements run in order. A statement's
  right-hand side is evaluated over its domain (output variables x reduction variables) and
  sees the tensors as they were before the statement (after the identity fill of a ``!``
  reduction), also where it reads its own target at other points. ``=`` writes, ``op=!``
  fills the written region with the operator's identity first, ``op=`` accumulates into the
  existing values; a reduction with no reduction variable is ``=`` with ``!`` (no fill) and an
  in-place update without.
* Every expression is computed in its checked type (``expr.type``) with C-like arithmetic:
  operands are converted to the operation's type, integers wrap, float32 stays float32,
  ``bool`` arithmetic is done in int32 and converted back (non-zero is true). Index values
  (``i * N + j``: index and size variables, dimensions, literals) are the exception: their type
  is int32, as in TC, but they are computed exactly in int64; range inference's bind refuses
  sizes for which one used as an int32 value would not fit, and a cast (``int64(i * N)``) or a
  subscript takes the exact value.
* Integer ``/`` and ``%`` truncate toward zero (C) in value expressions and round toward
  negative infinity (TC) inside tensor index expressions; ``MIN / -1`` wraps to ``MIN``,
  ``MIN % -1`` is 0. Division or modulo by zero raises :class:`~tcpy.TCRuntimeError`.
  ``%`` on floats is C's ``fmod``.
* ``c ? a : b`` is lazy, and ``&&`` / ``||`` short-circuit: the branch not taken is evaluated
  under a mask and never reads memory, divides by zero or raises.
* A tensor read whose index is out of bounds at a point that is evaluated raises
  :class:`~tcpy.TCRuntimeError` ("index out of bounds"). For data-dependent indices
  (``B(C(i))``) that is the run-time check compiled kernels do; for the other accesses range
  inference should have made it impossible, so the message says it is a bug in tcpy.
* Reductions accumulate in the output type, except ``half`` which accumulates in float32 and
  is rounded once at the end. Identities: ``+`` 0, ``*`` 1, ``max`` -inf / the type's
  minimum, ``min`` +inf / the type's maximum (``bool``: or / and). Empty domains give the
  identity. ``max``/``min`` (calls and reductions) propagate NaN like ``numpy.maximum``; a
  ``max(a, b)`` call returns ``a`` on a tie (``max(0.0, -0.0)`` is ``0.0``), as the C runtime
  does; ``fmax``/``fmin`` ignore a NaN operand. (The sign of a zero that a max/min *reduction*
  returns from ``+0`` and ``-0`` depends on the order of evaluation, in any backend.)
* Explicit casts: float -> int truncates toward zero and saturates, NaN -> 0; int -> int
  saturates; anything -> bool is ``x != 0``. Implicit conversions (operand promotion, storing
  into the target) are C's: int -> int wraps.
* Builtins are computed in double and rounded once to their checked type (float32 or
  float64), which is what a correctly rounded libm gives.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

import numpy as np

from .binding import bind_arguments, numpy_dtype
from .errors import TCArgumentError, TCProgramError, TCRuntimeError
from .lang import ast as A
from .lang.types import INDEX_VALUE_TYPE, ScalarType, accumulator_type, promote
from .lang.visit import exact_index_value, inline_lets, is_index_value, reads_tensor

__all__ = ["ReferenceKernel", "define_reference", "evaluate"]

BOOL = ScalarType.BOOL
INT32 = ScalarType.INT32

_REDUCERS = {"+": np.add, "*": np.multiply, "min": np.minimum, "max": np.maximum}


def identity(op: str, t: ScalarType) -> np.ndarray:
    """The identity of reduction ``op`` ("+", "*", "min", "max") as a 0-d array of type ``t``."""
    dt = numpy_dtype(t)
    if op == "+":
        return np.zeros((), dt)
    if op == "*":
        return np.ones((), dt)
    if t is BOOL:
        return np.array(op == "min", dt)
    if t.is_float:
        return np.array(-np.inf if op == "max" else np.inf, dt)
    info = np.iinfo(dt)
    return np.array(info.min if op == "max" else info.max, dt)


def convert(x, src: ScalarType, dst: ScalarType, *, explicit: bool = False) -> np.ndarray:
    """Convert values of type ``src`` to ``dst``.

    Implicit conversions are C's (int -> int wraps); explicit casts saturate int -> int.
    float -> int always truncates toward zero and saturates, NaN -> 0 (C leaves out-of-range
    values undefined; tcpy's runtime defines them this way). x -> bool is ``x != 0``.
    """
    x = np.asarray(x)
    dt = numpy_dtype(dst)
    if dst is BOOL:
        return x != 0
    if src is dst and x.dtype == dt:
        return x
    if dst.is_float or src is BOOL:
        return x.astype(dt)
    info = np.iinfo(dt)
    if src.is_float:
        t = np.trunc(x.astype(np.float64))  # float64 holds every float16/32 value exactly
        nan = np.isnan(t)
        high = t >= float(info.max) + 1.0  # an exact power of two
        low = t < float(info.min)
        safe = np.where(nan | high | low, 0.0, t).astype(dt)
        return np.where(high, info.max, np.where(low, info.min, safe)).astype(dt)
    if not explicit:
        return x.astype(dt)  # two's complement wrap, as C does
    if x.dtype == np.uint64:
        return np.where(x > np.uint64(info.max), info.max, x).astype(dt) if info.max < 2**64 - 1 else x
    wide = x.astype(np.int64)
    if dt == np.uint64:
        return np.where(wide < 0, 0, wide).astype(dt)
    return np.clip(wide, info.min, info.max).astype(dt)


# ----------------------------------------------------------------------------- builtins


def _vectorize(fn):
    """A float64 elementwise function from a scalar one (math module), NaN-safe."""

    def safe(v):
        try:
            return fn(v)
        except (ValueError, OverflowError):
            return math.nan

    ufunc = np.frompyfunc(safe, 1, 1)
    return lambda x: np.asarray(ufunc(np.asarray(x, np.float64)), np.float64)


def _c_round(x):
    """C's round(): halfway cases away from zero."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t).astype(x.dtype)  # round(-0.25) is -0.0


def _logb(x):
    mantissa, exponent = np.frexp(x)
    out = (exponent - 1).astype(x.dtype)
    out = np.where(x == 0, -np.inf, out)
    return np.where(np.isfinite(x), out, np.abs(x)).astype(x.dtype)


def _sinpi(x):
    r = np.fmod(x, 2)  # exact; keeps sin(pi * n) exactly zero
    out = np.sin(np.pi * r.astype(np.float64))
    out = np.where(r == np.floor(r), np.copysign(0.0, x), out)
    out = np.where((r == 0.5) | (r == -1.5), 1.0, out)
    return np.where((r == -0.5) | (r == 1.5), -1.0, out)


def _cospi(x):
    r = np.abs(np.fmod(x, 2))
    out = np.cos(np.pi * r.astype(np.float64))
    out = np.where((r == 0.5) | (r == 1.5), 0.0, out)
    out = np.where(r == 0, 1.0, out)
    return np.where(r == 1, -1.0, out)


def _safe_remainder(a: float, b: float) -> float:
    try:
        return math.remainder(a, b)
    except (ValueError, OverflowError):
        return math.nan


_REMAINDER = np.frompyfunc(_safe_remainder, 2, 1)
_NORMAL = statistics.NormalDist()


def _ndtri(p: float) -> float:
    if math.isnan(p) or p < 0 or p > 1:
        return math.nan
    if p == 0:
        return -math.inf
    if p == 1:
        return math.inf
    return _NORMAL.inv_cdf(p)


def _bessel_i(nu):
    def f(x: float) -> float:  # power series; fine for the moderate arguments tests use
        q, term = 0.25 * x * x, (0.5 * x if nu else 1.0)
        total, k = term, 1
        while k < 500 and abs(term) > abs(total) * 1e-17:
            term *= q / (k * (k + nu))
            total += term
            k += 1
        return total

    return f


def _bessel_j(nu):
    def f(x: float) -> float:  # (1/pi) int_0^pi cos(nu t - x sin t) dt, trapezoid (periodic)
        if not math.isfinite(x):
            return 0.0 if math.isinf(x) else math.nan
        n = 64 + 2 * int(abs(x))
        t = np.linspace(0.0, np.pi, n + 1)
        v = np.cos(nu * t - x * np.sin(t))
        return float((v.sum() - 0.5 * (v[0] + v[-1])) * np.pi / n / np.pi)

    return f


def _c_max(a, b):
    """tcpy_runtime.h's max: NaN if either is NaN, else ``a >= b ? a : b`` (a wins a tie such as
    max(0.0, -0.0); numpy.maximum's choice differs between dtypes)."""
    return np.where(a != a, a, np.where(a >= b, a, b))


def _c_min(a, b):
    return np.where(a != a, a, np.where(a <= b, a, b))


# name -> function on float64 arrays. Builtins are computed in double and rounded once to their
# type (float32 or float64): for float32 that is the correctly rounded result glibc's expf, sinf,
# ... return in nearly all cases (NumPy's own float32 SIMD versions can be 1 ulp off).
_BUILTINS = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin,
    "asinh": np.arcsinh, "atan": np.arctan, "atan2": np.arctan2,
    "atanh": np.arctanh, "cbrt": np.cbrt, "ceil": np.ceil,
    "copysign": np.copysign, "cos": np.cos, "cosh": np.cosh,
    "cospi": _cospi, "sinpi": _sinpi,
    "cyl_bessel_i0": _vectorize(_bessel_i(0)), "cyl_bessel_i1": _vectorize(_bessel_i(1)),
    "erf": _vectorize(math.erf), "erfc": _vectorize(math.erfc),
    "erfinv": lambda x: _vectorize(_ndtri)((x + 1.0) / 2.0) / math.sqrt(2.0),
    "erfcinv": lambda x: -_vectorize(_ndtri)(x / 2.0) / math.sqrt(2.0),
    "erfcx": lambda x: np.exp(x * x) * _vectorize(math.erfc)(x),
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x),
    "expm1": np.expm1, "fabs": np.fabs,
    "fdim": lambda a, b: np.where(np.isnan(a) | np.isnan(b), a + b, np.where(a > b, a - b, 0 * a)),
    "fdivide": np.divide, "floor": np.floor,
    "fma": lambda a, b, c: a * b + c, "fmax": np.fmax, "fmin": np.fmin,
    "fmod": np.fmod, "hypot": np.hypot,
    "j0": _vectorize(_bessel_j(0)), "j1": _vectorize(_bessel_j(1)),
    "lgamma": _vectorize(lambda x: math.inf if x <= 0 and x == int(x) else math.lgamma(x)),
    "tgamma": _vectorize(lambda x: math.copysign(math.inf, x) if x == 0 else
                         math.inf if x > 171.7 else math.gamma(x)),
    "log": np.log, "log10": np.log10, "log1p": np.log1p,
    "log2": np.log2, "logb": _logb, "nextafter": np.nextafter,
    "norm3d": lambda a, b, c: np.hypot(np.hypot(a, b), c),
    "norm4d": lambda a, b, c, d: np.hypot(np.hypot(a, b), np.hypot(c, d)),
    "rnorm3d": lambda a, b, c: 1.0 / np.hypot(np.hypot(a, b), c),
    "rnorm4d": lambda a, b, c, d: 1.0 / np.hypot(np.hypot(a, b), np.hypot(c, d)),
    "normcdf": lambda x: 0.5 * _vectorize(math.erfc)(-x / math.sqrt(2.0)),
    "normcdfinv": _vectorize(_ndtri),
    "pow": np.power, "rcbrt": lambda x: 1.0 / np.cbrt(x),
    "remainder": lambda a, b: np.asarray(_REMAINDER(a, b), np.float64),
    "rhypot": lambda a, b: 1.0 / np.hypot(a, b), "round": _c_round,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "sin": np.sin, "sinh": np.sinh,
    "sqrt": np.sqrt, "tan": np.tan, "tanh": np.tanh,
    "trunc": np.trunc,
    # Not TC builtins: the min/max operators, which propagate NaN.
    "min": lambda a, b: _c_min(a, b), "max": lambda a, b: _c_max(a, b),
}




# ----------------------------------------------------------------------------- evaluation


# Builtins whose result depends on the precision they are computed in.
_IN_OWN_TYPE = frozenset({"nextafter"})


def _live(mask) -> bool:
    return mask is None or bool(np.any(mask))


def _and(mask, cond):
    return cond if mask is None else mask & cond


class _StatementEvaluator:
    """Evaluates the expressions of one statement over its domain, vectorized."""

    def __init__(self, def_: A.Def, env: dict, sizes: dict, axes: dict, domain_shape: tuple):
        self.def_ = def_
        self.env = env
        self.sizes = sizes
        self.axes = axes  # index var -> int64 array shaped to broadcast along its axis
        self.domain_shape = domain_shape

    # Each method returns an array broadcastable to the domain, of dtype expr.type.
    # ``mask`` (None = everywhere) marks the points where the value is actually needed.
    def value(self, e: A.Expr, mask, index: bool = False) -> np.ndarray:
        t = e.type
        if isinstance(e, A.IntLit):
            return np.array(e.value).astype(numpy_dtype(t))
        if isinstance(e, A.FloatLit):
            return np.array(e.value, numpy_dtype(t))
        if t is not INDEX_VALUE_TYPE and is_index_value(e):  # exact in 64 bits, then int32 (checked to fit)
            return convert(self.value(exact_index_value(e), mask, index), INDEX_VALUE_TYPE, t)
        if isinstance(e, A.IndexVar):
            return convert(self.axes[e.name], INDEX_VALUE_TYPE, t)
        if isinstance(e, A.SizeVar):
            return np.array(self.sizes[e.name]).astype(numpy_dtype(t))
        if isinstance(e, A.DimRef):
            return np.array(self.env[e.tensor].shape[e.dim]).astype(numpy_dtype(t))
        if isinstance(e, A.Access):
            return self.access(e, mask)
        if isinstance(e, A.Cast):
            operand = exact_index_value(e.operand)
            return convert(self.value(operand, mask, index), operand.type, e.to, explicit=True)
        if isinstance(e, A.Unary):
            x = self.value(e.operand, mask, index)
            if e.op == "!":
                return convert(x, e.operand.type, BOOL) == 0
            if t is BOOL:  # -b is non-zero exactly when b is
                return convert(x, e.operand.type, BOOL)
            return np.negative(convert(x, e.operand.type, t))
        if isinstance(e, A.Binary):
            return self.binary(e, mask, index)
        if isinstance(e, A.Ternary):
            cond = convert(self.value(e.cond, mask, index), e.cond.type, BOOL)
            then_mask, other_mask = _and(mask, cond), _and(mask, ~cond)
            then = self.branch(e.then, then_mask, t, index)
            other = self.branch(e.other, other_mask, t, index)
            return np.where(cond, then, other).astype(numpy_dtype(t))
        if isinstance(e, A.Call):
            return self.call(e, mask, index)
        raise TypeError(f"reference evaluator: unexpected node {type(e).__name__} (is the def checked?)")

    def branch(self, e: A.Expr, mask, t: ScalarType, index: bool) -> np.ndarray:
        """A lazily evaluated operand: nothing is computed where ``mask`` is false everywhere."""
        if not _live(mask):
            return np.zeros((), numpy_dtype(t))
        return convert(self.value(e, mask, index), e.type, t)

    def binary(self, e: A.Binary, mask, index: bool) -> np.ndarray:
        op, t = e.op, e.type
        if op in ("&&", "||"):
            lhs = convert(self.value(e.lhs, mask, index), e.lhs.type, BOOL)
            rest = _and(mask, lhs if op == "&&" else ~lhs)  # short circuit
            rhs = self.branch(e.rhs, rest, BOOL, index)
            return (lhs & rhs) if op == "&&" else (lhs | rhs)
        lhs = self.value(e.lhs, mask, index)
        rhs = self.value(e.rhs, mask, index)
        if op in ("<", ">", "<=", ">=", "==", "!="):
            common = promote(e.lhs.type, e.rhs.type)
            a, b = convert(lhs, e.lhs.type, common), convert(rhs, e.rhs.type, common)
            return {"<": np.less, ">": np.greater, "<=": np.less_equal, ">=": np.greater_equal,
                    "==": np.equal, "!=": np.not_equal}[op](a, b)
        work = INT32 if t is BOOL else t  # C computes bool arithmetic in int
        a, b = convert(lhs, e.lhs.type, work), convert(rhs, e.rhs.type, work)
        if op == "+":
            out = a + b
        elif op == "-":
            out = a - b
        elif op == "*":
            out = a * b
        elif work.is_float:
            out = a / b if op == "/" else np.fmod(a, b)
        else:
            out = self.int_divide(e, op, a, b, mask, floor=index)
        return convert(np.asarray(out).astype(numpy_dtype(work)), work, t)

    def int_divide(self, e, op, a, b, mask, floor: bool) -> np.ndarray:
        zero = b == 0
        if np.any(_and(mask, zero) if mask is not None else zero):
            kind = "division" if op == "/" else "modulo"
            point = self.first_point(_and(mask, zero) if mask is not None else zero)
            raise TCRuntimeError(
                f"in def '{self.def_.name}': integer {kind} by zero in '{e}'{point}")
        b = np.where(zero, np.ones((), b.dtype), b)  # masked-out points: any divisor will do
        q = np.floor_divide(a, b)
        r = a - q * b  # floor remainder (wraps only for MIN / -1, fixed below)
        if not floor and a.dtype.kind == "i":
            fix = (r != 0) & ((a < 0) != (b < 0))
            q = np.where(fix, q + 1, q)
            r = np.where(fix, r - b, r)
        if a.dtype.kind == "i":  # MIN / -1 wraps to MIN, MIN % -1 is 0
            info = np.iinfo(a.dtype)
            overflow = (a == info.min) & (b == -1)
            q = np.where(overflow, a, q)
            r = np.where(overflow, 0, r)
        return (q if op == "/" else r).astype(a.dtype)

    def call(self, e: A.Call, mask, index: bool) -> np.ndarray:
        t = e.type
        args = [self.value(a, mask, index) for a in e.args]
        if e.func in ("min", "max") and not t.is_float:
            work = INT32 if t is BOOL else t
            a, b = (convert(x, arg.type, work) for x, arg in zip(args, e.args))
            fn = _c_min if e.func == "min" else _c_max
            return convert(fn(a, b), work, t)
        if e.func not in _BUILTINS:
            raise TypeError(f"reference evaluator: unknown builtin '{e.func}'")
        fn = _BUILTINS[e.func]
        work = t if e.func in _IN_OWN_TYPE else ScalarType.FLOAT64
        xs = [convert(x, arg.type, work) for x, arg in zip(args, e.args)]
        return convert(np.asarray(fn(*xs)).astype(numpy_dtype(work)), work, t)

    def access(self, e: A.Access, mask) -> np.ndarray:
        array = self.env[e.tensor]
        if not e.indices:
            return np.asarray(array[()])
        indices = [self.value(exact_index_value(i), mask, index=True) for i in e.indices]
        safe = []
        for dim, (ix, size) in enumerate(zip(indices, array.shape)):
            bad = (ix < 0) | (ix >= size)
            live_bad = bad if mask is None else bad & mask
            if np.any(live_bad):
                self.out_of_bounds(e, dim, ix, size, live_bad)
            safe.append(np.where(bad, 0, ix).astype(np.int64))
        if array.size == 0:  # nothing is read (every point is masked out)
            return np.zeros(np.broadcast_shapes(*(i.shape for i in safe)), array.dtype)
        return array[tuple(safe)]

    def out_of_bounds(self, e: A.Access, dim: int, ix, size: int, live_bad) -> None:
        where = np.broadcast_to(live_bad, np.broadcast_shapes(live_bad.shape, np.shape(ix)))
        first = tuple(np.argwhere(where)[0])
        value = int(np.broadcast_to(ix, where.shape)[first])
        data_dependent = any(reads_tensor(i) for i in e.indices)
        why = "" if data_dependent else (
            " (this index does not depend on tensor values, so range inference should have"
            " excluded it: this is a bug in tcpy, please report it)")
        raise TCRuntimeError(
            f"in def '{self.def_.name}': index out of bounds: {e} reads {e.tensor} at index "
            f"{value} of dimension {dim}, whose size is {size}{self.first_point(live_bad)}{why}")

    def first_point(self, where) -> str:
        """`` at i=1, k=0``: the first domain point where ``where`` holds."""
        where = np.broadcast_to(where, self.domain_shape) if self.domain_shape else np.asarray(where)
        hits = np.argwhere(where)
        if hits.size == 0 or not self.axes:
            return ""
        point = hits[0]
        parts = [f"{v}={int(np.ravel(a)[point[k]])}" for k, (v, a) in enumerate(self.axes.items())]
        return " at " + ", ".join(parts)


def _run_statement(def_: A.Def, stmt: A.Stmt, ranges: dict, env: dict, sizes: dict,
                   reverse: bool = False) -> None:
    stmt = inline_lets(stmt)
    names = stmt.index_vars
    n_out = len(stmt.output_vars)
    bounds = [tuple(int(b) for b in ranges[v]) for v in names]
    extents = tuple(max(0, hi - lo) for lo, hi in bounds)
    axes = {}
    for k, (v, (lo, hi)) in enumerate(zip(names, bounds)):
        shape = [1] * len(names)
        shape[k] = extents[k]
        axes[v] = np.arange(lo, lo + extents[k], dtype=np.int64).reshape(shape)
    target = env[stmt.target]
    out_t = def_.tensor(stmt.target).scalar
    if 0 in extents[:n_out]:
        return  # nothing is written
    for d, (lo, hi) in enumerate(bounds[:n_out]):
        if lo < 0 or hi > target.shape[d]:
            raise TCRuntimeError(
                f"in def '{def_.name}': statement '{stmt}' writes {stmt.target} dimension {d} over "
                f"[{lo}, {hi}) but its size is {target.shape[d]} (a bug in tcpy's range inference)")
    region = tuple(slice(lo, hi) for lo, hi in bounds[:n_out])
    evaluator = _StatementEvaluator(def_, env, sizes, axes, extents)
    if stmt.reduction is None or (stmt.init and len(names) == n_out):
        # (a `!` reduction with no reduction variable is `=`: its right-hand side sees no fill)
        if len(names) > n_out:
            raise TypeError(f"reference evaluator: '{stmt}' has reduction variables but no reduction")
        value = evaluator.value(stmt.rhs, None)
        target[region] = np.broadcast_to(convert(value, stmt.rhs.type, out_t), extents)
        return
    acc_t = accumulator_type(out_t)
    ufunc = _REDUCERS[stmt.reduction]
    ident = identity(stmt.reduction, acc_t)
    if stmt.init:  # the identity fill happens first: the right-hand side sees it
        target[region] = convert(ident, acc_t, out_t)
        base = ident
    else:
        base = convert(target[region], out_t, acc_t)
    if 0 in extents:
        reduced = ident
    else:
        value = convert(evaluator.value(stmt.rhs, None), stmt.rhs.type, acc_t)
        value = np.broadcast_to(value, extents)
        if reverse:  # another valid order (reductions are associative and commutative):
            # strictly sequential, last point first, instead of NumPy's pairwise summation
            flat = np.reshape(value, extents[:n_out] + (-1,))[..., ::-1]
            reduced = ufunc.accumulate(flat, axis=-1, dtype=numpy_dtype(acc_t))[..., -1]
        else:
            reduced = ufunc.reduce(value, axis=tuple(range(n_out, len(names))), dtype=numpy_dtype(acc_t))
    result = ufunc(base, reduced, dtype=numpy_dtype(acc_t))
    target[region] = np.broadcast_to(convert(result, acc_t, out_t), extents[:n_out])


def _shape_view(shape, dtype) -> np.ndarray:
    """A read-only array of ``shape`` that takes no memory (for explain() with shapes only)."""
    shape = tuple(int(s) for s in shape)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, (0,) * len(shape), writeable=False)


class ReferenceKernel:
    """A TC def evaluated directly from its AST with NumPy: ``kernel(*arrays, out=None)``.

    ``reverse_reductions=True`` reduces sequentially from the last point to the first (the
    default is NumPy's pairwise order): another valid evaluation of the
    same program, whose difference from the default one shows how much rounding (or which
    inf/NaN/signed-zero outcomes) a result legitimately depends on the order of reduction.
    """

    backend = "reference"

    def __init__(self, def_: A.Def, source: Optional[str] = None, *, reverse_reductions: bool = False):
        from .ranges import infer

        self.def_ = def_
        self.reverse_reductions = reverse_reductions
        try:
            self.ranges = infer(def_)
        except TCProgramError as err:  # show the offending line when the source is known
            raise err.located(source) if source else err

    @property
    def name(self) -> str:
        return self.def_.name

    def __repr__(self) -> str:
        return f"<tcpy reference kernel {self.def_.signature()}>"

    def bind(self, args: Sequence) -> tuple[list[np.ndarray], dict, object]:
        """Check ``args`` like a compiled kernel; return (arrays, sizes, bound ranges)."""
        arrays, sizes = bind_arguments(self.def_, args)
        return arrays, sizes, self.ranges.bind(sizes)

    def __call__(self, *args, out=None, **keywords):
        if keywords:
            raise TCArgumentError(f"in def '{self.name}': kernels take their arrays by position; got keyword "
                                  f"argument{'s' if len(keywords) > 1 else ''} {', '.join(map(repr, keywords))}")
        from .lang.sema import caller_accumulations

        arrays, sizes, bound = self.bind(args)
        def_ = self.def_
        # a bool byte other than 0 or 1 (a uint8 array viewed as bool) is true, as in C
        env = {info.name: np.asarray(a) if a.dtype != np.bool_ else a.view(np.uint8) != 0
               for info, a in zip(def_.inputs, arrays)}
        for info in def_.outputs + def_.temporaries:
            env[info.name] = np.zeros(bound.shapes[info.name], numpy_dtype(info.scalar))
        outs = None if out is None else self._check_out(out, [env[info.name] for info in def_.outputs])
        if outs is not None:  # TC's `+=` into a fresh output adds to the caller's values
            accumulated = {s.target for s in caller_accumulations(def_)}
            for info, given in zip(def_.outputs, outs):
                if info.name in accumulated:
                    env[info.name] = given.copy() if given.dtype != np.bool_ else given.view(np.uint8) != 0
        with np.errstate(all="ignore"):
            for stmt, ranges in zip(def_.stmts, bound.statements):
                _run_statement(def_, stmt, ranges, env, sizes, self.reverse_reductions)
        results = tuple(env[info.name] for info in def_.outputs)
        if outs is not None:
            for given, result in zip(outs, results):
                np.copyto(given, result)
            results = outs
        return results[0] if len(results) == 1 else results

    def _check_out(self, out, results) -> tuple:
        """The caller's out= arrays, checked against the outputs' shapes and dtypes."""
        outs = (out,) if isinstance(out, np.ndarray) else tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(outs) != len(results):
            raise TCArgumentError(
                f"in def '{self.name}': out= needs {len(results)} array(s), got {len(outs)}")
        for info, given, result in zip(self.def_.outputs, outs, results):
            if not isinstance(given, np.ndarray):
                raise TCArgumentError(
                    f"in def '{self.name}': out= for output '{info.name}' must be a numpy array, "
                    f"got {type(given).__name__}")
            if given.dtype != result.dtype or given.shape != result.shape:
                raise TCArgumentError(
                    f"in def '{self.name}': out= for output '{info.name}' must be {result.dtype} "
                    f"with shape {result.shape}, got {given.dtype} with shape {given.shape}")
            if not given.flags.writeable:
                raise TCArgumentError(f"in def '{self.name}': out= for output '{info.name}' is read-only")
        return outs

    def explain(self, *arrays_or_shapes) -> str:
        """Each statement's index ranges (symbolic, and bound when arguments are given), the
        output shapes and the preconditions. Arguments may be arrays, numbers or shape tuples."""
        from .ranges import explain

        sizes = None
        if arrays_or_shapes:
            args = [
                _shape_view(a, numpy_dtype(info.scalar)) if isinstance(a, tuple) else a
                for info, a in zip(self.def_.inputs, arrays_or_shapes)
            ] + list(arrays_or_shapes[len(self.def_.inputs):])
            _, sizes, _ = self.bind(args)
        return explain(self.ranges, sizes) + "\nbackend: reference (NumPy, no code generation)"


def define_reference(def_: A.Def, source: Optional[str] = None, *,
                     reverse_reductions: bool = False) -> ReferenceKernel:
    """A callable kernel that evaluates the checked def ``def_`` with the reference evaluator.

    ``source`` (the program text) only makes range errors show the offending line;
    ``reverse_reductions``: see :class:`ReferenceKernel`.
    """
    return ReferenceKernel(def_, source, reverse_reductions=reverse_reductions)


def evaluate(def_: A.Def, args: Sequence, *, out=None):
    """Evaluate the checked def ``def_`` on ``args``: one array, or a tuple for several outputs."""
    return ReferenceKernel(def_)(*args, out=out)
