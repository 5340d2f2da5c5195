"""The reference evaluator against hand-written NumPy: standard kernels, every dtype, the
semantics decisions (integer division, casts, identities, NaN, laziness) and its errors."""
import numpy as np
import pytest

import tcpy
from tcpy.demo import SOFTMAX
from tcpy.reference import ReferenceKernel, define_reference, evaluate

rng = np.random.default_rng(0)


def ref(src: str, name=None) -> ReferenceKernel:
    program = tcpy.parse(src)
    return define_reference(program[name] if name else program.defs[0])


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(got, want, dtype=None, rtol=1e-5, atol=1e-5):
    want = np.asarray(want)
    assert got.dtype == (dtype or want.dtype)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- standard kernels


def test_matmul_and_variants():
    A, B = rand(5, 7), rand(7, 3)
    check(ref("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")(A, B), A @ B)
    At = np.ascontiguousarray(A.T)
    src = "def mmt(float(K,M) A, float(K,N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }"
    check(ref(src)(At, B), A @ B)
    check(ref(src)(A.T, B), A @ B)  # a non-contiguous view
    X, Y = rand(2, 4, 6), rand(2, 6, 3)
    bmm = "def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }"
    check(ref(bmm)(X, Y), X @ Y)
    x = rand(7)
    check(ref("def gemv(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m, k) * x(k) }")(A, x), A @ x)


def test_matmul_float64_and_int_dtypes():
    A, B = rand(4, 6, dtype=np.float64), rand(6, 2, dtype=np.float64)
    src = "def mm(double(M,K) A, double(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
    check(ref(src)(A, B), A @ B, rtol=1e-12)
    for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        A = rng.integers(0, 50, (3, 5)).astype(t)
        B = rng.integers(0, 50, (5, 4)).astype(t)
        got = ref(f"def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m, n) +=! A(m, k) * B(k, n) }}")(A, B)
        assert got.dtype == np.dtype(t)
        np.testing.assert_array_equal(got, (A @ B).astype(t))  # wraps like C for int8/uint8


def conv2d_nchw(I, W, stride):
    N, C, H, Wd = I.shape
    O, _, KH, KW = W.shape
    OH, OW = (H - KH) // stride + 1, (Wd - KW) // stride + 1
    out = np.zeros((N, O, OH, OW), np.float64)
    for h in range(OH):
        for w in range(OW):
            patch = I[:, :, h * stride:h * stride + KH, w * stride:w * stride + KW]
            out[:, :, h, w] = np.einsum("nckl,ockl->no", patch, W)
    return out


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_nchw_and_nhwc(stride):
    I, W = rand(2, 3, 9, 8), rand(4, 3, 3, 2)
    src = f"""
    def conv(float(N,C,H,W) I, float(O,C,KH,KW) Wt) -> (Out) {{
        Out(n, o, h, w) +=! I(n, c, {stride} * h + kh, {stride} * w + kw) * Wt(o, c, kh, kw)
    }}"""
    want = conv2d_nchw(I, W, stride)
    check(ref(src)(I, W), want, np.float32, rtol=1e-4, atol=1e-4)
    nhwc = f"""
    def conv(float(N,H,W,C) I, float(KH,KW,C,O) Wt) -> (Out) {{
        Out(n, h, w, o) +=! I(n, {stride} * h + kh, {stride} * w + kw, c) * Wt(kh, kw, c, o)
    }}"""
    got = ref(nhwc)(np.ascontiguousarray(I.transpose(0, 2, 3, 1)), np.ascontiguousarray(W.transpose(2, 3, 1, 0)))
    check(got, want.transpose(0, 2, 3, 1), np.float32, rtol=1e-4, atol=1e-4)


def test_group_convolution():
    G, C, F = 2, 3, 4
    I, W = rand(1, G, C, 6, 6), rand(G, F, C, 3, 3)
    src = """
    def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
        O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * W1(g, f, c, kh, kw)
    }"""
    want = np.stack([conv2d_nchw(I[:, g], W[g], 1) for g in range(G)], axis=1)
    check(ref(src)(I, W), want, np.float32, rtol=1e-4, atol=1e-4)


def test_pooling():
    X = rand(2, 3, 8, 6)
    maxpool = """
    def maxpool(float(N,C,H,W) X) -> (Y) {
        Y(n, c, h, w) max=! X(n, c, 2 * h + kh, 2 * w + kw) where kh in 0:2, kw in 0:2
    }"""
    want = X.reshape(2, 3, 4, 2, 3, 2).max(axis=(3, 5))
    check(ref(maxpool)(X), want)
    avgpool = """
    def avgpool(float(N,C,H,W) X) -> (Y) {
        Y(n, c, h, w) +=! X(n, c, 2 * h + kh, 2 * w + kw) / 4.0 where kh in 0:2, kw in 0:2
    }"""
    check(ref(avgpool)(X), X.reshape(2, 3, 4, 2, 3, 2).mean(axis=(3, 5)))


def test_softmax_with_temporaries():
    X = rand(4, 9)
    e = np.exp(X - X.max(1, keepdims=True))
    check(ref(SOFTMAX)(X), e / e.sum(1, keepdims=True))


def test_layernorm_and_batchnorm():
    X = rand(3, 8)
    src = """
    def layernorm(float(N,D) X) -> (Y) {
        mean(n) +=! X(n, d) / float(D)
        var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / float(D)
        Y(n, d) = (X(n, d) - mean(n)) / sqrt(var(n) + 1e-5)
    }"""
    want = (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5)
    check(ref(src)(X), want, rtol=1e-4, atol=1e-4)
    bn = """
    def batchnorm(float(N,C) X, float(C) gamma, float(C) beta) -> (Y) {
        mean(c) +=! X(n, c) / float(N)
        var(c) +=! (X(n, c) - mean(c)) * (X(n, c) - mean(c)) / float(N)
        Y(n, c) = gamma(c) * (X(n, c) - mean(c)) / sqrt(var(c) + 1e-5) + beta(c)
    }"""
    g, b = rand(8), rand(8)
    X = rand(5, 8)
    want = g * (X - X.mean(0)) / np.sqrt(X.var(0) + 1e-5) + b
    check(ref(bn)(X, g, b), want, rtol=1e-4, atol=1e-4)


def test_attention_as_several_statements():
    Q, K, V = rand(2, 5, 4), rand(2, 6, 4), rand(2, 6, 3)
    src = """
    def attention(float(B,M,D) Q, float(B,N,D) K, float(B,N,E) V) -> (O) {
        S(b, m, n) +=! Q(b, m, d) * K(b, n, d)
        T(b, m, n) = S(b, m, n) / sqrt(float(D))
        mx(b, m) max=! T(b, m, n)
        P(b, m, n) = exp(T(b, m, n) - mx(b, m))
        s(b, m) +=! P(b, m, n)
        O(b, m, e) +=! P(b, m, n) * V(b, n, e) / s(b, m)
    }"""
    scores = Q @ K.transpose(0, 2, 1) / np.sqrt(4)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    check(ref(src)(Q, K, V), (p / p.sum(-1, keepdims=True)) @ V, np.float32, rtol=1e-4, atol=1e-5)


def test_kronecker_transpose_and_lut():
    A, B = rand(2, 3), rand(4, 5)
    src = "def kron(float(M,N) A, float(P,Q) B) -> (C) { C(i, j, k, l) = A(i, j) * B(k, l) }"
    check(ref(src)(A, B).reshape(2, 3, 4, 5).transpose(0, 2, 1, 3).reshape(8, 15), np.kron(A, B))
    check(ref("def t(float(M,N) A) -> (B) { B(j, i) = A(i, j) }")(A), A.T)
    table, idx = rand(10), np.array([3, 0, 9, 3], np.int32)
    lut = "def lut(float(N) T, int32(M) I) -> (O) { O(i) = T(I(i)) }"
    check(ref(lut)(table, idx), table[idx])
    idx64 = np.array([[1, 2], [9, 0]], np.int64)
    lut2 = "def lut(float(N) T, int64(M, K) I) -> (O) { O(i) +=! T(I(i, k)) }"
    check(ref(lut2)(table, idx64), table[idx64].sum(1))


def test_lut_out_of_bounds_raises_runtime_error():
    lut = ref("def lut(float(N) T, int32(M) I) -> (O) { O(i) = T(I(i)) }")
    with pytest.raises(tcpy.TCRuntimeError, match=r"index out of bounds: T\(I\(i\)\) reads T at index 10 "
                                                   r"of dimension 0, whose size is 10 at i=2"):
        lut(rand(10), np.array([0, 1, 10], np.int32))
    with pytest.raises(tcpy.TCRuntimeError, match="index -1"):
        lut(rand(10), np.array([-1], np.int32))


def test_elementwise_builtins():
    X = np.abs(rand(6)) + 0.1
    src = """
    def ew(float(N) X) -> (Y) {
        Y(i) = tanh(X(i)) + exp(-X(i)) * sqrt(X(i)) - log(X(i)) + fmax(X(i), 0.5) + pow(X(i), 2.0)
    }"""
    want = np.tanh(X) + np.exp(-X) * np.sqrt(X) - np.log(X) + np.fmax(X, 0.5) + X**2
    check(ref(src)(X), want)
    got = ref("def e(double(N) X) -> (Y) { Y(i) = erf(X(i)) + lgamma(X(i)) + round(X(i)) + cbrt(X(i)) }")(
        np.array([0.5, 2.5, -1.5], np.float64))
    import math
    want = [math.erf(x) + math.lgamma(x) + math.copysign(math.floor(abs(x) + 0.5), x) + np.cbrt(x)
            for x in (0.5, 2.5, -1.5)]
    check(got, np.array(want), rtol=1e-13)


def test_full_reductions_to_rank0_and_rank0_inputs():
    X = rand(3, 4)
    out = ref("def s(float(M,N) X) -> (S) { S +=! X(i, j) }")(X)
    assert out.shape == () and out.dtype == np.float32
    np.testing.assert_allclose(out, X.sum(), rtol=1e-5)
    scale = ref("def sc(float(N) X, float a, int32 b) -> (Y) { Y(i) = X(i) * a + float(b) }")
    x = rand(4)
    check(scale(x, 2.5, 3), x * np.float32(2.5) + 3)
    check(scale(x, np.float32(2.5), np.array(3, np.int32)), x * np.float32(2.5) + 3)


@pytest.mark.parametrize("t", ["half", "float", "double", "int8", "int16", "int32", "int64",
                               "uint8", "uint16", "uint32", "uint64", "bool"])
def test_every_dtype_copies_and_reduces(t):
    np_t = np.dtype(tcpy.lang.types.TYPE_NAMES[t].numpy_name)
    X = (rng.integers(0, 3, (3, 4)) > 0) if t == "bool" else rng.integers(0, 5, (3, 4)).astype(np_t)
    X = X.astype(np_t)
    k = ref(f"def f({t}(M,N) X) -> (Y, S, P, Mx, Mn) {{ Y(i, j) = X(i, j)\n S(i) +=! X(i, j)\n"
            f" P(i) *=! X(i, j)\n Mx(i) max=! X(i, j)\n Mn(i) min=! X(i, j) }}")
    Y, S_, P, Mx, Mn = k(X)
    for out in (Y, S_, P, Mx, Mn):
        assert out.dtype == np_t
    np.testing.assert_array_equal(Y, X)
    if t == "bool":
        np.testing.assert_array_equal(S_, X.any(1))
        np.testing.assert_array_equal(P, X.all(1))
    else:
        np.testing.assert_array_equal(S_, X.sum(1, dtype=np.float64).astype(np_t))
        np.testing.assert_array_equal(P, X.astype(np.float64).prod(1).astype(np_t))
    np.testing.assert_array_equal(Mx, X.max(1))
    np.testing.assert_array_equal(Mn, X.min(1))


# ----------------------------------------------------------------------------- semantics decisions


def test_empty_reductions_give_identities():
    k = ref("def f(float(M,K) X, int8(M,K) Y) -> (S, P, Mx, Mn, IMx, IMn) {\n"
            " S(i) +=! X(i, k)\n P(i) *=! X(i, k)\n Mx(i) max=! X(i, k)\n Mn(i) min=! X(i, k)\n"
            " IMx(i) max=! Y(i, k)\n IMn(i) min=! Y(i, k) }")
    S_, P, Mx, Mn, IMx, IMn = k(np.zeros((2, 0), np.float32), np.zeros((2, 0), np.int8))
    np.testing.assert_array_equal(S_, [0, 0])
    np.testing.assert_array_equal(P, [1, 1])
    np.testing.assert_array_equal(Mx, [-np.inf, -np.inf])
    np.testing.assert_array_equal(Mn, [np.inf, np.inf])
    np.testing.assert_array_equal(IMx, [-128, -128])
    np.testing.assert_array_equal(IMn, [127, 127])
    C = ref("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")(
        np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32))
    check(C, np.zeros((2, 3), np.float32))


def test_half_reductions_accumulate_in_float32():
    X = np.full((1, 4096), 1.0, np.float16)
    out = ref("def s(half(M,N) X) -> (S) { S(i) +=! X(i, j) }")(X)
    assert out.dtype == np.float16
    assert out[0] == 4096  # a float16 accumulator would stop at 2048
    naive = np.float16(0)
    for _ in range(4096):
        naive = np.float16(naive + np.float16(1))
    assert naive == 2048


def test_integer_division_truncates_in_values_and_floors_in_indices():
    x = np.array([7, -7, 7, -7], np.int32)
    y = np.array([2, 2, -2, -2], np.int32)
    q, r = ref("def d(int32(N) X, int32(N) Y) -> (Q, R) { Q(i) = X(i) / Y(i)\n R(i) = X(i) % Y(i) }")(x, y)
    np.testing.assert_array_equal(q, [3, -3, -3, 3])
    np.testing.assert_array_equal(r, [1, -1, 1, -1])
    # floor in index expressions: (i - 3) / 2 for i = 0..5 is -2 -1 -1 0 0 1 (C truncation: -1 -1 0 0 0 1)
    k = ref("def f(float(N) X) -> (Y) { Y(i) = X((i - 3) / 2 + 2) where i in 0:N }")
    X = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(k(X), [0, 1, 1, 2, 2, 3])
    mod = ref("def f(float(N) X) -> (Y) { Y(i) = X((i - 3) % 4) where i in 0:N }")
    np.testing.assert_array_equal(mod(np.arange(4, dtype=np.float32)), [1, 2, 3, 0])
    ovf = ref("def d(int32(N) X, int32(N) Y) -> (Q, R) { Q(i) = X(i) / Y(i)\n R(i) = X(i) % Y(i) }")
    q, r = ovf(np.array([-2**31], np.int32), np.array([-1], np.int32))
    assert q[0] == -2**31 and r[0] == 0


def test_integer_division_by_zero_raises_but_not_when_guarded():
    k = ref("def d(int32(N) X, int32(N) Y) -> (Q) { Q(i) = X(i) / Y(i) }")
    with pytest.raises(tcpy.TCRuntimeError, match=r"integer division by zero in 'X\(i\) / Y\(i\)' at i=1"):
        k(np.array([1, 2], np.int32), np.array([1, 0], np.int32))
    m = ref("def d(uint8(N) X, uint8(N) Y) -> (Q) { Q(i) = X(i) % Y(i) }")
    with pytest.raises(tcpy.TCRuntimeError, match="integer modulo by zero"):
        m(np.array([1], np.uint8), np.array([0], np.uint8))
    g = ref("def d(int32(N) X, int32(N) Y) -> (Q) { Q(i) = Y(i) != 0 ? X(i) / Y(i) : -1 }")
    np.testing.assert_array_equal(g(np.array([6, 2], np.int32), np.array([3, 0], np.int32)), [2, -1])
    s = ref("def d(int32(N) X, int32(N) Y) -> (Q) { Q(i) = Y(i) == 0 || X(i) / Y(i) > 1 ? 1 : 0 }")
    np.testing.assert_array_equal(s(np.array([6, 2], np.int32), np.array([3, 0], np.int32)), [1, 1])
    f = ref("def d(float(N) X, float(N) Y) -> (Q) { Q(i) = X(i) / Y(i) }")  # IEEE, no error
    np.testing.assert_array_equal(f(np.ones(2, np.float32), np.zeros(2, np.float32)), [np.inf, np.inf])


def test_lazy_ternary_guards_padding_reads():
    src = """
    def pad(float(N) X) -> (Y) {
        Y(i) = (i - 1 >= 0 ? X(i - 1) : 0.0) + X(i) + (i + 1 < N ? X(i + 1) : 0.0) where i in 0:N
    }"""
    X = np.arange(1, 6, dtype=np.float32)
    np.testing.assert_array_equal(ref(src)(X), np.convolve(X, [1, 1, 1], "same"))
    empty = ref("def f(float(N) X, float(M) Z) -> (Y) { Y(i) = M > 0 ? Z(0) : X(i) }")
    np.testing.assert_array_equal(empty(X, np.zeros(0, np.float32)), X)


def test_casts_saturate_and_nan_goes_to_zero():
    X = np.array([1e10, -1e10, np.nan, -2.7, 2.7, 300.0, np.inf], np.float32)
    got = ref("def c(float(N) X) -> (A, B, C) { A(i) = int32(X(i))\n B(i) = uint8(X(i))\n"
              " C(i) = int64(X(i)) }")(X)
    np.testing.assert_array_equal(got[0], [2**31 - 1, -2**31, 0, -2, 2, 300, 2**31 - 1])
    np.testing.assert_array_equal(got[1], [255, 0, 0, 0, 2, 255, 255])
    np.testing.assert_array_equal(got[2], [10**10, -10**10, 0, -2, 2, 300, 2**63 - 1])
    ints = np.array([-200, 200, 70000, -1], np.int32)
    got = ref("def c(int32(N) X) -> (A, B, C) { A(i) = int8(X(i))\n B(i) = uint16(X(i))\n C(i) = bool(X(i)) }")(ints)
    np.testing.assert_array_equal(got[0], [-128, 127, 127, -1])
    np.testing.assert_array_equal(got[1], [0, 200, 65535, 0])
    np.testing.assert_array_equal(got[2], [True, True, True, True])
    big = ref("def c(uint64(N) X) -> (A) { A(i) = int64(X(i)) }")(np.array([2**64 - 1, 5], np.uint64))
    np.testing.assert_array_equal(big, [2**63 - 1, 5])


def test_implicit_integer_arithmetic_wraps_in_its_type():
    X = np.array([100, -100], np.int8)
    got = ref("def w(int8(N) X) -> (Y) { Y(i) = X(i) + X(i) }")(X)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, [-56, 56])
    got = ref("def w(uint32(N) X) -> (Y) { Y(i) = X(i) - X(i) - uint32(1) }")(np.array([3], np.uint32))
    np.testing.assert_array_equal(got, [2**32 - 1])
    # uint32 with int32 gives int32 (TC's match_types), so -1 stays -1 when compared
    got = ref("def w(uint32(N) X, int32(N) Y) -> (Z) { Z(i) = X(i) > Y(i) ? 1 : 0 }")(
        np.array([1], np.uint32), np.array([-1], np.int32))
    np.testing.assert_array_equal(got, [1])


def test_min_max_propagate_nan_but_fmin_fmax_do_not():
    X = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0]], np.float32)
    mx, mn, fm, mxc = ref("def m(float(M,N) X) -> (Mx, Mn, F, C) { Mx(i) max=! X(i, j)\n Mn(i) min=! X(i, j)\n"
                          " F(i, j) = fmax(X(i, j), 0.0)\n C(i, j) = max(X(i, j), 0.0) }")(X)
    np.testing.assert_array_equal(mx, [np.nan, 3.0])
    np.testing.assert_array_equal(mn, [np.nan, 1.0])
    np.testing.assert_array_equal(fm[0], [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(mxc[0], [1.0, np.nan, 3.0])
    lt = ref("def c(float(N) X) -> (Y) { Y(i) = X(i) < 1.0 || X(i) >= 1.0 ? 1 : 0 }")
    np.testing.assert_array_equal(lt(np.array([np.nan, 0.0], np.float32)), [0, 1])  # IEEE comparisons


def test_accumulate_without_bang_and_several_writes():
    src = """
    def f(float(M,K) A, float(M) b) -> (C) {
        C(i) = b(i)
        C(i) +=! A(i, k)
        C(i) += A(i, k)
        C(i) max= 2.0 * b(i)
    }"""
    A, b = rand(3, 4), rand(3)
    check(ref(src)(A, b), np.maximum(2 * A.sum(1), 2 * b), rtol=1e-5)
    shifted = ref("def s(float(N) X) -> (Y) { Y(i) = X(i - 2) }")(np.arange(1, 5, dtype=np.float32))
    np.testing.assert_array_equal(shifted, [0, 0, 1, 2, 3, 4])  # output spans 0..hi, zero below lo


def test_outputs_tuple_out_argument_and_errors():
    k = ref("def f(float(N) X) -> (A, B) { A(i) = X(i) + 1.0\n B(i) = X(i) * 2.0 }")
    X = rand(3)
    a, b = k(X)
    outs = (np.full(3, 7, np.float32), np.empty(3, np.float32))
    got = k(X, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    check(outs[0], a)
    check(outs[1], b)
    with pytest.raises(tcpy.TCArgumentError, match="out= for output 'A' must be float32 with shape"):
        k(X, out=(np.empty(4, np.float32), np.empty(3, np.float32)))
    with pytest.raises(tcpy.TCArgumentError, match="out= needs 2 array"):
        k(X, out=np.empty(3, np.float32))
    with pytest.raises(tcpy.TCArgumentError):
        k(X.astype(np.float64))
    with pytest.raises(tcpy.TCShapeError):
        ref("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")(rand(2, 3), rand(4, 2))
    assert "reference" in repr(k) and "def f(float(N) X) -> (A, B)" in repr(k)
    text = k.explain((5,))
    assert "output     0 <= i < N  = [0, 5)" in text and "A: (N,) = (5,)  (output)" in text
    assert "backend: reference" in k.explain()


def test_evaluate_and_define_backend_routing():
    d = tcpy.parse("def f(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }").defs[0]
    x = rand(4)
    check(evaluate(d, [x]), x * x)
    k = tcpy.define("def f(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }", backend="reference")
    check(k(x), x * x)


def test_reverse_reductions_is_another_valid_order():
    d = tcpy.parse("def s(float(N) X) -> (S, M) { S +=! X(i)\n M max=! X(i) }").defs[0]
    x = np.array([1.0, 2.0**-24, 2.0**-24, -1.0], np.float32)
    s, m = define_reference(d)(x)
    rs, rm = define_reference(d, reverse_reductions=True)(x)
    assert s == 0.0 and rs == 2.0**-23  # ties to even absorb the small terms only going forward
    assert m == rm == 1.0
