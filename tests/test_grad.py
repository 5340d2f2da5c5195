"""tcpy.grad, tcpy.vjp and tcpy.value_and_grad: backward defs checked against central finite
differences in float64 (the forward evaluated by the reference backend, the backward compiled),
and the errors for what has no derivative."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

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
                          ? I(n, c, h + kh - 1, w + kw - 1) * Wt(c, kh, kw) : 0
                          where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
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
    return [rng.standard_normal(np.shape(o)).astype(np.asarray(o).dtype) for o, r in zip(outs, kernel.def_.returns)
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
    if wrt is None:
        names = [p.name for p in reference.def_.params if reference.def_.tensor(p.name).scalar.is_float]
    else:
        names = [wrt] if isinstance(wrt, str) else list(wrt)
    assert len(names) == len(got)
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
    # the taps run backwards: the image is read through a forward window, the weights reversed
    assert ("dI(n, c, i2, i3) +=! i2 - h >= 0" not in source
            and "dO(n, f, i2 - KH + kh + 1, i3 - KW + kw + 1) * Wt(f, c, KH - kh - 1, KW - kw - 1)" in source)
    assert "dWt(f, c, kh, kw) +=! dO(n, f, h, w) * I(n, c, h + kh, w + kw)" in source


def test_max_pool_ties_go_to_the_first():
    src = "def f(double(N) I) -> (O) { O(n) max=! I(2*n + k) where k in 0:3 }"
    backward = tcpy.grad(tcpy.define(src))
    x = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 5.0])
    dx = backward(x, np.array([10.0, 100.0, 1000.0]))
    np.testing.assert_array_equal(dx, [0, 10, 100, 0, 0, 0, 1000])


@pytest.mark.parametrize("values", [[1.5, -2.0, 0.5, 3.0], [1.5, 0.0, 0.5, 3.0], [0.0, 2.0, 0.0, 3.0]])
def test_product_reduction_as_torch_prod(values):
    """No zero: T / x; one zero: the product of the others there, 0 elsewhere; two: all 0."""
    backward = tcpy.grad(tcpy.define("def f(double(N,M) X) -> (O) { O(n) *=! X(n, m) * 2 }"))
    x = np.array([values, [0.5, 1.0, -1.0, 2.0]])
    got = backward(x, np.array([3.0, -1.0]))
    others = np.array([[np.prod(np.delete(2 * row, j)) for j in range(4)] for row in x])
    np.testing.assert_allclose(got, others * 2 * np.array([[3.0], [-1.0]]), rtol=1e-14)


def test_accumulating_into_earlier_values_has_no_derivative():
    with pytest.warns(tcpy.TCWarning):
        forward = tcpy.define("def f(double(N) X) -> (O) { O(i) *= X(i) }")
    with pytest.raises(tcpy.TCSemanticError, match="'O\\(i\\) \\*= X\\(i\\)': '\\*=' into earlier values has no "
                                                    "derivative in tcpy \\(write '\\*=!'\\)"):
        tcpy.grad(forward)


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


def score_sized_temporaries(kernel, args) -> list[str]:
    """The temporaries the launcher allocates for a call at full size of at least L x S."""
    entry = kernel._launch_entry(tuple(args))
    names = [t.name for t in kernel.def_.temporaries]
    score = args[0].shape[-2] * args[1].shape[-2]
    return [name for name, (shape, _) in zip(names, entry.temp_specs) if np.prod(shape) >= score]


def test_softmax_attention_gradient_keeps_the_quotient_and_drops_the_shift():
    """``P = E / Sm``, whose P the gradient of ``P * V`` reads anyway: Sm's cotangent reads P
    (``-dP * P / Sm``), not ``E / Sm / Sm``, so E lives in a fused group's row buffer only. The
    row maximum only shifts the exponent of a normalised quotient: it gets no cotangent (no
    arg-max mask, no sum over the row). Checked against the closed form in NumPy."""
    src = """def f(double(B,L,D) Q, double(B,S,D) K, double(B,S,D) V) -> (O) {
        Sc(b, l, s) +=! Q(b, l, d) * K(b, s, d)
        Mx(b, l) max=! Sc(b, l, s)
        E(b, l, s) = exp(Sc(b, l, s) - Mx(b, l))
        Sm(b, l) +=! E(b, l, s)
        P(b, l, s) = E(b, l, s) / Sm(b, l)
        O(b, l, d) +=! P(b, l, s) * V(b, s, d)
    }"""
    shapes = [(2, 40, 8), (2, 48, 8), (2, 48, 8)]
    forward = tcpy.define(src, options=tcpy.Options(specialize="always"))  # (a generic kernel runs no chain)
    args = arguments(forward, shapes)
    cots = cotangents(forward, args)
    backward = tcpy.grad(forward)
    assert "-(dP(b, l, s) * (P(b, l, s) / Sm(b, l)))" in backward.source
    assert "dMx" not in backward.source and "min=!" not in backward.source  # (no arg-max mask)
    assert score_sized_temporaries(backward, [*args, *cots]) == []  # (one chain over blocks of rows of l)
    Q, K, V = args
    (dO,) = cots
    P = np.exp(Q @ K.transpose(0, 2, 1))
    P /= P.sum(axis=2, keepdims=True)
    dP = dO @ V.transpose(0, 2, 1)
    dS = P * (dP - (dP * P).sum(axis=2, keepdims=True))
    want = dS @ K, dS.transpose(0, 2, 1) @ Q, P.transpose(0, 2, 1) @ dO
    for got, expected in zip(backward(*args, *cots), want):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_a_maximum_that_is_also_an_output_keeps_its_cotangent():
    check_against_finite_differences("""def f(double(N,M) X) -> (Y, Mx) {
        Mx(n) max=! X(n, m)
        E(n, m) = exp(X(n, m) - Mx(n))
        Sm(n) +=! E(n, m)
        Y(n, m) = E(n, m) / Sm(n)
    }""", [(3, 4)])


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
    ("def f(double(N) X) -> (O) { O(i) = X(i)\n O(i) max= X(i) * 2 }", "is written again with 'max='"),
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
    ((), "wrt names no input of def 'f' to differentiate"),
])
def test_bad_wrt(wrt, message):
    kernel = tcpy.define("def f(double(N) X, int32(N) I) -> (O) { O(i) = X(I(i)) }")
    with pytest.raises(tcpy.TCArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tcpy.grad(kernel, wrt)


def test_grad_needs_a_kernel():
    with pytest.raises(tcpy.TCArgumentError, match="expected a kernel made by tcpy.define, got str"):
        tcpy.grad("def f(double(N) X) -> (O) { O(i) = X(i) }")


# ----------------------------------------------------------------------------- against PyTorch


def torch_layers(torch):
    """The layers of LAYERS written with PyTorch's operators (same inputs, same outputs)."""
    F = torch.nn.functional

    def attention(q, k, v, causal=False):
        scores = q @ k.transpose(-1, -2)
        if causal:
            mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, -1e30)
        return torch.softmax(scores, -1) @ v

    def normalize(x, dims, g, b):
        mean = x.mean(dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dims, keepdim=True)
        return (x - mean) / torch.sqrt(var + 0.00001) * g + b

    return {
        "gemm": lambda a, b: a @ b,
        "batched_gemm": lambda a, b: a @ b,
        "conv": lambda i, w: F.conv2d(i, w),
        "conv_stride_padding": lambda i, w: F.conv2d(i, w, stride=2, padding=1),
        "conv_groups": lambda i, w: F.conv2d(i.flatten(1, 2), w.flatten(0, 1), groups=i.shape[1]).unflatten(1, (i.shape[1], -1)),
        "depthwise": lambda i, w: F.conv2d(i, w[:, None], padding=1, groups=i.shape[1]),
        "max_pool": lambda i: F.max_pool2d(i[:, None], 2)[:, 0],
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: torch.log_softmax(x, -1),
        "layer_norm": lambda x, g, b: normalize(x, (1,), g, b),
        "batch_norm": lambda x, g, b: normalize(x, (0, 2), g[:, None], b[:, None]),
        "attention": attention,
        "causal_attention": lambda q, k, v: attention(q, k, v, causal=True),
        "embedding": lambda e, idx: F.embedding(idx.long(), e),
        "sum_of_squares": lambda x, y: ((x - y) ** 2).sum(),
    }


@pytest.mark.parametrize("scalar, rtol", [("float", 1e-4), ("double", 1e-10)])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_match_torch_autograd(name, scalar, rtol):
    torch = pytest.importorskip("torch")
    src, shapes = layer(name, scalar)
    forward = tcpy.define(src)
    args = arguments(forward, [tuple(4 * d for d in s) if name == "max_pool" else s for s in shapes],
                      dtype=np.float32 if scalar == "float" else np.float64)
    if name == "max_pool":
        args[0] = np.round(args[0] * 2)  # ties inside windows: the first takes the gradient
    cots = [c.astype(args[0].dtype) for c in cotangents(forward, args)]
    tensors = [torch.from_numpy(a).requires_grad_(a.dtype.kind == "f") for a in args]
    out = torch_layers(torch)[name](*tensors)
    np.testing.assert_allclose(forward(*args), out.detach().numpy(), rtol=rtol, atol=rtol)
    out.backward(torch.from_numpy(cots[0]))
    got = tcpy.grad(forward)(*args, *cots)
    got = got if isinstance(got, tuple) else (got,)
    expected = [t.grad.numpy() for t in tensors if t.requires_grad]
    for value, want in zip(got, expected):
        assert value.dtype == want.dtype
        np.testing.assert_allclose(value, want, rtol=rtol, atol=rtol * np.abs(want).max())


# ----------------------------------------------------------------------------- random defs

SIZES = {"N": 3, "M": 4}
# index variables by the size they range over: outputs i, j; reductions r, k
VARS = {"N": ("i", "r"), "M": ("j", "k")}
UNARY = ("exp({} / 4)", "tanh({})", "sin({})", "erf({})", "sqrt({0} * {0} + 1)", "log({0} * {0} + 1)",
         "atan({})", "fabs({})", "-{}", "cos({})", "expm1({} / 4)")
BINARY = ("{} + {}", "{} - {}", "{} * {}", "{0} / ({1} * {1} + 1)", "max({}, {})", "fmin({}, {})",
          "hypot({}, {})", "i < j ? {} : {}")


@st.composite
def differentiable_defs(draw):
    """A def of 1-3 statements over X(N, M), Y(M), Z(N): element-wise math, sums and max
    reductions, temporaries read by later statements; returns (source, input shapes)."""
    tensors = {"X": ("N", "M"), "Y": ("M",), "Z": ("N",)}
    stmts = []
    for s in range(draw(st.integers(1, 3))):
        out_dims = draw(st.sampled_from([("N",), ("M",), ("N", "M"), ()]))
        lhs = [VARS[d][0] for d in out_dims]
        reduce_dim = draw(st.sampled_from([None, "N", "M"]))
        if reduce_dim is not None and VARS[reduce_dim][0] in lhs:
            reduce_dim = None
        usable = set(lhs) | ({VARS[reduce_dim][1]} if reduce_dim else set())

        def access():
            name = draw(st.sampled_from(sorted(tensors)))
            indices = []
            for d in tensors[name]:
                choices = [v for v in VARS[d] if v in usable]
                if not choices:
                    return None
                v = draw(st.sampled_from(choices))
                indices.append(draw(st.sampled_from([v, f"{d} - 1 - {v}"])))
            return f"{name}({', '.join(indices)})" if indices else name

        def expr(depth):
            if depth == 0 or draw(st.integers(0, 2)) == 0:
                a = access()
                return a if a is not None else "2"
            if draw(st.booleans()):
                return draw(st.sampled_from(UNARY)).format(f"({expr(depth - 1)})")
            form = draw(st.sampled_from(BINARY))
            if form.startswith("i < j") and not {"i", "j"} <= usable:
                form = "{} * {}"
            return form.format(f"({expr(depth - 1)})", f"({expr(depth - 1)})")

        rhs = expr(3)
        for v in sorted(usable):  # every chosen variable appears: the ranges are the ones meant
            rhs = f"({rhs}) * {'Z' if v in VARS['N'] else 'Y'}({v})"
        op = "=" if reduce_dim is None else draw(st.sampled_from(["+=!", "+=!", "max=!", "min=!", "*=!"]))
        target = f"T{s}"
        stmts.append(f"{target}({', '.join(lhs)}) {op} {rhs}" if lhs else f"{target} {op} {rhs}")
        tensors[target] = out_dims
    body = "\n    ".join(stmts)
    outputs = sorted({f"T{len(stmts) - 1}", f"T{draw(st.integers(0, len(stmts) - 1))}"})
    source = f"def f(double(N, M) X, double(M) Y, double(N) Z) -> ({', '.join(outputs)}) {{\n    {body}\n}}"
    return source, [(3, 4), (4,), (3,)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(differentiable_defs())
def test_random_defs_match_finite_differences(case):
    source, shapes = case
    check_against_finite_differences(source, shapes)


@pytest.mark.parametrize("src, shapes", [
    ("def f(double(N) X, double(N) Y) -> (O) { O(i) = tanh(X(i)) * Y(i) + exp(X(i) * Y(i) / 4) }", [(4,), (4,)]),
    ("def f(double(N) X) -> (O) { O(i) = X(i) > 0 ? sqrt(X(i) * X(i) + 1) : sin(X(i)) / (X(i) * X(i) + 1) }", [(5,)]),
    ("def f(double(N) X) -> (O) { O(i) = max(X(i), X(N - 1 - i) / 2) * erf(X(i)) }", [(5,)]),
    ("def f(double(N, M) X) -> (L) { L +=! log(X(n, m) * X(n, m) + 1) * X(n, m) }", [(2, 3)]),
])
def test_second_order(src, shapes):
    """The backward is a def like any other: its own backward matches its finite differences."""
    backward = tcpy.grad(tcpy.define(src))
    forward = tcpy.define(src, backend="reference")
    outputs = forward(*arguments(forward, shapes))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    check_against_finite_differences(backward.source, shapes + [np.shape(o) for o in outputs])


def test_strided_window_gradient_is_split_by_phase():
    """A stride-2 window's input gradient is one gather per phase (input rows and columns even
    or odd) over the taps of that phase, interleaved: no sum over every output point, no ``% 2``
    inside a sum."""
    backward = tcpy.grad(tcpy.define(layer("max_pool")[0]))
    lines = backward.source.splitlines()
    phases = [line for line in lines if line.startswith("    dI_phase")]
    assert [line.split("(")[0].strip() for line in phases] == ["dI_phase00", "dI_phase01", "dI_phase10", "dI_phase11"]
    assert all("%" not in line for line in phases)
    assert lines[-2] == ("    dI(i0, i1, i2) +=! i1 % 2 == 0 ? i2 % 2 == 0 ? dI_phase00(i0, i1 / 2, i2 / 2) : "
                         "dI_phase01(i0, i1 / 2, i2 / 2) : i2 % 2 == 0 ? dI_phase10(i0, i1 / 2, i2 / 2) : "
                         "dI_phase11(i0, i1 / 2, i2 / 2) where i0 in 0:N, i1 in 0:H, i2 in 0:W")


def test_cotangent_of_the_wrong_shape():
    forward = tcpy.define("def f(double(N) X) -> (O) { O(i) +=! X(i + j) where j in 0:2 }")
    backward = tcpy.grad(forward)
    np.testing.assert_array_equal(backward(np.ones(5), np.ones(4)), [1, 2, 2, 2, 1])
    with pytest.raises(tcpy.TCShapeError, match=r"def 'f_grad': cotangent dO must have the shape of output O, "
                                                 r"\(4,\), got \(6,\)"):
        backward(np.ones(5), np.ones(6))
