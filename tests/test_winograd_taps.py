"""Winograd F(3x3, 2x2) weight gradients (tcpy.transform.winograd_taps): which gradients take the
path, and differential tests against the reference evaluator with the path forced on small
random weight gradients (layouts, either operand the image, padding by guards, odd sizes,
several images, +=, scales, float and double, every preset this CPU runs, tiny caches for
several chunks, 1-3 threads), the same bits at every thread count, special values, and
tcpy.grad of a convolution against torch.autograd."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
import tcpy.target
from tcpy import demo
from tcpy.target import Target
from test_contraction import EPS, RUNNABLE, tiny_caches
from test_conv import _engine
from test_winograd import ALWAYS_WINOGRAD, AVX2

EXAMPLES = int(os.environ.get("TCPY_CONV_EXAMPLES", "25"))


def _paths(kernel, *args) -> list[str]:
    return [nest.plan.path for nest in _engine(kernel, *args)]


def _weight_gradient(k=3, stride=1, pad=1, threads=2):
    """tcpy.grad of a padded NCHW convolution with respect to its weights, specialised to the
    shapes on AVX2."""
    options = tcpy.Options(target=AVX2, specialize="always", num_threads=threads)
    forward = tcpy.define(demo.padded_conv2d_source(k, stride, pad), options=options)
    return tcpy.grad(forward, wrt=("Wt",))


def _shapes(n, c, f, hw, k=3, stride=1):
    out = (hw + 2 * (k // 2) - k) // stride + 1
    return (np.zeros((n, c, hw, hw), np.float32), np.zeros((f, c, k, k), np.float32),
            np.zeros((n, f, out, out), np.float32))


@pytest.mark.parametrize("threads", [1, 2, 8])
@pytest.mark.parametrize("n, c, hw", [(1, 64, 56), (1, 128, 28), (1, 256, 14), (8, 64, 56)])
def test_resnet_weight_gradients_take_the_path(n, c, hw, threads):
    kernel = _weight_gradient(threads=threads)
    args = _shapes(n, c, c, hw)
    assert _paths(kernel, *args) == ["winograd_taps"]
    text = str(kernel.explain(*args))
    assert "Winograd F(3x3, 2x2) over (h + kh, w + kw), the taps as outputs" in text
    assert "why: winograd_taps path" in text


@pytest.mark.parametrize("k, stride, shapes", [
    (3, 2, _shapes(1, 128, 128, 56, stride=2)),  # stride 2
    (5, 1, _shapes(1, 64, 64, 56, k=5)),  # a 5x5 window
    (3, 1, _shapes(1, 4, 4, 8)),  # too little work for the transforms to pay
])
def test_other_weight_gradients_keep_the_gemm(k, stride, shapes):
    assert _paths(_weight_gradient(k, stride, k // 2), *shapes) in (["packed"], ["small"], ["stream"])


def test_the_option_turns_the_path_off():
    options = tcpy.Options(target=AVX2, winograd=False, specialize="always", num_threads=2)
    forward = tcpy.define(demo.padded_conv2d_source(3, 1, 1), options=options)
    assert _paths(tcpy.grad(forward, wrt=("Wt",)), *_shapes(1, 64, 64, 56)) == ["packed"]


@st.composite
def weight_gradients(draw):
    """``dW(f, c, kh, kw) = sum over images and pixels of dO(n, f, h, w) * I(n, c, h + kh - ph,
    w + kw - pw)`` in NCHW or NHWC, either operand first, padded by a guard of 0-2 per axis or
    not, odd sizes, written with ``+=!`` or as ``+=`` after an initial value, maybe scaled."""
    dtype = draw(st.sampled_from(["float", "float", "double"]))
    layout = draw(st.sampled_from(["nchw", "nhwc"]))
    n, c = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 3, 8, 13, 17]))
    f = draw(st.sampled_from([2, 5, 16]))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    oh, ow = draw(st.integers(max(2, 2 * ph), 13)), draw(st.integers(max(2, 2 * pw), 17))
    h, w = oh + 2 - 2 * ph, ow + 2 - 2 * pw
    y, x = f"h + kh - {ph}", f"w + kw - {pw}"
    guard = ([f"h + kh >= {ph}", f"h + kh < H + {ph}"] if ph else []) + ([f"w + kw >= {pw}", f"w + kw < W + {pw}"]
                                                                            if pw else [])
    if layout == "nchw":
        image, grad, out = f"I(n, c, {y}, {x})", "dO(n, f, h, w)", "dW(f, c, kh, kw)"
        i_shape, o_shape, w_shape, sizes, o_sizes = (n, c, h, w), (n, f, oh, ow), (f, c, 3, 3), "N,C,H,W", "N,F,OH,OW"
    else:
        image, grad, out = f"I(n, {y}, {x}, c)", "dO(n, h, w, f)", "dW(kh, kw, c, f)"
        i_shape, o_shape, w_shape, sizes, o_sizes = (n, h, w, c), (n, oh, ow, f), (3, 3, c, f), "N,H,W,C", "N,OH,OW,F"
    scale = draw(st.sampled_from(["", "", "0.5 * ", "-3.0 * "]))
    read = f"{scale}{image} * {grad}" if draw(st.booleans()) else f"{scale}{grad} * {image}"
    rhs = f"({' && '.join(guard)}) ? {read} : 0.0" if guard else read
    where = "where h in 0:OH, w in 0:OW, kh in 0:3, kw in 0:3"
    head = f"def wgrad({dtype}({sizes}) I, {dtype}({o_sizes}) dO"
    if draw(st.booleans()):  # +=! (overwrite)
        source = f"{head}) -> (dW) {{\n    {out} +=! {rhs}\n        {where}\n}}\n"
        extra = ()
    else:  # += onto an initial value
        names = "kh, kw, c, f" if layout == "nhwc" else "f, c, kh, kw"
        source = (f"{head}, {dtype}({','.join(f'S{i}' for i in range(4))}) D0) -> (dW) {{\n"
                  f"    {out} = D0({names})\n    {out} += {rhs}\n        {where}\n}}\n")
        extra = (w_shape,)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    np_dtype = np.float32 if dtype == "float" else np.float64
    args = tuple(rng.uniform(-1, 1, shape).astype(np_dtype) for shape in (i_shape, o_shape, *extra))
    target = draw(st.sampled_from(RUNNABLE))
    options = {"num_threads": draw(st.sampled_from([1, 2, 3])), "specialize": "always",
               "target": tiny_caches(Target.preset(target)) if draw(st.booleans()) else target}
    return source, args, options, dtype, n * oh * ow


def _check_close(got, want, dtype, k_len):
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = EPS[dtype]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=32 * eps * (k_len + 1), atol=32 * eps * (k_len + 1) * scale)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=weight_gradients())
def test_random_weight_gradients_match_the_reference(case):
    source, args, options, dtype, k_len = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)  # every such gradient takes the path
        kernel = tcpy.define(source, options=tcpy.Options(**options))
        assert "winograd_taps" in _paths(kernel, *args), kernel.explain(*args)
        got = kernel(*args)
    _check_close(got, tcpy.define(source, backend="reference")(*args), dtype, k_len)


PADDED_WGRAD = """
def wgrad(float(N,C,H,W) I, float(N,F,H,W) dO) -> (dW) {
    dW(f, c, kh, kw) +=! (h + kh >= 1 && h + kh < H + 1 && w + kw >= 1 && w + kw < W + 1)
                          ? dO(n, f, h, w) * I(n, c, h + kh - 1, w + kw - 1) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}
"""


@pytest.mark.parametrize("target", RUNNABLE)
def test_every_thread_count_gives_the_same_bits(target):
    """Several chunks (tiny caches) of tiles claimed by 1, 2 or 3 threads: each product sums its
    tiles in one order."""
    rng = np.random.default_rng(2)
    I = rng.standard_normal((2, 13, 15, 17), dtype=np.float32)
    dO = rng.standard_normal((2, 21, 15, 17), dtype=np.float32)
    results = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)
        for threads in (1, 2, 3):
            kernel = tcpy.define(PADDED_WGRAD, options=tcpy.Options(target=tiny_caches(Target.preset(target)),
                                                                    num_threads=threads, specialize="always"))
            assert _paths(kernel, I, dO) == ["winograd_taps"]
            assert "chunks of" in str(kernel.explain(I, dO))
            results.append(kernel(I, dO))
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    _check_close(results[0], tcpy.define(PADDED_WGRAD, backend="reference")(I, dO), "float", 2 * 15 * 17)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", RUNNABLE)
def test_inf_nan_and_huge_values_give_the_direct_sums(target, threads):
    """An inf in a tile of either operand would make NaN of whole points through the transforms'
    differences; these calls must hold what the reference computes (a padded tap adds nothing,
    even against an inf); finite calls keep the path."""
    rng = np.random.default_rng(5)
    I = rng.standard_normal((1, 16, 12, 13), dtype=np.float32)
    dO = rng.standard_normal((1, 16, 12, 13), dtype=np.float32)
    reference = tcpy.define(PADDED_WGRAD, backend="reference")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)
        options = tcpy.Options(target=target, num_threads=threads, specialize="always")
        kernel = tcpy.define(PADDED_WGRAD, options=options)
        assert _paths(kernel, I, dO) == ["winograd_taps"]
    for tensor, at, value in ((I, (0, 3, 5, 6), np.inf), (dO, (0, 7, 0, 0), np.nan), (I, (0, 9, 0, 0), -np.inf),
                              (I, (0, 1, 4, 4), 3e30), (dO, (0, 15, 11, 12), -np.inf), (dO, (0, 5, 1, 1), 3e30)):
        original = tensor[at]
        tensor[at] = value
        got, want = kernel(I, dO), reference(I, dO)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        scale = max(1.0, np.abs(want[finite]).max())
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4 * scale)
        tensor[at] = original
    np.testing.assert_allclose(kernel(I, dO), reference(I, dO), rtol=1e-4, atol=1e-3)


def test_conv_gradient_matches_torch():
    """tcpy.grad of a padded 3x3 convolution (its weight gradient on the path) against
    torch.autograd, in float32 and float64."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    for dtype, rtol in ((np.float32, 1e-4), (np.float64, 1e-10)):
        I, W = rng.standard_normal((2, 16, 16, 15)).astype(dtype), rng.standard_normal((16, 16, 3, 3)).astype(dtype)
        source = demo.padded_conv2d_source(3, 1, 1).replace("float", "double" if dtype == np.float64 else "float")
        forward = tcpy.define(source, options=tcpy.Options(target=AVX2, specialize="always"))
        backward = tcpy.grad(forward)
        dO = rng.standard_normal(forward(I, W).shape).astype(dtype)
        assert "winograd_taps" in _paths(backward, I, W, dO)
        dI, dW = backward(I, W, dO)
        ti, tw = torch.from_numpy(I).requires_grad_(), torch.from_numpy(W).requires_grad_()
        (torch.nn.functional.conv2d(ti, tw, padding=1) * torch.from_numpy(dO)).sum().backward()
        for got, want in ((dI, ti.grad.numpy()), (dW, tw.grad.numpy())):
            assert got.dtype == dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
