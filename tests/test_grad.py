"""tcpy.grad, tcpy.vjp and tcpy.value_and_grad: backward defs checked against central finite
differences in float64 (the forward evaluated by the reference backend, the backward compiled),
and the errors for what has no derivative."""
import numpy as np
import pytest

import tcpy

# name -> (source with a `T` for the float type, input shapes; an int tuple is an index table)
LAYERS = {
    "gemm": ("def f(T(M,K) A, T(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }", [(3, 4), (4, 5)]),
    "batched_gemm": ("def f(T(B,M,K) A, T(B,K,N) X) -> (C) { C(b, m, n) +=! A(b, m, k) * X(b, k, n) }",
                     [(2, 3, 4), (2, 4, 2)]),
    "conv": ("def f(T(N,C,H,W) I, T(F,C,KH,KW) Wt) -> (O) { O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw) }",
             [(2, 2, 5, 5), (3, 2, 3, 3)]),
    "conv_stride_padding": ("""def f(T(N,C,H,W) I, T(F,C,KH,KW) Wt) -> (O) {
        O(n, f, h, w) +=! (2*h + kh - 1 >= 0 && 2*h + kh - 1 < H && 2*w + kw - 1 >= 0 && 2*w + kw - 1 < W)
                          ? I(n, c, 2*h + kh - 1, 2*w + kw - 1) * Wt(f, c, kh, kw) : 0
                          where h in 0:(H + 1)/2, w in 0:(W + 1)/2, kh in 0:KH, kw in 0:KW
    }""", [(1, 2, 5, 5), (2, 2, 3, 3)]),
    "conv_groups": ("""def f(T(N,G,C,H,W) I, T(G,F,C,KH,KW) Wt) -> (O) {
        O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * Wt(g, f, c, kh, kw)
    }""", [(1, 2, 2, 4, 4), (2, 2, 2, 2, 2)]),
    "depthwise": ("""def f(T(N,C,H,W) I, T(C,KH,KW) Wt) -> (O) {
        O(n, c, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                          ? I(n, c, h + kh - 1, w + kw - 1) * Wt(c, kh, kw) : 0 where h in 0:H, w in 0:W
    }""", [(1, 2, 4, 4), (2, 3, 3)]),
    "max_pool": ("def f(T(N,H,W) I) -> (O) { O(n, h, w) max=! I(n, 2*h + kh, 2*w + kw) where kh in 0:2, kw in 0:2 }",
                 [(2, 4, 5)]),
    "softmax": ("""def f(T(N,M) X) -> (Y) {
        mx(n) max=! X(n, m)
        e(n, m) = exp(X(n, m) - mx(n))
        s(n) +=! e(n, m)
        Y(n, m) = e(n, m) / s(n)
    }""", [(3, 4)]),
    "log_softmax": ("""def f(T(N,M) X) -> (Y) {
        mx(n) max=! X(n, m)
        s(n) +=! exp(X(n, m) - mx(n))
        Y(n, m) = X(n, m) - mx(n) - log(s(n))
    }""", [(3, 4)]),
    "layer_norm": ("""def f(T(N,D) X, T(D) G, T(D) Bb) -> (Y) {
        mean(n) +=! X(n, d) / D
        var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
        Y(n, d) = (X(n, d) - mean(n)) * rsqrt(var(n) + 0.00001) * G(d) + Bb(d)
    }""", [(3, 5), (5,), (5,)]),
    "batch_norm": ("""def f(T(N,C,H) X, T(C) G, T(C) Bb) -> (Y) {
        mean(c) +=! X(n, c, h) / (N * H)
        var(c) +=! (X(n, c, h) - mean(c)) * (X(n, c, h) - mean(c)) / (N * H)
        Y(n, c, h) = (X(n, c, h) - mean(c)) / sqrt(var(c) + 0.00001) * G(c) + Bb(c)
    }""", [(2, 3, 4), (3,), (3,)]),
    "attention": ("""def f(T(B,L,D) Q, T(B,S,D) K, T(B,S,E) V) -> (O) {
        sc(b, t, s) +=! Q(b, t, d) * K(b, s, d)
        mx(b, t) max=! sc(b, t, s)
        p(b, t, s) = exp(sc(b, t, s) - mx(b, t))
        l(b, t) +=! p(b, t, s)
        O(b, t, e) +=! p(b, t, s) * V(b, s, e) / l(b, t)
    }""", [(2, 3, 2), (2, 4, 2), (2, 4, 3)]),
    "causal_attention": ("""def f(T(L,D) Q, T(L,D) K, T(L,E) V) -> (O) {
        sc(t, s) +=! Q(t, d) * K(s, d)
        m(t, s) = s <= t ? sc(t, s) : -1e30
        mx(t) max=! m(t, s)
        p(t, s) = exp(m(t, s) - mx(t))
        l(t) +=! p(t, s)
        O(t, e) +=! p(t, s) * V(s, e) / l(t)
    }""", [(4, 2), (4, 2), (4, 3)]),
    "embedding": ("def f(T(V,D) E, int32(L) Idx) -> (O) { O(i, d) = E(Idx(i), d) }", [(5, 3), (4,)]),
    "sum_of_squares": ("def f(T(N,M) X, T(N,M) Y) -> (Loss) { Loss +=! (X(n, m) - Y(n, m)) * (X(n, m) - Y(n, m)) }",
                       [(3, 4), (3, 4)]),
}


def layer(name, scalar="double"):
    src, shapes = LAYERS[name]
    return src.replace("T(", f"{scalar}("), shapes


def arguments(kernel, shapes, dtype=np.float64, seed=0):
    """Random float inputs (distinct values: no ties) and in-range index tables."""
    rng = np.random.default_rng(seed)
    args = []
    for param, shape in zip(kernel.def_.params, shapes):
        scalar = kernel.def_.tensor(param.name).scalar
        if scalar.is_float:
            args.append(rng.standard_normal(shape).astype(dtype if scalar.bits == 64 else scalar.numpy_name))
        else:  # an index table: the def reads dimension 0 of the first input with it
            args.append(rng.integers(0, args[0].shape[0], shape).astype(np.int32))
    return args


def cotangents(kernel, args, seed=1):
    outs = kernel(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(np.shape(o)) for o, r in zip(outs, kernel.def_.returns)
            if kernel.def_.tensor(r.name).scalar.is_float]


def finite_differences(kernel, args, cots, wrt, eps=1e-6):
    """Central differences of sum(cotangent * output) with respect to each input in ``wrt``."""
    names = [p.name for p in kernel.def_.params]
    floats = [r.name for r in kernel.def_.returns if kernel.def_.tensor(r.name).scalar.is_float]

    def loss(values):
        outs = kernel(*values)
        outs = outs if isinstance(outs, tuple) else (outs,)
        outs = [o for o, r in zip(outs, kernel.def_.returns) if r.name in floats]
        return sum(float(np.sum(c * o)) for c, o in zip(cots, outs))

    result = []
    for name in wrt:
        i = names.index(name)
        numeric = np.zeros_like(args[i])
        for idx in np.ndindex(args[i].shape):
            values = [a.copy() for a in args]
            values[i][idx] += eps
            up = loss(values)
            values[i][idx] -= 2 * eps
            numeric[idx] = (up - loss(values)) / (2 * eps)
        result.append(numeric)
    return result


def check_against_finite_differences(src, shapes, wrt=None, seed=0):
    reference = tcpy.define(src, backend="reference")
    args = arguments(reference, shapes, seed=seed)
    cots = cotangents(reference, args)
    backward = tcpy.grad(tcpy.define(src), wrt)
    got = backward(*args, *cots)
    got = got if isinstance(got, tuple) else (got,)
    names = [r.name[1:] for r in backward.def_.returns]
    for name, value, numeric in zip(names, got, finite_differences(reference, args, cots, names)):
        assert value.shape == numeric.shape and value.dtype == np.float64
        np.testing.assert_allclose(value, numeric, rtol=1e-5, atol=1e-6, err_msg=f"d{name}")
    return backward


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_match_finite_differences(name):
    check_against_finite_differences(*layer(name))


def test_gemm_backward_is_two_contractions():
    backward = tcpy.grad(tcpy.define(layer("gemm", "float")[0]))
    assert backward.source.splitlines()[1:3] == [
        "    dA(m, k) +=! dC(m, n) * B(k, n) where m in 0:M, n in 0:N, k in 0:K",
        "    dB(k, n) +=! dC(m, n) * A(m, k) where m in 0:M, n in 0:N, k in 0:K",
    ]
    plan = backward.explain((64, 32), (32, 48), (64, 48), )
    assert plan.count("contraction engine") == 2


def test_conv_input_gradient_is_a_transposed_convolution():
    source = tcpy.grad(tcpy.define(layer("conv")[0])).source
    assert ("dI(n, c, i2, i3) +=! i2 - h >= 0" not in source
            and "dO(n, f, i2 - kh, i3 - kw) * Wt(f, c, kh, kw)" in source)
    assert "dWt(f, c, kh, kw) +=! dO(n, f, h, w) * I(n, c, h + kh, w + kw)" in source


def test_max_pool_ties_go_to_the_first():
    src = "def f(double(N) I) -> (O) { O(n) max=! I(2*n + k) where k in 0:3 }"
    backward = tcpy.grad(tcpy.define(src))
    x = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 5.0])
    dx = backward(x, np.array([10.0, 100.0, 1000.0]))
    np.testing.assert_array_equal(dx, [0, 10, 100, 0, 0, 0, 1000])


def test_min_reduction_over_two_variables():
    check_against_finite_differences("def f(double(N,M,P) X) -> (O) { O(n) min=! X(n, m, p) * X(n, m, p) }",
                                     [(2, 3, 4)])


def test_wrt_picks_inputs_and_order():
    src, shapes = layer("gemm")
    backward = check_against_finite_differences(src, shapes, wrt=("B",))
    assert [r.name for r in backward.def_.returns] == ["dB"]
    assert [p.name for p in backward.def_.params] == ["A", "B", "dC"]


def test_input_that_does_not_reach_the_output_gets_zeros():
    backward = tcpy.grad(tcpy.define("def f(double(N) X, double(N) Y) -> (O) { O(i) = X(i) * 2 }"))
    dx, dy = backward(np.ones(3), np.ones(3), np.arange(3.0))
    np.testing.assert_array_equal(dx, [0, 2, 4])
    np.testing.assert_array_equal(dy, [0, 0, 0])


@pytest.mark.parametrize("src, shapes", [
    ("def f(double(N,M) X, int32(L) I) -> (O) { O(l, j) +=! X(I(l), j) * X(I(l), j) where j in 0:M }",
     [(4, 3), (5,)]),
    ("def f(double(N,N) X) -> (O) { O(i) = X(i, i) * X(i, i) + X(i, N - 1 - i) }", [(4, 4)]),
    ("def f(double(N) X) -> (O) { O(i) +=! X(i + j) * X(j) where j in 0:2 }", [(6,)]),
    ("def f(double(N) X) -> (O) { O(i) +=! X(2*i + j) where j in 0:3 }", [(7,)]),
    ("""def f(double(N) X) -> (O, P) {
        T(i) = X(i) * X(i)
        O(i) = T(i) + 1
        P(i) +=! O(j) * T(i) where j in 0:N
    }""", [(5,)]),
    ("""def f(double(N) X, double(N) Y) -> (O) {
        O(i) = X(i) * 2
        O(i) += Y(i) * X(i)
    }""", [(5,), (5,)]),
    ("def f(double(N) X) -> (O) { O(i) = t * t + t where t = exp(X(i)) }", [(5,)]),
    ("def f(double(N) X, float(N) Y) -> (double(N) O) { O(i) = X(i) * double(Y(i)) }", [(4,), (4,)]),
    ("def f(double(N) X, int32(N) I) -> (O) { O(i) = I(i) > 0 ? X(i) * float(I(i)) : -X(i) }", [(5,), (5,)]),
    ("def f(double X, double(N) Y) -> (O) { O(i) = X * Y(i) + X }", [(), (3,)]),
])
def test_gathers_strides_temporaries_and_mixed_types(src, shapes):
    check_against_finite_differences(src, shapes, wrt="X")


# every builtin with a derivative, in a range where it is smooth
BUILTIN_TERMS = [
    "exp(X(i))", "tanh(X(i)) * erf(Y(i))", "sqrt(X(i) * X(i) + 1)", "pow(fabs(X(i)) + 1, Y(i))",
    "fmax(X(i), Y(i))", "X(i) / (Y(i) * Y(i) + 1)", "log(Y(i) * Y(i) + 2)", "X(i) > 0 ? sin(X(i)) : cos(Y(i))",
    "max(X(i), 2 * Y(i))", "atan2(X(i), Y(i))", "hypot(X(i), Y(i))", "expm1(X(i))", "log1p(Y(i) * Y(i))",
    "cbrt(X(i) + 3)", "rsqrt(Y(i) * Y(i) + 1)", "asinh(X(i))", "atan(Y(i))", "fmin(X(i), Y(i))",
    "fdim(X(i), Y(i))", "fma(X(i), Y(i), X(i))", "copysign(X(i), Y(i))", "erfc(X(i))", "normcdf(Y(i))",
    "sinh(X(i))", "cosh(Y(i))", "exp2(X(i))", "log2(Y(i) * Y(i) + 1)", "log10(Y(i) * Y(i) + 1)",
    "exp10(X(i) / 4)", "tan(X(i) / 4)", "sinpi(X(i))", "cospi(Y(i))", "fmod(X(i), Y(i))",
    "remainder(X(i), Y(i))", "min(X(i), Y(i))", "asin(X(i) / 4)", "acos(Y(i) / 4)", "atanh(X(i) / 4)",
    "acosh(Y(i) * Y(i) + 2)", "erfinv(X(i) / 4)", "erfcinv(X(i) / 4 + 1)", "erfcx(X(i))",
    "rhypot(X(i), Y(i))", "norm3d(X(i), Y(i), X(i))", "norm4d(X(i), Y(i), X(i), Y(i))",
    "rnorm3d(X(i), Y(i), X(i))", "rnorm4d(X(i), Y(i), X(i), Y(i))", "rcbrt(Y(i) + 3)",
    "normcdfinv(Y(i) * Y(i) / (Y(i) * Y(i) + 1) / 2 + 0.25)", "fdivide(X(i), Y(i))",
    "floor(X(i)) + ceil(Y(i)) + round(X(i)) + trunc(Y(i)) + logb(X(i))", "-X(i) * double(Y(i) > 0)",
]


def test_every_builtin_matches_finite_differences():
    src = f"def f(double(N) X, double(N) Y) -> (O) {{ O(i) = {' + '.join(BUILTIN_TERMS)} }}"
    check_against_finite_differences(src, [(6,), (6,)])


def test_value_and_grad_returns_outputs_then_gradients():
    src, shapes = layer("attention")
    forward = tcpy.define(src)
    args = arguments(forward, shapes)
    cots = cotangents(forward, args)
    both = tcpy.value_and_grad(forward, wrt=("Q", "V"))
    out, dq, dv = both(*args, *cots)
    np.testing.assert_allclose(out, forward(*args), rtol=1e-12)
    expected = tcpy.grad(forward, wrt=("Q", "V"))(*args, *cots)
    np.testing.assert_allclose(dq, expected[0], rtol=1e-12)
    np.testing.assert_allclose(dv, expected[1], rtol=1e-12)
    assert tcpy.vjp(forward, "Q").source == tcpy.grad(forward, "Q").source


def test_reference_kernels_give_reference_backwards():
    src, shapes = layer("softmax")
    reference = tcpy.define(src, backend="reference")
    backward = tcpy.grad(reference)
    assert backward.backend == "reference"
    args = arguments(reference, shapes)
    cots = cotangents(reference, args)
    np.testing.assert_allclose(backward(*args, *cots), tcpy.grad(tcpy.define(src))(*args, *cots), rtol=1e-12)


@pytest.mark.parametrize("src, message", [
    ("def f(double(N) X) -> (O) { O(i) = X(i) % 2.0 }", "cannot differentiate 'O(i) = X(i) % 2.0': '%' has no derivative"),
    ("def f(double(N) X) -> (O) { O(i) = lgamma(X(i)) }", "builtin 'lgamma' has no derivative"),
    ("def f(double(N) X) -> (int32(N) O) { O(i) = int32(X(i)) }",
     "output 'O' is int32 and depends on X; integer values have no derivative"),
    ("def f(double(N) X) -> (O) { O *=! X(i) }", "'*=!' has no derivative in tcpy"),
    ("def f(double(N) X) -> (O) { O(i) = X(i)\n O(i) = O(i) * 2 }", "is written again with '='"),
])
def test_what_has_no_derivative_names_the_statement(src, message):
    with pytest.raises(tcpy.TCSemanticError) as info:
        tcpy.grad(tcpy.define(src))
    assert message in str(info.value)
    assert info.value.line is not None


@pytest.mark.parametrize("wrt, message", [
    (("Z",), "wrt names an input of def 'f': got 'Z', its inputs are X, I"),
    (("I",), "input 'I' of def 'f' is int32: only floating-point inputs have gradients"),
    (("X", "X"), "wrt names input 'X' twice"),
    (3, "wrt must be an input name or a tuple of them, got 3"),
])
def test_bad_wrt(wrt, message):
    kernel = tcpy.define("def f(double(N) X, int32(N) I) -> (O) { O(i) = X(I(i)) }")
    with pytest.raises(tcpy.TCArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tcpy.grad(kernel, wrt)


def test_grad_needs_a_kernel():
    with pytest.raises(tcpy.TCArgumentError, match="expected a kernel made by tcpy.define, got str"):
        tcpy.grad("def f(double(N) X) -> (O) { O(i) = X(i) }")
