"""Compiled kernels against NumPy: the standard tensor kernels written as comprehensions.

Every test asserts the exact shape and dtype of the result and its values against a NumPy
formulation that does not share code with tcpy.
"""
import numpy as np
import pytest

import tcpy

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(result, expected, rtol=1e-4, atol=1e-4):
    expected = np.asarray(expected)
    assert result.shape == expected.shape
    assert result.dtype == expected.dtype
    np.testing.assert_allclose(result, expected, rtol=rtol, atol=atol)


MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 5, 3), (64, 32, 48), (130, 257, 67)])
def test_matmul(shape):
    m, k, n = shape
    A, B = rand(m, k), rand(k, n)
    check(tcpy.define(MATMUL)(A, B), A @ B)


def test_matmul_large_is_tiled_and_parallel():
    A, B = rand(300, 200), rand(200, 700)
    kernel = tcpy.define(MATMUL)  # the contraction engine
    check(kernel(A, B), A @ B, rtol=1e-3, atol=1e-3)
    assert "#pragma omp parallel num_threads" in kernel.c_source(A, B)
    kernel = tcpy.define(MATMUL, options=tcpy.Options(contraction=False))  # plain loop nests
    check(kernel(A, B), A @ B, rtol=1e-3, atol=1e-3)
    source = kernel.c_source(A, B)
    assert "#pragma omp parallel for" in source
    assert "tcpy_min_int64" in source  # partial tiles from isl's AST generation


def test_batched_matmul():
    k = tcpy.define("""
    def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) {
        Z(b, m, n) +=! X(b, m, k) * Y(b, k, n)
    }""")
    X, Y = rand(3, 9, 7), rand(3, 7, 5)
    check(k(X, Y), X @ Y)


def test_matmul_transposed_operands():
    k = tcpy.define("""
    def mm_tt(float(K,M) A, float(N,K) B) -> (C) {
        C(m, n) +=! A(k, m) * B(n, k)
    }""")
    A, B = rand(11, 13), rand(17, 11)
    check(k(A, B), A.T @ B.T)


def test_gemv():
    k = tcpy.define("""
    def gemv(float(M,K) A, float(K) x) -> (y) {
        y(m) +=! A(m, k) * x(k)
    }""")
    A, x = rand(33, 65), rand(65)
    check(k(A, x), A @ x)


def conv2d_nchw(I, W, stride):
    n, c, h, w = I.shape
    m, _, kh, kw = W.shape
    oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
    O = np.zeros((n, m, oh, ow), I.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = I[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            O += np.einsum("nchw,mc->nmhw", patch, W[:, :, i, j])
    return O


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_nchw(stride):
    k = tcpy.define(f"""
    def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {{
        O(n, m, h, w) +=! I(n, c, {stride}*h + kh, {stride}*w + kw) * Wt(m, c, kh, kw)
    }}""")
    I, W = rand(2, 3, 11, 10), rand(4, 3, 3, 3)
    check(k(I, W), conv2d_nchw(I, W, stride))


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_nhwc(stride):
    k = tcpy.define(f"""
    def conv(float(N,H,W,C) I, float(KH,KW,C,M) Wt) -> (O) {{
        O(n, h, w, m) +=! I(n, {stride}*h + kh, {stride}*w + kw, c) * Wt(kh, kw, c, m)
    }}""")
    I, W = rand(2, 9, 12, 3), rand(3, 3, 3, 5)
    expected = conv2d_nchw(I.transpose(0, 3, 1, 2), W.transpose(3, 2, 0, 1), stride).transpose(0, 2, 3, 1)
    check(k(I, W), np.ascontiguousarray(expected))


def test_conv2d_padded_with_ternary_guard():
    # padding 1 by guarding the reads at the borders: the lazy ternary never reads outside I
    k = tcpy.define("""
    def conv_pad(float(N,C,H,W) I, float(M,C,3,3) Wt) -> (O) {
        O(n, m, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                          ? I(n, c, h + kh - 1, w + kw - 1) * Wt(m, c, kh, kw) : 0.0
            where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
    }""")
    I, W = rand(1, 2, 6, 5), rand(3, 2, 3, 3)
    padded = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
    check(k(I, W), conv2d_nchw(padded, W, 1))


def test_group_conv():
    k = tcpy.define("""
    def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
        O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * W1(g, f, c, kh, kw)
    }""")
    I, W = rand(2, 2, 3, 7, 6), rand(2, 4, 3, 2, 3)
    expected = np.stack([conv2d_nchw(I[:, g], W[g], 1) for g in range(2)], axis=1)
    check(k(I, W), expected)


def test_max_and_average_pooling():
    lib = tcpy.define("""
    def maxpool(float(N,C,H,W) I) -> (O) {
        O(n, c, h, w) max=! I(n, c, 2*h + kh, 2*w + kw) where kh in 0:2, kw in 0:2
    }
    def avgpool(float(N,C,H,W) I) -> (O) {
        O(n, c, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) / 4.0 where kh in 0:2, kw in 0:2
    }""")
    I = rand(2, 3, 8, 7)
    windows = I[:, :, :8, :6].reshape(2, 3, 4, 2, 3, 2)
    check(lib.maxpool(I), windows.max(axis=(3, 5)))
    check(lib.avgpool(I), windows.mean(axis=(3, 5)))


def test_softmax_with_temporaries():
    k = tcpy.define("""
    def softmax(float(N,D) X) -> (Y) {
        mx(n) max=! X(n, d)
        e(n, d) = exp(X(n, d) - mx(n))
        s(n) +=! e(n, d)
        Y(n, d) = e(n, d) / s(n)
    }""")
    X = rand(5, 37)
    e = np.exp(X - X.max(axis=1, keepdims=True))
    check(k(X), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_layernorm():
    k = tcpy.define("""
    def layernorm(float(N,D) X, float(D) g, float(D) b) -> (Y) {
        s(n) +=! X(n, d)
        mu(n) = s(n) / float(D)
        v(n) +=! (X(n, d) - mu(n)) * (X(n, d) - mu(n))
        Y(n, d) = (X(n, d) - mu(n)) * rsqrt(v(n) / float(D) + 0.00001) * g(d) + b(d)
    }""")
    X, g, b = rand(4, 33), rand(33), rand(33)
    mu = X.mean(axis=1, keepdims=True)
    var = X.var(axis=1, keepdims=True)
    check(k(X, g, b), (X - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-4, atol=1e-4)


def test_batchnorm():
    k = tcpy.define("""
    def batchnorm(float(N,C,H,W) X, float(C) gamma, float(C) beta) -> (Y) {
        s(c) +=! X(n, c, h, w)
        mu(c) = s(c) / float(N * H * W)
        v(c) +=! (X(n, c, h, w) - mu(c)) * (X(n, c, h, w) - mu(c))
        Y(n, c, h, w) = gamma(c) * (X(n, c, h, w) - mu(c)) / sqrt(v(c) / float(N * H * W) + 0.00001) + beta(c)
    }""")
    X, gamma, beta = rand(3, 4, 5, 6), rand(4), rand(4)
    mu = X.mean(axis=(0, 2, 3), keepdims=True)
    var = X.var(axis=(0, 2, 3), keepdims=True)
    expected = gamma[None, :, None, None] * (X - mu) / np.sqrt(var + 1e-5) + beta[None, :, None, None]
    check(k(X, gamma, beta), expected, rtol=1e-4, atol=1e-4)


ATTENTION = """
def attention(float(B,H,L,D) Q, float(B,H,L,D) K, float(B,H,L,D) V) -> (O) {
    S(b, h, i, j) +=! Q(b, h, i, d) * K(b, h, j, d)
    T(b, h, i, j) = S(b, h, i, j) * rsqrt(float(D))
    mx(b, h, i) max=! T(b, h, i, j)
    E(b, h, i, j) = exp(T(b, h, i, j) - mx(b, h, i))
    den(b, h, i) +=! E(b, h, i, j)
    P(b, h, i, j) = E(b, h, i, j) / den(b, h, i)
    O(b, h, i, d) +=! P(b, h, i, j) * V(b, h, j, d)
}
"""


def numpy_attention(Q, K, V):
    S = Q @ K.transpose(0, 1, 3, 2) / np.float32(np.sqrt(Q.shape[-1]))
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    return (E / E.sum(axis=-1, keepdims=True)) @ V


def test_attention_as_several_statements():
    Q, K, V = rand(2, 3, 17, 8), rand(2, 3, 17, 8), rand(2, 3, 17, 8)
    check(tcpy.define(ATTENTION)(Q, K, V), numpy_attention(Q, K, V), rtol=1e-4, atol=1e-5)


def test_kronecker():
    k = tcpy.define("""
    def kronecker(float(M,N) A, float(P,Q) B) -> (C) {
        C(m, p, n, q) = A(m, n) * B(p, q)
    }""")
    A, B = rand(3, 4), rand(2, 5)
    result = k(A, B)
    assert result.shape == (3, 2, 4, 5)
    check(result.reshape(6, 20), np.kron(A, B))  # C(m, p, n, q) is kron(A, B)[m*P + p, n*Q + q]


def test_lut_gather_and_out_of_bounds_index():
    k = tcpy.define("""
    def lut(float(N) T, int32(M) I) -> (O) {
        O(i) = T(I(i))
    }""")
    T = rand(10)
    idx = np.array([3, 0, 9, 9, 2], np.int32)
    check(k(T, idx), T[idx])
    with pytest.raises(tcpy.TCRuntimeError, match=r"index out of bounds.*dimension 0 of T is 10"):
        k(T, np.array([1, 10], np.int32))


def test_elementwise_builtins():
    k = tcpy.define("""
    def ew(float(N) X, float(N) Y) -> (O) {
        O(i) = tanh(X(i)) + exp(-Y(i)) * sqrt(fabs(X(i))) + max(X(i), Y(i)) - pow(fabs(Y(i)), 1.5)
    }""")
    X, Y = rand(100), rand(100)
    expected = np.tanh(X) + np.exp(-Y) * np.sqrt(np.abs(X)) + np.maximum(X, Y) - np.abs(Y) ** 1.5
    check(k(X, Y), expected.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_reduction_over_all_dims_gives_rank0():
    k = tcpy.define("""
    def total(double(M,N) X) -> (s) {
        s +=! X(i, j)
    }""")
    X = rand(13, 7, dtype=np.float64)
    result = k(X)
    assert result.shape == () and result.dtype == np.float64
    np.testing.assert_allclose(result, X.sum())


def test_rank0_input_from_python_number_and_array():
    k = tcpy.define("""
    def axpy(float a, float(N) x, float(N) y) -> (z) {
        z(i) = a * x(i) + y(i)
    }""")
    x, y = rand(9), rand(9)
    check(k(2.5, x, y), np.float32(2.5) * x + y)
    check(k(np.float32(-1.0).reshape(()), x, y), -x + y)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                   "float16", "float32", "float64"])
def test_every_dtype_elementwise_and_sum(dtype):
    lib = tcpy.define(f"""
    def ew({dtype}(N) X, {dtype}(N) Y) -> (O) {{
        O(i) = X(i) + Y(i) * X(i)
    }}
    def rowsum({dtype}(M,N) X) -> (S) {{
        S(m) +=! X(m, n)
    }}""")
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "f":
        X, Y = rand(50, dtype=dtype), rand(50, dtype=dtype)
        M = rand(6, 40, dtype=dtype)
    else:
        info = np.iinfo(np_dtype)
        X = rng.integers(info.min, info.max, 50, dtype=dtype, endpoint=True)
        Y = rng.integers(info.min, info.max, 50, dtype=dtype, endpoint=True)
        M = rng.integers(info.min, info.max, (6, 40), dtype=dtype, endpoint=True)
    with np.errstate(over="ignore"):
        expected = X + Y * X
    tol = 1e-2 if dtype == "float16" else 1e-5
    check(lib.ew(X, Y), expected, rtol=tol, atol=tol)
    if dtype == "float16":  # half reductions accumulate in float32, then round once
        expected_sum = M.astype(np.float32).sum(axis=1).astype(np.float16)
    else:
        expected_sum = M.sum(axis=1, dtype=np_dtype)
    check(lib.rowsum(M), expected_sum, rtol=tol, atol=tol)


def test_bool_logic():
    k = tcpy.define("""
    def logic(bool(N) X, bool(N) Y, float(N) Z) -> (O) {
        O(i) = (X(i) && !Y(i)) || Z(i) > 0.5
    }""")
    X, Y = rng.random(20) > 0.5, rng.random(20) > 0.5
    Z = rand(20)
    check(k(X, Y, Z), (X & ~Y) | (Z > 0.5))


def test_integer_division_by_zero_raises():
    k = tcpy.define("""
    def div(int32(N) X, int32(N) Y) -> (O) {
        O(i) = X(i) / Y(i)
    }""")
    X = np.array([7, -7, 9], np.int32)
    check(k(X, np.array([2, 2, -4], np.int32)), np.array([3, -3, -2], np.int32))  # C truncation
    with pytest.raises(tcpy.TCRuntimeError, match="integer division by zero"):
        k(X, np.array([1, 0, 1], np.int32))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_integer_division_by_literals_truncates_in_values_and_floors_in_indices(dtype):
    # literal divisors need no check per element (127 is the widest one positive in int8)
    k = tcpy.define(f"""
    def div({dtype}(N) X, float(M) T) -> (Q, R, G) {{
        Q(i) = X(i) / 3 + X(i) / 127
        R(i) = X(i) % 2 == 0 ? X(i) % 127 : X(i) % 5
        G(i) = T(X(i) / 2 + X(i) % 3 + 200)
    }}""")
    info = np.iinfo(dtype)
    values = [info.min, info.min + 1, -128, -7, -1, 0, 1, 7, 100, info.max]
    X = np.array([min(max(v, info.min, -300), info.max, 300) for v in values], dtype=dtype)
    T = np.arange(400, dtype=np.float32)
    expected = tcpy.define(k.source, backend="reference")(X, T)
    for got, want in zip(k(X, T), expected):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    Q = np.fix(X.astype(np.float64) / 3) + np.fix(X.astype(np.float64) / 127)  # C truncation
    np.testing.assert_array_equal(k(X, T)[0], Q.astype(dtype))


def test_max_reduction_propagates_nan():
    k = tcpy.define("""
    def rmax(float(M,N) X) -> (O) {
        O(m) max=! X(m, n)
    }""")
    X = rand(3, 5)
    X[1, 2] = np.nan
    result = k(X)
    assert np.isnan(result[1]) and not np.isnan(result[0]) and not np.isnan(result[2])


def test_non_contiguous_inputs_and_out_argument():
    k = tcpy.define(MATMUL)
    A, B = rand(20, 10), rand(24, 5)
    At, Bt = A[:, ::2], B.T[:, 4:]  # strided and transposed views
    expected = At @ Bt
    check(k(At, Bt), expected)
    out = np.empty_like(expected)
    result = k(At, Bt, out=out)
    assert result is out
    check(out, expected)


def test_several_outputs_return_a_tuple():
    k = tcpy.define("""
    def moments(float(N,D) X) -> (mean, sq) {
        mean(n) +=! X(n, d) / float(D)
        sq(n) +=! X(n, d) * X(n, d) / float(D)
    }""")
    X = rand(4, 9)
    mean, sq = k(X)
    check(mean, X.mean(axis=1), rtol=1e-5, atol=1e-6)
    check(sq, (X * X).mean(axis=1), rtol=1e-5, atol=1e-6)


def test_empty_reduction_gives_identity():
    k = tcpy.define("""
    def rsum(float(M,N) X) -> (S, P, MX) {
        S(m) +=! X(m, n)
        P(m) *=! X(m, n)
        MX(m) max=! X(m, n)
    }""")
    S, P, MX = k(np.zeros((3, 0), np.float32))
    check(S, np.zeros(3, np.float32))
    check(P, np.ones(3, np.float32))
    assert np.all(MX == -np.inf)


NO_ENGINE = tcpy.Options(contraction=False)  # GEMM-class statements keep the plain loop nests


def test_options_change_schedule_not_result():
    A, B = rand(70, 40), rand(40, 90)
    options = tcpy.Options(tile_sizes={"m": 16, "n": 32, "k": 8}, loop_order=("n", "m", "k"), unroll=4,
                           num_threads=1, contraction=False)
    k = tcpy.define(MATMUL, options=options)
    check(k(A, B), A @ B)
    assert "#pragma omp parallel" not in k.c_source(A, B)


def test_register_tiles_with_partial_blocks():
    # m = 13 and w = 38 are not multiples of the register tile: whole blocks take the register
    # path, edge blocks the plain loops; both must agree with NumPy. (Without the contraction
    # engine, which takes these statements by default.)
    k = tcpy.define("""
    def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw)
    }""", options=NO_ENGINE)
    I, W = rand(1, 5, 6, 40), rand(13, 5, 3, 3)
    assert "register tile m:" in k.explain(I, W)
    assert "tcpy_tile" in k.c_source(I, W)
    check(k(I, W), conv2d_nchw(I, W, 1))
    mm = tcpy.define(MATMUL, options=NO_ENGINE)
    A, B = rand(67, 35), rand(35, 111)
    assert "tcpy_tile" in mm.c_source(A, B)
    check(mm(A, B), A @ B)


def test_index_division_by_minus_one_at_the_minimum_does_not_trap():
    # INT32_MIN / -1 traps on x86 when done with a division instruction
    k = tcpy.define("def f(float(N) X, int32(N) I, int32(N) J) -> (Y) { Y(i) = X(max(I(i) / J(i), 0) % N) }")
    X = np.arange(4, dtype=np.float32)
    I = np.array([np.iinfo(np.int32).min, 7, -9, 3], np.int32)
    J = np.array([-1, -1, 2, 1], np.int32)
    # floor division: MIN / -1 wraps to MIN -> max(., 0) = 0; 7 / -1 = -7 -> 0; -9 / 2 = -5 -> 0; 3
    check(k(X, I, J), np.array([0, 0, 0, 3], np.float32))
    with pytest.raises(tcpy.TCRuntimeError, match="integer division by zero"):
        k(X, I, np.zeros(4, np.int32))


def test_dot_product_reductions_read_a_packed_transposed_operand():
    # C(m,n) +=! A(m,k) * B(n,k): k is contiguous in both reads; tcpy copies B as (k, n) so the
    # reduction runs as a register-tiled GEMM. Sizes leave partial register blocks.
    k = tcpy.define("""
    def mm_nt(float(M,K) A, float(N,K) B) -> (C) {
        C(m, n) +=! A(m, k) * B(n, k)
    }""", options=NO_ENGINE)
    A, B = rand(45, 70), rand(100, 70)
    assert "pack.0" in k.explain(A, B)
    check(k(A, B), A @ B.T)
    check(k(A[:, :35], B[:7, :35]), A[:, :35] @ B[:7, :35].T)  # too small to pack: plain schedule


def test_row_sums_of_products_are_not_transposed():
    # R(b,n) +=! X(b,n,m) * Y(b,n,m): every element serves one output, so a transposed copy
    # (for a register tile over b and n) would only add a pass over X; the row reduction reads
    # it once, in place
    k = tcpy.define("""
    def rowdot(float(B,N,M) X, float(B,N,M) Y) -> (R) {
        R(b, n) +=! -(X(b, n, m) * (Y(b, n, m) / 2.0))
    }""", options=NO_ENGINE)
    X, Y = rand(9, 45, 300), rand(9, 45, 300)
    explained = k.explain(X, Y)
    assert "pack.0" not in explained and "reduction in a register" in explained
    check(k(X, Y), -(X * Y / 2).sum(axis=2))


def test_reused_temporaries_start_from_zero_on_every_call():
    # T(0) is written by no statement; the launcher reuses T's memory between calls, so it
    # must clear it again (T(1..) are overwritten anyway).
    k = tcpy.define("""
    def f(float(N) A) -> (O) {
        T(i) = A(i - 1) where i in 1:N+1
        O(i) = T(i) + 1.0 where i in 0:N+1
    }""")
    for A in (np.arange(1, 5, dtype=np.float32), np.full(4, 7.0, np.float32)):
        check(k(A), np.concatenate([[1.0], A + 1]).astype(np.float32))


def test_wide_operands_are_read_from_panel_copies():
    # Rows of B at least 512 long are copied into 32-wide panels for the register tiles; the
    # last, partial panel and edge blocks read B itself.
    mm = tcpy.define(MATMUL, options=NO_ENGINE)
    A, B = rand(50, 70), rand(70, 530)
    assert "pack.0(panel.nb" in mm.explain(A, B)
    check(mm(A, B), A @ B)
    bmm = tcpy.define("""
    def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) {
        Z(b, m, n) +=! X(b, m, k) * Y(b, k, n)
    }""", options=NO_ENGINE)
    X, Y = rand(2, 13, 9), rand(2, 9, 515)
    assert "pack.0(panel.nb" in bmm.explain(X, Y)
    check(bmm(X, Y), X @ Y)
