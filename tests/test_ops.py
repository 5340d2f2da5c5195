"""tcpy.ops: PTIR's operations as comprehension builders, checked against NumPy and the contract's
rules (seed 001: accumulation and output dtypes, ties, NaN, clamped dynamic starts, negative axes,
empty axes, interior padding, cast rules) and its rejections."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcpy
import tcpy.ops as ops
from tcpy.ops import eager, tensor

RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def same(got, want):
    """Exact shape, dtype and values (NaN where NumPy has NaN)."""
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


def close(got, want, rtol=1e-5, atol=1e-6):
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- the builders' contract


def test_builder_returns_a_kernel_with_its_tc_source():
    k = ops.reduce(tensor(("B", "N"), "f32"), "sum", axes=-1)
    assert isinstance(k, tcpy.Kernel)
    assert "def ptir_reduce(float(B, N) in0)" in k.source and "+=!" in k.source
    x = rand(3, 5)
    close(k(x), x.sum(-1))
    y = rand(2, 7)
    close(k(y), y.sum(-1))      # one kernel, any B and N


def test_dtype_names_and_rejections():
    assert ops.tensor((2,), "si32").dtype.numpy_name == "int32"
    assert ops.tensor((2,), np.float16).dtype.numpy_name == "float16"
    assert ops.tensor((2,), "i1").dtype.numpy_name == "bool"
    with pytest.raises(tcpy.TCOpError, match="dtype bf16 is not supported by tcpy kernels; expected one of"):
        ops.tensor((2,), "bf16")
    with pytest.raises(tcpy.TCOpError, match="symbolic size is a name starting with an upper-case letter.*'n'"):
        ops.tensor(("n",))
    with pytest.raises(tcpy.TCOpError, match=r"dimension 0 of the shape must be >= 0, got -1"):
        ops.tensor((-1,))
    with pytest.raises(tcpy.TCOpError, match="x must be a tensor description"):
        ops.neg([1.0, 2.0])


# ----------------------------------------------------------------------------- element-wise


@pytest.mark.parametrize("op, ref", [
    ("neg", np.negative), ("abs", np.abs), ("exp", np.exp), ("log", np.log), ("tanh", np.tanh),
    ("erf", np.vectorize(math.erf, otypes=[np.float32])), ("rsqrt", lambda x: 1 / np.sqrt(x)),
    ("reciprocal", np.reciprocal)])
def test_unary_against_numpy(op, ref):
    x = np.abs(rand(4, 5)) + np.float32(0.1) if op in ("log", "rsqrt") else rand(4, 5)
    close(eager.unary(x, op), ref(x).astype(np.float32), rtol=2e-6)


def test_unary_keeps_half_and_integer_dtypes():
    h = rand(7).astype(np.float16)
    close(eager.exp(h), np.exp(h), rtol=1e-3)
    i = np.array([-128, -5, 0, 7], np.int8)
    same(eager.abs(i), np.abs(i))      # -128 wraps, as in NumPy
    same(eager.neg(i), np.negative(i))
    with pytest.raises(tcpy.TCOpError, match="unary exp: x must have a float dtype, got int8"):
        ops.exp(i)
    with pytest.raises(tcpy.TCOpError, match="unary: op must be one of neg, abs"):
        ops.unary(h, "sin")


def test_binary_ops_and_nan_in_maximum_minimum():
    a = np.array([1, np.nan, 3, -np.inf, 2], np.float32)
    b = np.array([2, 0, np.nan, 1, np.inf], np.float32)
    for op, ref in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide),
                    ("maximum", np.maximum), ("minimum", np.minimum)):
        same(eager.binary(a, b, op), ref(a, b))
        same(eager.binary(b, a, op), ref(b, a))   # NaN propagates from either side


def test_integer_division_truncates_and_rejects_zero():
    a = np.array([-7, 7, -7, 6], np.int32)
    b = np.array([2, -2, -2, 3], np.int32)
    same(eager.div(a, b), (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(np.int32))
    with pytest.raises(tcpy.TCRuntimeError, match="integer division by zero"):
        eager.div(a, np.array([1, 0, 1, 1], np.int32))


def test_elementwise_rejects_implicit_broadcast_and_promotion():
    with pytest.raises(tcpy.TCOpError, match=r"binary add: rhs must have the shape of lhs \(3, 4\), got \(4,\) "
                                             r"\(use broadcast_to\)"):
        ops.add(tensor((3, 4)), tensor((4,)))
    with pytest.raises(tcpy.TCOpError, match=r"add: rhs must have the dtype of lhs \(float32\), got float64 "
                                             r"\(insert a cast\)"):
        ops.add(tensor((3,)), tensor((3,), "f64"))
    with pytest.raises(tcpy.TCOpError, match=r"rhs must have the shape of lhs \(N,\), got \(M,\)"):
        ops.add(tensor(("N",)), tensor(("M",)))


def test_compare_follows_ieee_nan_rules():
    a = np.array([1, np.nan, 2, np.nan, 3], np.float32)
    b = np.array([1, 1, np.nan, np.nan, 2], np.float32)
    for op, ref in (("<", np.less), ("<=", np.less_equal), ("==", np.equal), (">=", np.greater_equal),
                    (">", np.greater), ("!=", np.not_equal), ("ne", np.not_equal)):
        same(eager.compare(a, b, op), ref(a, b))
    with pytest.raises(tcpy.TCOpError, match="compare: op must be one of <, <=, ==, >=, >, !="):
        ops.compare(a, b, "<>")


def test_select_and_its_checks():
    p = np.array([True, False, True])
    a, b = rand(3), rand(3)
    same(eager.select(p, a, b), np.where(p, a, b))
    with pytest.raises(tcpy.TCOpError, match="select: pred must have a bool dtype, got float32"):
        ops.select(a, a, b)
    with pytest.raises(tcpy.TCOpError, match=r"select: on_false must have the dtype of on_true \(float32\), got int32"):
        ops.select(p, a, np.zeros(3, np.int32))


def test_cast_rules():
    f = np.array([1e10, -1e10, np.nan, -2.7, 2.7, np.inf], np.float32)
    same(eager.cast(f, "si8"), np.array([127, -128, 0, -2, 2, 127], np.int8))     # truncate, saturate, NaN -> 0
    same(eager.cast(np.array([300, -300, 5], np.int32), "ui8"), np.array([255, 0, 5], np.uint8))  # saturate
    d = np.array([0.1, 1 / 3, 1e-40, 3.4e39], np.float64)
    with np.errstate(over="ignore"):
        same(eager.cast(d, "f32"), d.astype(np.float32))                      # round to nearest even
    same(eager.cast(np.array([2**24 + 1], np.int32), "f32"), np.array([2**24], np.float32))
    same(eager.stop_gradient(d), d)


def test_clamp_with_tensors_and_numbers():
    x = np.array([-2, 0.5, 3, np.nan], np.float32)
    same(eager.clamp(x, -1, 1), np.array([-1, 0.5, 1, np.nan], np.float32))
    lo, hi = np.full(4, -3, np.float32), np.full(4, 2, np.float32)
    same(eager.clamp(x, lo, hi), np.minimum(np.maximum(x, lo), hi))
    same(eager.clamp(x, lo, 0.0), np.minimum(np.maximum(x, lo), 0))
    with pytest.raises(tcpy.TCOpError, match=r"clamp: lo must have the shape of x \(4,\), got \(3,\)"):
        ops.clamp(x, lo[:3], hi)


# ----------------------------------------------------------------------------- reductions


@pytest.mark.parametrize("kind, ref", [("sum", np.sum), ("max", np.max), ("min", np.min)])
def test_reduce_axes_keepdims_negative(kind, ref):
    x = rand(2, 3, 4)
    for axes, keepdims in (((-1,), False), ((0, 2), True), ((-3, 1), False), ((0, 1, 2), False), (1, True)):
        close(eager.reduce(x, kind, axes, keepdims), ref(x, axis=axes, keepdims=keepdims))


def test_reduce_with_no_axes_is_the_cast_value():
    x = rand(2, 3)
    same(eager.reduce(x, "sum", [], out_dtype="f64"), x.astype(np.float64))


def test_reduce_empty_axes_give_identities():
    same(eager.reduce(np.zeros((3, 0), np.float32), "sum", -1), np.zeros(3, np.float32))
    same(eager.reduce(np.zeros((3, 0), np.float32), "max", -1), np.full(3, -np.inf, np.float32))
    same(eager.reduce(np.zeros((3, 0), np.float32), "min", -1), np.full(3, np.inf, np.float32))
    same(eager.reduce(np.zeros((0, 2), np.int16), "max", 0), np.full(2, np.iinfo(np.int16).min, np.int16))
    same(eager.reduce(np.zeros((0, 2), np.int64), "min", 0), np.full(2, np.iinfo(np.int64).max, np.int64))
    same(eager.reduce(np.zeros((0, 2), np.float32), "sum", 1, keepdims=True), np.zeros((0, 1), np.float32))


def test_reduce_max_min_propagate_nan():
    x = rand(3, 6)
    x[0, 0], x[1, 5], x[2, 3] = np.nan, np.nan, np.nan
    for kind, ref in (("max", np.max), ("min", np.min)):
        same(eager.reduce(x, kind, 1), ref(x, axis=1))
        same(eager.reduce(x, kind, 0), ref(x, axis=0))


def test_reduce_accumulator_and_output_dtypes():
    # 4096 + 1 + 1 + ... in f16 would stall at 4096 (its spacing there is 4); PTIR accumulates f16 in f32
    h = np.concatenate([[4096], np.ones(1000)]).astype(np.float16)[None]
    want = np.float16(np.float32(h.astype(np.float32).sum()))
    same(eager.reduce(h, "sum", -1), np.array([want]))
    same(eager.reduce(h, "sum", -1, out_dtype="f32"), np.array([5096], np.float32))
    x = np.array([[1e8, 1, -1e8, 1]], np.float32)  # float32 sums lose the ones; f64 keeps them
    same(eager.reduce(x, "sum", 1, accum_dtype="f64", out_dtype="f64"), np.array([2.0]))
    k = ops.reduce(tensor((1, 4)), "sum", 1, accum_dtype="f64")
    assert "double(in0(" in k.source and "float(v1(" in k.source
    same(k(x), np.array([2.0], np.float32))


def test_reduce_rejects_bad_axes_and_kinds():
    x = tensor((2, 3))
    with pytest.raises(tcpy.TCOpError, match=r"reduce: axes must be in \[-2, 2\) for a rank-2 operand, got 2"):
        ops.reduce(x, "sum", 2)
    with pytest.raises(tcpy.TCOpError, match=r"reduce: axes must be unique, got \[1, -1\] \(normalised \[1, 1\]\)"):
        ops.reduce(x, "sum", [1, -1])
    with pytest.raises(tcpy.TCOpError, match="reduce: kind must be one of sum, max, min, got 'mean'"):
        ops.reduce(x, "mean", 0)
    with pytest.raises(tcpy.TCOpError, match="reduce sum: x must have a float or int or uint dtype, got bool"):
        ops.reduce(tensor((2,), "i1"), "sum", 0)


def test_argmax_argmin_ties_nan_negative_axis_keepdims():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [5, np.nan, 7, np.nan], [-1, -4, -4, 0]], np.float32)
    same(eager.argmax(x, -1), np.array([1, 0, 1, 3]))              # smallest index on ties; first NaN
    same(eager.argmin(x, axis=1), np.array([3, 0, 1, 1]))
    same(eager.argmax(x, 0, keepdims=True, output_dtype="si32"), np.argmax(x, 0)[None].astype(np.int32))
    i = np.array([[4, 9, 9], [1, 0, 0]], np.int32)
    same(eager.argmax(i, -2), np.argmax(i, 0))
    same(eager.argmin(i, -1), np.argmin(i, -1))


def test_argmax_rejects_empty_axis_and_bad_dtype():
    with pytest.raises(tcpy.TCOpError, match=r"argmax: axis 1 must not be empty .* got shape \(3, 0\)"):
        ops.argmax(tensor((3, 0)), 1)
    k = ops.argmax(tensor(("M", "N")), 1)   # symbolic: checked when called
    with pytest.raises(tcpy.TCPreconditionError):
        k(np.zeros((3, 0), np.float32))
    with pytest.raises(tcpy.TCOpError, match="argmax: output_dtype must be si32 or si64, got int16"):
        ops.argmax(tensor((3,)), 0, output_dtype="si16")


def test_dot_general_output_order_and_batches():
    a, b = rand(2, 3, 4, 5), rand(2, 5, 6, 4)
    # batch 0<->0, contract 2<->3 and 3<->1: out [batch, lhs free (3), rhs free (6)]
    got = eager.dot_general(a, b, contracting=([2, 3], [3, 1]), batch=([0], [0]))
    close(got, np.einsum("bmkl,blnk->bmn", a, b), rtol=1e-4, atol=1e-5)
    m, n = rand(3, 4), rand(5, 4)
    close(eager.dot_general(m, n, contracting=([-1], [-1])), m @ n.T, rtol=1e-5)
    close(eager.dot_general(m, n, contracting=([], [])), np.einsum("ij,kl->ijkl", m, n))   # outer product


def test_dot_general_accumulation_dtypes():
    a = RNG.uniform(0, 1, (4, 300)).astype(np.float16)
    b = RNG.uniform(0, 1, (300, 3)).astype(np.float16)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = eager.dot_general(a, b, contracting=([1], [0]), out_dtype="f32")
    close(got, exact.astype(np.float32), rtol=2e-3)
    assert eager.dot_general(a, b, contracting=([1], [0])).dtype == np.float16
    i = RNG.integers(-5, 5, (3, 4)).astype(np.int8)
    same(eager.dot_general(i, i, contracting=([1], [1]), accum_dtype="si32", out_dtype="si32"),
         i.astype(np.int32) @ i.T.astype(np.int32))


def test_dot_general_rejections():
    with pytest.raises(tcpy.TCOpError, match=r"dot_general: contracting axis 1 of lhs \(extent 4\) must match "
                                             r"axis 0 of rhs \(extent 5\)"):
        ops.dot_general(tensor((3, 4)), tensor((5, 2)), contracting=([1], [0]))
    with pytest.raises(tcpy.TCOpError, match=r"contracting axes must pair up, got 1 lhs axes \[1\] and 0 rhs"):
        ops.dot_general(tensor((3, 4)), tensor((4, 2)), contracting=([1], []))
    with pytest.raises(tcpy.TCOpError, match=r"lhs axes \[0\] are both batch and contracting"):
        ops.dot_general(tensor((3, 3)), tensor((3, 3)), contracting=([0], [1]), batch=([0], [0]))
    with pytest.raises(tcpy.TCOpError, match="rhs must have the dtype of lhs"):
        ops.dot_general(tensor((3, 4)), tensor((4, 2), "f64"), contracting=([1], [0]))


# ----------------------------------------------------------------------------- shape and layout


def test_reshape_transpose_broadcast():
    x = rand(2, 3, 4)
    same(eager.reshape(x, (4, -1)), x.reshape(4, -1))
    same(eager.transpose(x, (2, 0, -2)), x.transpose(2, 0, 1))
    r = rand(3, 1)
    same(eager.broadcast_to(r, (2, 3, 5)), np.broadcast_to(r, (2, 3, 5)))
    with pytest.raises(tcpy.TCOpError, match=r"reshape: new_shape \[5, 5\] has 25 elements, x \(2, 3, 4\) has 24"):
        ops.reshape(x, (5, 5))
    with pytest.raises(tcpy.TCOpError, match=r"transpose: perm must be a permutation of \[0, 1, 2\], got \[0, 0, 1\]"):
        ops.transpose(x, (0, 0, 1))
    with pytest.raises(tcpy.TCOpError, match=r"broadcast_to: x \(3, 1\) cannot broadcast to \(2, 5\): axis 0 has 3, "
                                             r"expected 1 or 2"):
        ops.broadcast_to(r, (2, 5))
    with pytest.raises(tcpy.TCOpError, match="reshape: x.shape\\[0\\] must be a concrete size"):
        ops.reshape(tensor(("N", 2)), (-1,))


def test_slice_concat_tile_iota():
    x = rand(4, 5)
    same(eager.slice(x, (1, 0), (2, 5)), x[1:3, 0:5])
    with pytest.raises(tcpy.TCOpError, match=r"slice: axis 1: starts \+ sizes must be <= the extent 5, got 2 \+ 4"):
        ops.slice(x, (0, 2), (1, 4))
    k = ops.slice(tensor(("M", "N")), (0, 2), (1, 4))     # symbolic: a precondition at call time
    with pytest.raises(tcpy.TCPreconditionError):
        k(x)
    y, z = rand(4, 2), rand(4, 1)
    same(eager.concat([x, y, z], axis=-1), np.concatenate([x, y, z], -1))
    same(eager.concat([x], axis=0), x)
    with pytest.raises(tcpy.TCOpError, match=r"concat: xs\[1\] \(4, 2\) must match xs\[0\] \(4, 5\) on every axis "
                                             r"but 0"):
        ops.concat([x, y], axis=0)
    same(eager.tile(y, (2, 3)), np.tile(y, (2, 3)))
    same(eager.iota((2, 3), "si32", axis=-2), np.broadcast_to(np.arange(2, dtype=np.int32)[:, None], (2, 3)))


def test_pad_with_interior_and_negative_values():
    x = rand(3, 2)
    got = eager.pad(x, (1, 0), (2, 1), (2, 1), pad_value=-0.5)
    want = np.full((1 + 3 + 2 + 2 * 2, 0 + 2 + 1 + 1), -0.5, np.float32)
    want[1:1 + 3 * 3:3, 0:3:2] = x
    same(got, want)
    same(eager.pad(x, (0, 2), (1, 0)), np.pad(x, ((0, 1), (2, 0))))
    # the extent with interior padding of an empty axis: low + high
    same(ops.pad(tensor((1, 0)), (0, 1), (0, 2), (0, 3))(np.zeros((1, 0), np.float32)), np.zeros((1, 3), np.float32))
    d = np.zeros(1, np.float64)
    same(eager.pad(d, (1,), (0,), pad_value=0.1), np.array([0.1, 0.0]))   # a double constant, exactly
    i = np.zeros(1, np.int64)
    for big in (-2**40 - 3, -2**63, 2**63 - 1, -2**31, 2**31):
        same(eager.pad(i, (0,), (1,), pad_value=big), np.array([0, big]))
    with pytest.raises(tcpy.TCOpError, match=r"pad: low must have 2 entries \(one per axis\), got 1"):
        ops.pad(x, (1,), (0, 0))
    with pytest.raises(tcpy.TCOpError, match=r"pad: interior must be >= 0, got \[0, -1\]"):
        ops.pad(x, (0, 0), (0, 0), (0, -1))
    with pytest.raises(tcpy.TCOpError, match=r"pad: axis 0 \(interior padding\) must be a concrete size"):
        ops.pad(tensor(("N",)), (0,), (0,), (1,))


# ----------------------------------------------------------------------------- indexing


def test_take_and_gather():
    x = rand(5, 3)
    i = np.array([[4, 0], [2, 2]], np.int64)
    same(eager.take(x, i), x[i])
    g = np.array([[2, 0, 1], [1, 1, 1]], np.int32)
    same(eager.gather(x[:2], g, axis=-1), np.take_along_axis(x[:2], g, -1))
    g0 = np.array([[4, 0, 1]], np.int32)
    same(eager.gather(x, g0, axis=0), np.take_along_axis(x, g0, 0))
    with pytest.raises(tcpy.TCRuntimeError, match="index out of bounds"):
        eager.take(x, np.array([5], np.int64))
    with pytest.raises(tcpy.TCOpError, match="take: indices must be si32 or si64, got float32"):
        ops.take(x, x)


@pytest.mark.parametrize("kind", ["add", "max", "min", "replace"])
def test_scatter_reduce(kind):
    x = rand(4, 3)
    idx = np.array([[0, 3, 0], [0, 1, 3]], np.int32)
    upd = rand(2, 3)
    want = x.copy()
    cols = np.broadcast_to(np.arange(3), idx.shape)
    if kind == "replace":
        want[idx, cols] = upd                   # NumPy's last writer wins too
    else:
        {"add": np.add, "max": np.maximum, "min": np.minimum}[kind].at(want, (idx, cols), upd)
    close(eager.scatter_reduce(x, idx, upd, axis=0, reduce=kind), want)
    with pytest.raises(tcpy.TCRuntimeError, match="index out of bounds"):
        eager.scatter_reduce(x, idx + 1, upd, axis=0, reduce=kind)


def test_scatter_add_checks_shapes():
    close(eager.scatter_add(np.zeros(3, np.float32), np.array([2, 2], np.int64), np.ones(2, np.float32)),
          np.array([0, 0, 2], np.float32))
    with pytest.raises(tcpy.TCOpError, match=r"updates \(2, 2\) must match x \(4, 3\) on every axis but 0"):
        ops.scatter_add(tensor((4, 3)), tensor((2, 2), "si32"), tensor((2, 2)))


def test_dynamic_slice_clamps_starts():
    x = rand(5, 6)
    k = ops.dynamic_slice(tensor((5, 6)), tensor((2,), "si32"), (2, 3))
    for start in ((1, 2), (-4, 1), (9, 9), (4, -1), (3, 3)):
        s0, s1 = min(max(start[0], 0), 3), min(max(start[1], 0), 3)
        same(k(x, np.array(start, np.int32)), x[s0:s0 + 2, s1:s1 + 3])
    with pytest.raises(tcpy.TCOpError, match=r"dynamic_slice: sizes\[1\] must be <= x's extent 6, got 7"):
        ops.dynamic_slice(tensor((5, 6)), tensor((2,), "si32"), (2, 7))
    with pytest.raises(tcpy.TCOpError, match=r"dynamic_slice: start must have shape \(2,\)"):
        ops.dynamic_slice(tensor((5, 6)), tensor((3,), "si32"), (2, 2))
    k = ops.dynamic_slice(tensor(("M", "N")), tensor((2,), "si64"), (2, 3))
    with pytest.raises(tcpy.TCPreconditionError):     # size beyond the extent at call time: rejected
        k(x[:1], np.zeros(2, np.int64))


def test_dynamic_update_slice_clamps_starts():
    x = rand(4, 5)
    u = rand(2, 2)
    k = ops.dynamic_update_slice(tensor(("M", "N")), u, tensor((2,), "si64"))
    for start in ((0, 0), (3, 4), (-2, 2), (10, -10)):
        s0, s1 = min(max(start[0], 0), 2), min(max(start[1], 0), 3)
        want = x.copy()
        want[s0:s0 + 2, s1:s1 + 2] = u
        same(k(x, u, np.array(start, np.int64)), want)
    with pytest.raises(tcpy.TCPreconditionError):     # an update larger than x: rejected
        k(x[:1], u, np.zeros(2, np.int64))


# ----------------------------------------------------------------------------- fused and windowed


def _layer_norm(x, g, b, axis, eps):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis, keepdims=True)
    var = x64.var(axis, keepdims=True)
    shape = [1] * x.ndim
    shape[axis] = -1
    return ((x64 - mean) / np.sqrt(var + eps) * g.reshape(shape) + b.reshape(shape)).astype(x.dtype)


def test_layer_norm_feature_axis_and_half():
    x, g, b = rand(3, 4, 6), rand(6), rand(6)
    close(eager.layer_norm(x, g, b, epsilon=1e-3), _layer_norm(x, g, b, -1, 1e-3), rtol=1e-4, atol=1e-5)
    g4, b4 = rand(4), rand(4)
    close(eager.layer_norm(x, g4, b4, feature_axis=-2), _layer_norm(x, g4, b4, 1, 1e-5), rtol=1e-4, atol=1e-5)
    h = (rand(2, 64) * 10 + 100).astype(np.float16)   # f16 statistics would lose the variance
    close(eager.layer_norm(h, np.ones(64, np.float16), np.zeros(64, np.float16)),
          _layer_norm(h, np.ones(64), np.zeros(64), -1, 1e-5), rtol=2e-2, atol=2e-2)
    with pytest.raises(tcpy.TCOpError, match=r"layer_norm: gamma must have shape \(6,\) \(the feature axis 2"):
        ops.layer_norm(x, rand(4), rand(6))


def test_softmax_and_attention():
    z = rand(3, 7) * 30
    e = np.exp(z - z.max(-1, keepdims=True))
    close(eager.softmax(z), e / e.sum(-1, keepdims=True), rtol=1e-5)
    z16 = z.astype(np.float16)
    e16 = np.exp(z16.astype(np.float32) - z16.max(-1, keepdims=True).astype(np.float32))
    close(eager.softmax(z16), (e16 / e16.sum(-1, keepdims=True)).astype(np.float16), rtol=2e-3, atol=1e-4)
    q, k, v = rand(2, 5, 8), rand(2, 6, 8), rand(2, 6, 8)
    s = np.einsum("bqd,bkd->bqk", q, k) / np.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    close(eager.attention(q, k, v), np.einsum("bqk,bkd->bqd", p, v).astype(np.float32), rtol=1e-4, atol=1e-5)


def _windows(x, window, strides, padding, dilation, fill):
    """NumPy sliding windows: [out..., window...] of x padded with fill."""
    xp = np.pad(x, padding, constant_values=fill)
    spans = [(w - 1) * d + 1 for w, d in zip(window, dilation)]
    view = np.lib.stride_tricks.sliding_window_view(xp, spans)
    view = view[tuple(np.s_[::s] for s in strides)]
    return view[(Ellipsis,) + tuple(np.s_[::d] for d in dilation)]


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_reduce_window(kind):
    x = rand(2, 7, 6)
    window, strides, padding, dilation = (1, 3, 2), (1, 2, 1), ((0, 0), (1, 1), (0, 1)), (1, 1, 2)
    fill = {"sum": 0, "max": -np.inf, "min": np.inf}[kind]
    win = _windows(x, window, strides, padding, dilation, fill)
    want = getattr(win, kind)(axis=(-3, -2, -1))
    close(eager.reduce_window(x, kind, window, strides, padding, dilation), want, rtol=1e-5)
    i = RNG.integers(-9, 9, (5, 5)).astype(np.int32)
    wi = _windows(i, (2, 2), (2, 2), ((1, 0), (0, 1)), (1, 1), {"sum": 0, "max": -2**31, "min": 2**31 - 1}[kind])
    same(eager.reduce_window(i, kind, (2, 2), (2, 2), ((1, 0), (0, 1))),
         getattr(wi, kind)(axis=(-2, -1)).astype(np.int32))


def test_reduce_window_rejections():
    with pytest.raises(tcpy.TCOpError, match=r"reduce_window: window must have 2 entries \(one per axis\), got 1"):
        ops.reduce_window(tensor((4, 4)), "max", (2,))
    with pytest.raises(tcpy.TCOpError, match="axis 1: the window spans 5 elements but the padded extent is 4"):
        ops.reduce_window(tensor((4, 4)), "max", (1, 5))
    with pytest.raises(tcpy.TCOpError, match=r"padding must be 2 \(low, high\) pairs"):
        ops.reduce_window(tensor((4, 4)), "max", (1, 2), padding=(1, 1))


def test_extract_patches_matches_im2col():
    x = rand(2, 5, 6, 3)
    window, strides, padding, dilation = (3, 2), (2, 1), ((1, 1), (0, 1)), (1, 2)
    win = _windows(x, (1,) + window + (1,), (1,) + strides + (1,), ((0, 0),) + padding + ((0, 0),),
                   (1,) + dilation + (1,), 0.5)
    # win: [N, OH, OW, C, 1, KH, KW, 1] -> [N, OH, OW, KH, KW, C]
    want = win[..., 0, :, :, 0].transpose(0, 1, 2, 4, 5, 3).reshape(win.shape[:3] + (-1,))
    same(eager.extract_patches(x, window, strides, padding, dilation, pad_value=0.5), want)
    with pytest.raises(tcpy.TCOpError, match="extract_patches: the channel axis must be a concrete size"):
        ops.extract_patches(tensor((1, 4, 4, "C")), (2, 2))


# ----------------------------------------------------------------------------- composition and eager


def test_compose_builds_one_def_equal_to_the_ops_in_turn():
    x, g, b = rand(4, 8), rand(8), rand(8)

    def block(x, g, b):
        h = ops.layer_norm(x, g, b)
        return ops.reduce(ops.maximum(h, x), "sum", -1), h

    k = ops.compose(block, tensor(("M", 8)), tensor((8,)), tensor((8,)), name="block")
    assert k.source.startswith("def block(float(M, 8) in0, float(8) in1, float(8) in2) -> (")
    total, h = k(x, g, b)
    close(h, eager.layer_norm(x, g, b), rtol=1e-6)
    close(total, eager.reduce(np.maximum(h, x), "sum", -1), rtol=1e-6)
    with pytest.raises(tcpy.TCOpError, match="binary: inside compose, operand lhs must be a value of the composition, got ndarray"):
        ops.compose(lambda v: ops.add(x, v), tensor((4, 8)))
    same(ops.compose(lambda v: v, tensor((3,)))(x[0, :3]), x[0, :3])    # a returned input is copied out


def test_eager_builds_each_signature_once():
    from tcpy.ops.eager import _kernel
    x = rand(3, 4)
    eager.reduce(x, "sum", -1)
    before = _kernel.cache_info()
    eager.reduce(x + 1, "sum", -1)
    after = _kernel.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)
    with pytest.raises(tcpy.TCOpError, match="eager.gather: pass arrays positionally"):
        eager.gather(x, indices=np.zeros((3, 4), np.int32))
    with pytest.raises(AttributeError, match="tcpy.ops has no operation 'while_loop'"):
        eager.while_loop
    assert repr(eager).startswith("<tcpy.ops.eager: ") and "operations" in repr(eager)


def test_eager_tells_apart_attributes_that_compare_equal():
    x = np.ones(2, np.float32)
    assert not np.signbit(eager.mul(x, 0.0)).any() and np.signbit(eager.mul(x, -0.0)).all()
    same(eager.add(np.ones(2, np.int32), 1), np.full(2, 2, np.int32))
    with pytest.raises(tcpy.TCOpError, match="rhs must be a tensor description"):  # a bool is no number operand
        eager.add(np.ones(2, np.int32), True)
    with pytest.raises(tcpy.TCOpError, match=r"the constant np.float32\(0.5\) is not an integer, as int32 needs"):
        eager.add(np.ones(2, np.int32), np.float32(0.5))  # (it was truncated to 0)


def test_eager_on_empty_arrays_speaks_of_the_array():
    empty = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(eager.reduce(empty, "max", axes=0), np.full(3, -np.inf, np.float32))
    assert eager.argmax(empty, axis=1).shape == (0,)
    with pytest.raises(tcpy.TCOpError) as err:  # the kernel's size name for the empty axis stays hidden
        eager.pad(empty, [1, 0], [0, 0], [1, 0])
    assert str(err.value) == ("eager.pad: pad needs the size of axis 0 (interior padding) as a number, and it is 0 "
                              "(an array of shape (0, 3)); pad cannot run on an empty axis, since TC ranges are "
                              "never empty")
    with pytest.raises(tcpy.TCOpError, match=r"argmax: axis 0 must not be empty .*got shape \(0, 3\)"):
        eager.argmax(empty, axis=0)
    with pytest.raises(tcpy.TCOpError, match=r"top_k: k must be an int in \[0, 0\]"):
        eager.top_k(empty, 1, axis=0)
    with pytest.raises(tcpy.TCOpError) as err:  # an empty result from the attributes
        eager.slice(np.ones((2, 3), np.float32), [0, 0], [0, 2])
    assert str(err.value) == ("eager.slice: the attributes give an axis of size 0 ('i0 in 0:0' for a value of shape "
                              "(0, 2)), which tcpy kernels cannot build: TC ranges are never empty")
    with pytest.raises(tcpy.TCOpError, match=r"ptir_reduce: the kernel would loop over 'k0 in 0:0' .* size name"):
        ops.reduce(tensor((0, 3)), "sum", 0)  # (it was TC's range error about the generated source)


# ----------------------------------------------------------------------------- properties


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.data())
def test_reduce_property(shape, data):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), unique_by=lambda a: a % rank, max_size=rank))
    keepdims = data.draw(st.booleans())
    kind = data.draw(st.sampled_from(["sum", "max", "min"]))
    x = rand(*shape)
    if kind != "sum" and any(shape[a] == 0 for a in axes):
        want = np.full(np.sum(x, axis=tuple(axes), keepdims=keepdims).shape,
                       -np.inf if kind == "max" else np.inf, np.float32)
    else:
        want = getattr(np, kind)(x, axis=tuple(axes), keepdims=keepdims)
    close(eager.reduce(x, kind, axes, keepdims), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_pad_and_transpose_property(shape, data):
    rank = len(shape)
    low = data.draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank))
    high = data.draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank))
    interior = data.draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank))
    perm = data.draw(st.permutations(range(rank)))
    x = rand(*shape)
    want = np.full([lo + hi + n + max(n - 1, 0) * g for lo, hi, n, g in zip(low, high, shape, interior)], 9,
                   np.float32)
    want[tuple(np.s_[lo:lo + (n - 1) * (g + 1) + 1:g + 1] for lo, n, g in zip(low, shape, interior))] = x

    k = ops.compose(lambda v: ops.transpose(ops.pad(v, low, high, interior, pad_value=9), perm), tensor(shape))
    same(k(x), want.transpose(perm))


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.data())
def test_argmax_ties_property(m, n, b, axis, data):
    x = data.draw(st.lists(st.integers(0, 2), min_size=m * n * b, max_size=m * n * b))
    x = np.array(x, np.float32).reshape(m, n, b)   # few distinct values: many ties
    same(eager.argmax(x, axis - 3), np.argmax(x, axis))
    same(eager.argmin(x, axis), np.argmin(x, axis))


def test_numbers_as_inline_literal_operands():
    x = rand(5)
    same(eager.mul(x, 0.5), x * np.float32(0.5))
    same(eager.sub(2, np.arange(3, dtype=np.int8)), np.array([2, 1, 0], np.int8))
    k = ops.compose(lambda v: ops.maximum(ops.add(v, 1.0), 0.0), tensor(("N",)))
    same(k(x), np.maximum(x + np.float32(1), 0))
    with pytest.raises(tcpy.TCOpError, match="binary add: at least one of lhs, rhs must be a tensor, got numbers"):
        ops.add(1.0, 2.0)
    with pytest.raises(tcpy.TCOpError, match="x must be a tensor description"):
        ops.neg(1.0)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=0, max_size=4), st.data())
def test_reshape_property(shape, data):
    """Any regrouping of the same elements keeps row-major order (split, merge, unit axes)."""
    count = math.prod(shape)
    new = []
    rest = count
    while rest > 1 or data.draw(st.booleans()) and len(new) < 4:
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        new.append(data.draw(st.sampled_from(divisors)))
        rest //= new[-1]
        if len(new) > 6:
            new.append(rest)
            break
    x = np.arange(count, dtype=np.float32).reshape(shape)
    same(ops.reshape(tensor(shape), new)(x), x.reshape(new))


def test_top_k_order_ties_and_nan():
    x = np.array([[3, 1, np.nan, 3, 2], [0, -1, 5, 5, 4]], np.float32)
    values, indices = eager.top_k(x, 3)
    same(indices, np.array([[2, 0, 3], [2, 3, 4]]))          # NaN first, then ties by index
    same(values, np.take_along_axis(x, indices, -1))
    values, indices = eager.top_k(x.T.copy(), 2, axis=0, largest=False, indices_dtype="si32")
    same(indices, np.array([[1, 1], [4, 0]], np.int32))
    same(values, np.array([[1, -1], [2, 0]], np.float32))
    y = RNG.permutation(40).astype(np.int32).reshape(4, 10)
    same(eager.top_k(y, 4)[1], np.argsort(-y, axis=-1, kind="stable")[:, :4])
    with pytest.raises(tcpy.TCOpError, match=r"top_k: k must be an int in \[0, 5\] \(the extent of axis 1\), got 6"):
        ops.top_k(x, 6)


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_segment_reduce_drops_out_of_range_ids(kind):
    x = rand(6, 3)
    ids = np.array([2, 0, 2, -1, 7, 0], np.int64)
    identity = {"sum": 0, "max": -np.inf, "min": np.inf}[kind]
    want = np.full((4, 3), identity, np.float32)
    for row, s in zip(x, ids):
        if 0 <= s < 4:
            want[s] = {"sum": np.add, "max": np.maximum, "min": np.minimum}[kind](want[s], row)
    close(eager.segment_reduce(x, ids, 4, kind), want)
    with pytest.raises(tcpy.TCOpError, match=r"segment_ids must have shape \(6,\) \(one id per row of x \(6, 3\)\), "
                                             r"got \(5,\)"):
        ops.segment_reduce(x, ids[:5], 4)


BAD_CALLS = [
    (ops.tensor, (2.5,), {}), (ops.tensor, ((2,), None), {}), (ops.cast, (tensor((2,)), "weird"), {}),
    (ops.cast, (tensor((2,)), None), {}), (ops.reduce, (tensor((2,)), "sum", "a"), {}),
    (ops.reduce, (tensor((2,)), "sum", [0.5]), {}), (ops.reduce, (tensor((2,)), "sum", 0), {"accum_dtype": "bogus"}),
    (ops.transpose, (tensor((2, 3)), None), {}), (ops.transpose, (tensor((2, 3)), (0, 5)), {}),
    (ops.reshape, (tensor((2, 3)), "ab"), {}), (ops.reshape, (tensor((2, 3)), (2, -2)), {}),
    (ops.reshape, (tensor((2, 3)), (-1, -1)), {}), (ops.broadcast_to, (tensor((2, 3)), (3,)), {}),
    (ops.slice, (tensor((4,)), (0.5,), (1,)), {}), (ops.slice, (tensor((4,)), (-1,), (1,)), {}),
    (ops.concat, ([],), {}), (ops.concat, (np.zeros(3, np.float32),), {}),
    (ops.concat, ([tensor((2,)), tensor((2,), "f64")],), {}), (ops.pad, (tensor((2,)), None, (0,)), {}),
    (ops.pad, (tensor((2,)), (0,), (0,)), {"pad_value": "x"}), (ops.pad, (tensor((2,), "si32"), (1,), (0,)),
                                                                 {"pad_value": 0.5}),
    (ops.tile, (tensor((2,)), (1, 2)), {}), (ops.iota, ("a",), {}), (ops.iota, ((2, 3),), {"axis": 2}),
    (ops.take, (tensor(()), tensor((2,), "si32")), {}), (ops.gather, (tensor((2, 3)), tensor((2,), "si32")), {}),
    (ops.scatter_reduce, (tensor((3,)), tensor((2,), "si32"), tensor((2,))), {"reduce": "mul"}),
    (ops.dynamic_update_slice, (tensor((3,)), tensor(("N",)), tensor((1,), "si32")), {}),
    (ops.dot_general, (tensor((2, 3)), tensor((3, 2))), {"contracting": 5}),
    (ops.dot_general, (tensor((2, 3)), tensor((3, 2))), {"contracting": ([1], [0]), "batch": ([0], [0, 1])}),
    (ops.layer_norm, (tensor((2, 3)), tensor((3,)), tensor((3,))), {"epsilon": "small"}),
    (ops.layer_norm, (tensor((2, 3), "si32"), tensor((3,), "si32"), tensor((3,), "si32")), {}),
    (ops.attention, (tensor((2, 3)), tensor((2, 3)), tensor((2, 3))), {"scale": "x"}),
    (ops.attention, (tensor(("S", "D")),) * 3, {}), (ops.softmax, (tensor((2,)),), {"axis": 1}),
    (ops.reduce_window, (tensor((4,)), "max", (0,)), {}), (ops.reduce_window, (tensor((4,)), "max", (2,)),
                                                           {"strides": (0,)}),
    (ops.extract_patches, (tensor((4, 4)), (2,)), {}), (ops.top_k, (tensor((4,)), 2), {"indices_dtype": "f32"}),
    (ops.segment_reduce, (tensor((4,)), tensor((4,), "si32"), 0), {}),
    (ops.unary, (tensor((2,)), "exp"), {"bogus": 1}), (ops.compose, (lambda v: 3, tensor((2,))), {}),
    (ops.compose, (lambda v: v, tensor((2,))), {"name": "not a name"}),
]


# how each message of BAD_CALLS begins: what was expected (and, further on, what was found)
BAD_CALL_MESSAGES = [
    'a shape must be a tuple of sizes (ints or si',
    'dtype must be a PTIR dtype (i1, si8, si16, s',
    'dtype must be a PTIR dtype (i1, si8, si16, s',
    'dtype must be a PTIR dtype (i1, si8, si16, s',
    "reduce: axes must be an int, got 'a'",
    'reduce: axes must be an int, got 0.5',
    'accum_dtype must be a PTIR dtype (i1, si8, s',
    'transpose: perm must be a permutation of [0,',
    'transpose: perm entry must be in [-2, 2) for',
    'reshape: new_shape must be a list of ints, g',
    'reshape: new_shape must be >= -1, got [2, -2',
    'reshape: new_shape may infer one dimension (',
    'broadcast_to: the result rank (1) must be at',
    'slice: starts must be a list of 1 ints, got ',
    'slice: starts must be >= 0, got [-1]',
    'xs must be a non-empty list of tensors, got ',
    'xs must be a non-empty list of tensors, got ',
    'concat: xs[1] must have the dtype of xs[0] (',
    'pad: low must be a list of 1 ints, got None',
    "pad: pad_value must be a number, got 'x'",
    'the constant 0.5 is not an integer, as int32',
    'tile: repeats must have 1 entries (one per a',
    "iota: shape must be a list of ints, got 'a'",
    'iota: axis must be in [-2, 2) for a rank-2 o',
    'take: x must have rank >= 1, got rank 0',
    "gather: indices must have x's rank 2, got sh",
    'scatter_reduce: reduce must be one of add, m',
    'dynamic_update_slice: update must have a con',
    'dot_general: contracting must be a pair (lhs',
    'dot_general: batch axes must pair up, got 1 ',
    'layer_norm: epsilon must be a number >= 0, g',
    'layer_norm: x must have a float dtype, got i',
    "attention: scale must be a number, got 'x'",
    'attention: scale must be given when the dept',
    'softmax: axis must be in [-1, 1) for a rank-',
    'reduce_window: window must be >= 1, got [0]',
    'reduce_window: strides must be >= 1, got [0]',
    'extract_patches: x must be [N, spatial..., C',
    'top_k: indices_dtype must be si32 or si64, g',
    'segment_reduce: num_segments must be an int ',
    "unary: got an unexpected keyword argument 'b",
    'composed: output 0 must be a value of the co',
    "compose: name must be an identifier, got 'no",
]


@pytest.mark.parametrize("fn, args, kwargs, message", [(*c, m) for c, m in zip(BAD_CALLS, BAD_CALL_MESSAGES, strict=True)],
                         ids=[f"{i}-{c[0].__name__}" for i, c in enumerate(BAD_CALLS)])
def test_bad_attributes_raise_tcoperror(fn, args, kwargs, message):
    with pytest.raises(tcpy.TCOpError) as raised:
        fn(*args, **kwargs)
    assert str(raised.value).startswith(message)


# a tensor, a list or a number where a name or a list of sizes belongs (they raised TypeError or ValueError)
MISPLACED = [
    (ops.cast, (tensor((2,)), tensor((2,))), {}, "dtype must be a PTIR dtype"),
    (ops.reduce, (tensor((2,)), ["sum"], 0), {}, "reduce: kind must be one of sum, max, min, got ['sum']"),
    (ops.unary, (tensor((2,)), ["exp"]), {}, "got ['exp']"),
    (ops.compare, (tensor((2,)), tensor((2,)), ["<"]), {}, "got ['<']"),
    (ops.scatter_reduce, (tensor((3,)), tensor((2,), "si32"), tensor((2,))), {"reduce": ["add"]},
     "reduce must be one of"),
    (ops.iota, (1.5,), {}, "iota: shape must be a list of ints, got 1.5"),
    (ops.reshape, (tensor((2, 3)), tensor((6,))), {}, "reshape: new_shape must be a list of ints, got float32[6]"),
    (ops.broadcast_to, (tensor((2,)), tensor((2,))), {}, "broadcast_to: shape must be a tuple of sizes"),
]


@pytest.mark.parametrize("fn, args, kwargs, words", MISPLACED, ids=[c[0].__name__ for c in MISPLACED])
def test_misplaced_arguments_raise_tcoperror(fn, args, kwargs, words):
    with pytest.raises(tcpy.TCOpError) as err:
        fn(*args, **kwargs)
    assert words in str(err.value)


@settings(max_examples=8, deadline=None)
@given(st.data())
def test_dot_general_property(data):
    """Random batch/contracting pairings against einsum, output order batch, lhs free, rhs free."""
    nb, nc = data.draw(st.integers(0, 1)), data.draw(st.integers(0, 2))
    lf, rf = data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))
    shared = [data.draw(st.integers(1, 3)) for _ in range(nb + nc)]
    lhs_axes = data.draw(st.permutations(["b"] * nb + ["c"] * nc + ["l"] * lf))
    rhs_axes = data.draw(st.permutations(["b"] * nb + ["c"] * nc + ["r"] * rf))
    letters = {"b": "ab", "c": "cd", "l": "e", "r": "f"}

    def layout(axes):
        seen = {"b": 0, "c": 0, "l": 0, "r": 0}
        subs, shape = "", []
        for kind in axes:
            letter = letters[kind][seen[kind]]
            seen[kind] += 1
            subs += letter
            shape.append(shared["abcd".index(letter) - (0 if letter in "ab" else 2 - nb)]
                         if letter in "abcd" else 2 + (letter == "f"))
        return subs, shape

    ls, lshape = layout(lhs_axes)
    rs, rshape = layout(rhs_axes)
    lhs, rhs = rand(*lshape), rand(*rshape)
    batch = ([ls.index(c) for c in "ab"[:nb]], [rs.index(c) for c in "ab"[:nb]])
    contracting = ([ls.index(c) for c in "cd"[:nc]], [rs.index(c) for c in "cd"[:nc]])
    out = "ab"[:nb] + "e" * lf + "f" * rf
    close(eager.dot_general(lhs, rhs, contracting=contracting, batch=batch),
          np.einsum(f"{ls},{rs}->{out}", lhs, rhs), rtol=1e-5, atol=1e-5)
