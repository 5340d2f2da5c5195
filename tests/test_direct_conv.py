"""The direct-convolution path: output channels in the vector lanes, a run of output pixels in
registers, the image read in place (padding by guards on the tiles that touch it).

Random convolutions against the reference evaluator draw the layout (NCHW or NHWC), groups (one
or two, a batch variable), windows 1-3 x 2-3 with strides 1-2 and dilations 1-2, padding by a
guarded product, a guarded image read or none, output channel counts around the vector widths,
odd image sizes, inf weights (the exact fallback), float32 or float64, every runnable preset and
1, 2 or 7 threads; the same plan gives bitwise the same results at every thread count.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.loopir import ContractionNest
from tcpy.transform.direct_conv import conv_form
from test_contraction import EPS, RUNNABLE, recognized

EXAMPLES = int(os.environ.get("TCPY_DIRECT_CONV_EXAMPLES", "30"))
PRESETS = [name for name in RUNNABLE if name != "host"]


def _paths(kernel, *args):
    return [n.body[0].plan.path for n in kernel.specialize(*args).ir.nests
            if n.body and isinstance(n.body[0], ContractionNest)]


def _conv_source(draw, dtype: str):
    """A random convolution (see the module docstring): ``(source, image shape, weight shape,
    output shape, taps)``, or None when its output is empty."""
    layout = draw(st.sampled_from(["nchw", "nhwc"]))
    groups = draw(st.sampled_from([1, 2]))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    f = draw(st.sampled_from([1, 3, 8, 16, 17, 33]))
    h, w = draw(st.integers(3, 7)), draw(st.sampled_from([4, 5, 9, 13, 19, 30]))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(2, 3))
    stride, dil = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    padding = draw(st.sampled_from(["none", "product", "image"]))
    ph, pw = (0, 0) if padding == "none" else (draw(st.integers(0, kh - 1)), draw(st.integers(0, (kw - 1) * dil)))
    ho, wo = (h + 2 * ph - dil * (kh - 1) - 1) // stride + 1, (w + 2 * pw - dil * (kw - 1) - 1) // stride + 1
    if ho < 1 or wo < 1:
        return None
    y, x = f"{stride}*y + {dil}*a - {ph}", f"{stride}*x + {dil}*b - {pw}"
    g, gs = ("g, ", "G,") if groups == 2 else ("", "")
    if layout == "nchw":
        image, weights, out = f"I(n, {g}c, {y}, {x})", f"Wt({g}f, c, a, b)", f"O(n, {g}f, y, x)"
        shapes = f"{dtype}(N,{gs}C,H,W) I, {dtype}({gs}F,C,KH,KW) Wt"
        arrays = ((n, *((groups,) if g else ()), c, h, w), (*((groups,) if g else ()), f, c, kh, kw),
                  (n, *((groups,) if g else ()), f, ho, wo))
    else:
        image, weights, out = f"I(n, {y}, {x}, {g}c)", f"Wt(a, b, c, {g}f)", f"O(n, y, x, {g}f)"
        shapes = f"{dtype}(N,H,W,{gs}C) I, {dtype}(KH,KW,C,{gs}F) Wt"
        arrays = ((n, h, w, *((groups,) if g else ()), c), (kh, kw, c, *((groups,) if g else ()), f),
                  (n, ho, wo, *((groups,) if g else ()), f))
    inside = f"{y} >= 0 && {y} < H && {x} >= 0 && {x} < W"
    if padding == "none":
        term = f"{image} * {weights}"
    elif padding == "product":
        term = f"({inside}) ? {image} * {weights} : 0.0"
    else:
        term = f"(({inside}) ? {image} : 0.0) * {weights}"
    src = (f"def conv({shapes}) -> (O) {{\n  {out} +=! {term}\n"
           f"    where y in 0:{ho}, x in 0:{wo}, a in 0:{kh}, b in 0:{kw}\n}}\n")
    return src, arrays, c * kh * kw


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_direct_convolutions_match_the_reference(data):
    draw = data.draw
    dtype = draw(st.sampled_from(["float", "double"]))
    drawn = _conv_source(draw, dtype)
    if drawn is None:
        return
    src, (image_shape, weight_shape, out_shape), taps = drawn
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    I = rng.standard_normal(image_shape).astype(np_type)
    Wt = rng.standard_normal(weight_shape).astype(np_type)
    if draw(st.booleans()):  # a weight that is not finite: the padding must add nothing (or NaN, as written)
        Wt.flat[draw(st.integers(0, Wt.size - 1))] = draw(st.sampled_from([np.inf, -np.inf, np.nan]))
    con = recognized(src, I.shape, Wt.shape)
    if con is None or conv_form(con) is None:
        return  # (an extent-1 role is no role: no window left to read in place)
    target, threads = draw(st.sampled_from(PRESETS)), draw(st.sampled_from([1, 2, 7]))
    kernel = tcpy.define(src, options=tcpy.Options(target=target, num_threads=threads,
                                                   plan={"path": "direct_conv"}))
    assert _paths(kernel, I, Wt) == ["direct_conv"]
    want = tcpy.define(src, backend="reference")(I, Wt)
    got = kernel(I, Wt)
    assert got.dtype == want.dtype and got.shape == want.shape == out_shape
    tol = 8 * taps * EPS[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.nanmax(np.abs(want), initial=0)))


NCHW_PADDED = """
def conv(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                      ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}
"""


@pytest.mark.parametrize("target", PRESETS)
def test_results_are_bitwise_the_same_at_every_thread_count(target):
    """Each item (batch index, row, channel block) sums its taps in one order whichever thread
    claims it."""
    rng = np.random.default_rng(7)
    I = rng.standard_normal((2, 5, 9, 23), dtype=np.float32)
    Wt = rng.standard_normal((37, 5, 3, 3), dtype=np.float32)
    results = []
    for threads in (1, 2, 7):
        kernel = tcpy.define(NCHW_PADDED, options=tcpy.Options(target=target, num_threads=threads,
                                                               plan={"path": "direct_conv"}))
        assert _paths(kernel, I, Wt) == ["direct_conv"]
        results += [kernel(I, Wt), kernel(I, Wt)]
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])
    want = tcpy.define(NCHW_PADDED, backend="reference")(I, Wt)
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_planner_takes_the_direct_path_for_a_wide_vector_convolution():
    """64 channels of 56 x 56 pixels on AVX-512: the implicit GEMM's window gather costs more
    than the direct convolution's broadcasts; explain() says why."""
    I = np.zeros((1, 64, 56, 56), np.float32)
    Wt = np.zeros((64, 64, 3, 3), np.float32)
    kernel = tcpy.define(NCHW_PADDED, options=tcpy.Options(target="x86-64-v4", num_threads=2, winograd=False))
    assert _paths(kernel, I, Wt) == ["direct_conv"]
    text = str(kernel.explain(I, Wt))
    assert "direct-convolution path" in text and "less time than the implicit GEMM" in text
    assert "register tile" in text and "weights rearranged once per call" in text


def test_a_one_by_one_convolution_is_no_direct_convolution():
    src = "def conv(float(N,C,H,W) I, float(F,C) Wt) -> (O) { O(n, f, h, w) +=! I(n, c, h, w) * Wt(f, c) }"
    I, Wt = np.ones((1, 4, 5, 5), np.float32), np.ones((8, 4), np.float32)
    kernel = tcpy.define(src, options=tcpy.Options(plan={"path": "direct_conv"}))
    with pytest.raises(tcpy.TCOptionError, match=r"Options.plan\['path'\] must be a path this contraction can "
                                                  r"run \(packed.*got 'direct_conv'"):
        kernel(I, Wt)


BIAS_RELU = """
def conv(float(N,H,W,C) I, float(3,3,C,F) Wt, float(F) bias) -> (O, Y) {
    O(n, h, w, f) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                      ? I(n, h + kh - 1, w + kw - 1, c) * Wt(kh, kw, c, f) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
    Y(n, h, w, f) = max(O(n, h, w, f) + bias(f), 0.0)
}
"""


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", PRESETS)
def test_channels_last_with_a_fused_bias_and_relu(target, threads):
    rng = np.random.default_rng(3)
    I = rng.standard_normal((2, 6, 11, 5), dtype=np.float32)
    Wt = rng.standard_normal((3, 3, 5, 19), dtype=np.float32)
    bias = rng.standard_normal(19, dtype=np.float32)
    kernel = tcpy.define(BIAS_RELU, options=tcpy.Options(target=target, num_threads=threads,
                                                         plan={"path": "direct_conv"}))
    assert "direct_conv" in _paths(kernel, I, Wt, bias)
    want = tcpy.define(BIAS_RELU, backend="reference")(I, Wt, bias)
    for got, ref in zip(kernel(I, Wt, bias), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
