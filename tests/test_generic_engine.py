"""The run-time contraction engine of size-generic kernels: one compile serves GEMMs, batched
GEMMs, convolutions and attention's products at every shape, with the reference evaluator's
results."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.demo import ATTENTION
from tcpy.target import Target

GEMM_TN = """
def gemm_tn(float(K,M) A, float(N,K) B) -> (C) {
    C(m, n) +=! 2.5 * A(k, m) * B(n, k)
}
"""
# accumulates into its first statement's values; double
GEMM_ACC = """
def gemm_acc(double(M,K) A, double(K,N) B, double(M,N) C0) -> (C) {
    C(m, n) = C0(m, n)
    C(m, n) += A(m, k) * B(k, n)
}
"""
# operands of two types: a call that would exchange them runs them in the kernel's order
GEMM_CAST = """
def gemm_cast(float(M,K) A, double(K,N) B, double s) -> (C) {
    C(m, n) +=! double(A(m, k)) * B(k, n) * s
}
"""
BMM = """
def bmm(float(Z,M,K) A, float(Z,N,K) B) -> (C) {
    C(z, m, n) +=! A(z, m, k) * B(z, n, k)
}
"""
CONV_STRIDED = """
def conv_strided(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(f, c, kh, kw)
        where h in 0:(H - KH)/2 + 1, w in 0:(W - KW)/2 + 1
}
"""
# "same" padding as a guard around the whole product: a failing term adds nothing
CONV_PADDED = """
def conv_padded(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
        ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
}
"""
# NHWC, the guard around the image's read alone: a failing term is 0 times the weight
CONV_NHWC = """
def conv_nhwc(float(N,H,W,C) I, float(F,KH,KW,C) Wt) -> (O) {
    O(n, h, w, f) +=! ((h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
        ? I(n, h + kh - 1, w + kw - 1, c) : 0.0) * Wt(f, kh, kw, c)
        where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
}
"""

# 0, 1, primes, around the vector widths and micro-tiles (8 and 6 rows; 16, 48 and 64
# columns), a few larger
SIZES = (0, 1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 31, 47, 48, 49, 64, 65, 97, 130)
SMALL = (0, 1, 2, 3, 4, 5, 7)  # a convolution's channels and batch, attention's heads


def _arrays(rng, *shapes, dtype=np.float32):
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in shapes)


def _gemm_tn(rng, draw):
    m, n, k = draw(SIZES), draw(SIZES), draw(SIZES)
    return _arrays(rng, (k, m), (n, k))


def _gemm_acc(rng, draw):
    m, n, k = draw(SIZES), draw(SIZES), draw(SIZES)
    return _arrays(rng, (m, k), (k, n), (m, n), dtype=np.float64)


def _gemm_cast(rng, draw):
    m, n, k = draw(SIZES), draw(SIZES), draw(SIZES)
    a, = _arrays(rng, (m, k))
    b, = _arrays(rng, (k, n), dtype=np.float64)
    return a, b, np.float64(-0.75)


def _bmm(rng, draw):
    z, m, n, k = draw(SMALL), draw(SIZES), draw(SIZES), draw(SIZES)
    return _arrays(rng, (z, m, k), (z, n, k))


def _conv(rng, draw, channels_last=False, stride=1):
    n, c, f = draw(SMALL), draw(SMALL), draw((1, 2, 5, 17))
    kh, kw = draw((1, 2, 3)), draw((1, 3))
    h, w = draw((1, 2, 5, 9, 16)) + kh, draw((1, 3, 7, 16, 50)) + kw
    if channels_last:
        return _arrays(rng, (n, h, w, c), (f, kh, kw, c))
    return _arrays(rng, (n, c, h * stride, w * stride), (f, c, kh, kw))


def _attention(rng, draw):
    b, h, length, keys, d = draw((1, 2)), draw((1, 3)), draw(SIZES), draw(SIZES), draw((1, 8, 17))
    return (*_arrays(rng, (b, h, length, d), (b, h, keys, d), (b, h, keys, d)), np.float32(0.25))


CASES = {
    "gemm_tn": (GEMM_TN, _gemm_tn),
    "gemm_acc": (GEMM_ACC, _gemm_acc),
    "gemm_cast": (GEMM_CAST, _gemm_cast),
    "bmm": (BMM, _bmm),
    "conv_strided": (CONV_STRIDED, lambda rng, draw: _conv(rng, draw, stride=2)),
    "conv_padded": (CONV_PADDED, _conv),
    "conv_nhwc": (CONV_NHWC, lambda rng, draw: _conv(rng, draw, channels_last=True)),
    "attention": (ATTENTION, _attention),
}


def _runnable_presets():
    presets = ["x86-64-v3", "x86-64", "x86-64-v4"]
    return [p for p in presets if Target.preset(p).can_run_here()]


# every case on one preset and thread count, the presets and 1, 2 and 7 threads taken in turn
CONFIGS = [(name, _runnable_presets()[k % len(_runnable_presets())], (1, 2, 7)[k % 3])
           for k, name in enumerate(CASES)]


_kernels = {}


def _kernel(name, preset, threads):
    """One kernel per configuration for the whole module (hypothesis calls it with many shapes)."""
    key = (name, preset, threads)
    if key not in _kernels:
        options = tcpy.Options(specialize="never", target=preset, num_threads=threads)
        source = CASES[name][0]
        _kernels[key] = (tcpy.define(source, options=options), tcpy.define(source, backend="reference"))
    return _kernels[key]


@pytest.mark.parametrize("name, preset, threads", CONFIGS)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_generic_kernel_runs_the_engine_at_every_shape(builds, name, preset, threads, data):
    kernel, reference = _kernel(name, preset, threads)
    rng = np.random.default_rng(0)
    draw = lambda values: data.draw(st.sampled_from(values))  # noqa: E731
    for _ in range(4):
        args = CASES[name][1](rng, draw)
        got, want = kernel(*args), reference(*args)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    text = kernel.explain(*args)
    assert "kernel: generic" in text and "run-time engine (" in text, text
    # one build in the kernel's life (this test's examples are its only calls)
    assert len(builds) == 1 and "generic" in builds[0]


def test_explain_names_the_engine_and_its_plan_at_each_shape():
    kernel = tcpy.define(BMM, options=tcpy.Options(specialize="never", target="x86-64-v3", num_threads=2))
    a, b = np.ones((3, 40, 20), np.float32), np.ones((3, 50, 20), np.float32)
    np.testing.assert_array_equal(kernel(a, b), np.full((3, 40, 50), 20, np.float32))
    text = kernel.explain(a, b)
    # the micro-tile is the preset's (6 x 16 floats in AVX2's 16 registers)
    assert ("generic kernel: C(z, m, n) +=! A(z, m, k) * B(z, n, k): run-time engine (stream path: A read in place, "
            "each K block of B packed; one routine for every size): micro-tile 6x16; at these sizes batch 3 x M 40 x N 50 x K 20, blocks kc 20") in text, text
    assert "batch 5 x M 7 x N 9 x K 11" in kernel.explain(np.ones((5, 7, 11), np.float32), np.ones((5, 9, 11), np.float32))


def test_inf_beside_padding_sums_as_written(builds):
    """0 x inf is NaN: where the guard around the whole product fails the term adds nothing, so
    an inf in the weights leaves the padded outputs finite; around the image alone it makes
    them NaN."""
    rng = np.random.default_rng(4)
    for source in (CONV_PADDED, CONV_NHWC):
        kernel = tcpy.define(source, options=tcpy.Options(specialize="never", num_threads=2))
        reference = tcpy.define(source, backend="reference")
        for c in (2, 3):
            image, weights = _arrays(rng, (1, c, 6, 5), (4, c, 3, 3))
            if source is CONV_NHWC:
                image, weights = image.transpose(0, 2, 3, 1).copy(), weights.transpose(0, 2, 3, 1).copy()
            weights.flat[7] = np.inf
            np.testing.assert_allclose(kernel(image, weights), reference(image, weights), rtol=1e-5, atol=1e-5)
    assert len(builds) == 2


def test_a_rank0_scale_that_is_nan_scales_every_term():
    kernel = tcpy.define(GEMM_CAST, options=tcpy.Options(specialize="never"))
    reference = tcpy.define(GEMM_CAST, backend="reference")
    a, b = np.zeros((3, 4), np.float32), np.ones((4, 5))
    for s in (np.float64(2.0), np.float64(np.inf), np.float64(np.nan)):
        np.testing.assert_array_equal(kernel(a, b, s), reference(a, b, s))


@pytest.mark.parametrize("product", ["A(m, k) * B(k, n) / 8", "A(m, k) / 4.0 * B(k, n)", "A(m, k) * B(k, n) / K"])
def test_a_scaled_product_runs_generic_at_every_shape(builds, product):
    """A literal divisor is the engine's scale; a divisor of the sizes scales the product's
    result, a loop statement (generic: multiplied by the exact reciprocal where there is one)."""
    source = f"def f(float(M,K) A, float(K,N) B) -> (C) {{ C(m, n) +=! {product} }}"
    kernel = tcpy.define(source, options=tcpy.Options(specialize="never", num_threads=2))
    reference = tcpy.define(source, backend="reference")
    rng = np.random.default_rng(5)
    for m, k, n in ((3, 4, 5), (17, 8, 33), (64, 7, 65), (1, 1, 1)):
        a, b = _arrays(rng, (m, k), (k, n))
        np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-6)
    assert len(builds) == 1 and "generic" in builds[0]
