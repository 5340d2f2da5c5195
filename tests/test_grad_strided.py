"""Strided convolutions' input gradients, derived per output phase (one transposed convolution
of stride 1 per residue of the input index modulo the stride): against an exact NumPy scatter,
central finite differences and torch.autograd."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tcpy
from tcpy import demo


def conv_source(k: int, stride: int, pad: int) -> str:
    return demo.padded_conv2d_source(k, stride, pad).replace("float(", "double(")


def scatter_input_gradient(dO, W, stride: int, pad: int, hw) -> np.ndarray:
    """The NCHW input gradient by the definition: each output point adds its window back."""
    n, f, oh, ow = dO.shape
    _, c, kh, kw = W.shape
    padded = np.zeros((n, c, hw[0] + 2 * pad + kh, hw[1] + 2 * pad + kw))
    for a in range(kh):
        for b in range(kw):
            padded[:, :, a:a + stride * oh:stride, b:b + stride * ow:stride] += np.einsum(
                "nfhw,fc->nchw", dO, W[:, :, a, b])
    return padded[:, :, pad:pad + hw[0], pad:pad + hw[1]]


CASES = [(3, 2, 1, (7, 8)), (3, 2, 1, (8, 8)), (1, 2, 0, (8, 7)), (3, 2, 0, (9, 9)),
         (3, 3, 0, (8, 10)), (1, 3, 0, (7, 7)), (3, 3, 1, (9, 8)), (3, 1, 1, (6, 7)), (5, 1, 2, (7, 6))]


@pytest.mark.parametrize("k, stride, pad, hw", CASES)
def test_strided_conv_input_gradient_matches_scatter(k, stride, pad, hw):
    rng = np.random.default_rng(k * 10 + stride)
    I, W = rng.standard_normal((2, 3, *hw)), rng.standard_normal((4, 3, k, k))
    forward = tcpy.define(conv_source(k, stride, pad))
    O = forward(I, W)
    dO = rng.standard_normal(O.shape)
    dI, dW = tcpy.grad(forward, wrt=("I", "Wt"))(I, W, dO)
    assert dI.shape == I.shape and dI.dtype == np.float64
    np.testing.assert_allclose(dI, scatter_input_gradient(dO, W, stride, pad, hw), rtol=1e-10, atol=1e-10)
    padded = np.pad(I, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = O.shape[2:]
    windows = np.stack([np.stack([padded[:, :, a:a + stride * oh:stride, b:b + stride * ow:stride]
                                  for b in range(k)], -1) for a in range(k)], -2)
    np.testing.assert_allclose(dW, np.einsum("nfhw,nchwab->fcab", dO, windows), rtol=1e-10, atol=1e-10)


def test_padded_conv_input_gradient_takes_the_forward_winograd_path():
    """The input gradient's taps run backwards (the weights read reversed), so the transposed
    convolution reads its image through a forward window, as the engine's forms want."""
    rng = np.random.default_rng(7)
    I, W = rng.standard_normal((1, 32, 16, 16)), rng.standard_normal((32, 32, 3, 3))
    forward = tcpy.define(demo.padded_conv2d_source(3, 1, 1), options=tcpy.Options(target="x86-64-v3", specialize="always"))
    backward = tcpy.grad(forward, wrt=("I",))
    dO = rng.standard_normal((1, 32, 16, 16))
    plan = backward.explain(I.shape, W.shape, dO.shape)
    assert "winograd path: Winograd F(2x2, 3x3) over (i2 + kh, i3 + kw)" in plan
    dI = backward(I.astype(np.float32), W.astype(np.float32), dO.astype(np.float32))
    assert dI.shape == I.shape and dI.dtype == np.float32
    expected = scatter_input_gradient(dO, W, 1, 1, (16, 16))
    np.testing.assert_allclose(dI, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def window_weight_gradient(I, dO, k: int, stride: int, pad: int) -> np.ndarray:
    """The weight gradient by the definition: each output point's cotangent times its window."""
    padded = np.pad(I, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = dO.shape[2:]
    windows = np.stack([np.stack([padded[:, :, a:a + stride * oh:stride, b:b + stride * ow:stride]
                                  for b in range(k)], -1) for a in range(k)], -2)
    return np.einsum("nfhw,nchwab->fcab", dO, windows)


@pytest.mark.parametrize("k, stride, pad, hw, f", [(3, 1, 1, (19, 24), 16), (5, 1, 2, (16, 20), 32), (3, 1, 0, (12, 21), 16),
                                                   (3, 2, 1, (20, 37), 16), (3, 2, 1, (17, 33), 32)])
def test_conv_weight_gradient_packs_runs_of_pixels(k, stride, pad, hw, f):
    """The weight gradient's packed image slivers: lanes are (channel, tap) pairs, K the pixels
    along image rows (every other pixel at stride 2); rows away from the padding are copied as
    runs of pixels transposed. (Winograd off: the cost model may give a 3x3 stride-1 gradient
    the taps' path instead.)"""
    rng = np.random.default_rng(k + pad)
    I, W = rng.standard_normal((2, 8, *hw)), rng.standard_normal((f, 8, k, k))
    options = tcpy.Options(target="x86-64-v3", specialize="always", winograd=False)
    forward = tcpy.define(demo.padded_conv2d_source(k, stride, pad), options=options)
    backward = tcpy.grad(forward, wrt=("Wt",))
    dO = rng.standard_normal(forward(I.astype(np.float32), W.astype(np.float32)).shape)
    plan = backward.explain(I.shape, W.shape, dO.shape)
    assert "K n x h x w" in plan or "K h x w" in plan, plan
    assert "packed path" in plan
    dW = backward(I.astype(np.float32), W.astype(np.float32), dO.astype(np.float32))
    assert dW.shape == W.shape and dW.dtype == np.float32
    expected = window_weight_gradient(I, dO, k, stride, pad)
    np.testing.assert_allclose(dW, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())

@pytest.mark.parametrize("k, stride, pad, hw", [(3, 2, 1, (5, 6)), (1, 3, 0, (7, 5))])
def test_strided_conv_gradient_matches_finite_differences(k, stride, pad, hw):
    rng = np.random.default_rng(3)
    I, W = rng.standard_normal((1, 2, *hw)), rng.standard_normal((3, 2, k, k))
    forward = tcpy.define(conv_source(k, stride, pad))
    dO = rng.standard_normal(forward(I, W).shape)
    dI, _ = tcpy.grad(forward, wrt=("I", "Wt"))(I, W, dO)
    eps = 1e-6
    numeric = np.zeros_like(I)
    for point in np.ndindex(*I.shape):
        up, down = I.copy(), I.copy()
        up[point] += eps
        down[point] -= eps
        numeric[point] = np.sum((forward(up, W) - forward(down, W)) * dO) / (2 * eps)
    np.testing.assert_allclose(dI, numeric, rtol=1e-6, atol=1e-7)


NHWC = """
def conv_nhwc(double(N,H,W,C) I, double(KH,KW,C,F) Wt) -> (O) {
    O(n, h, w, f) +=! I(n, 2*h + kh, 3*w + kw, c) * Wt(kh, kw, c, f)
        where h in 0:(H - KH) / 2 + 1, w in 0:(W - KW) / 3 + 1, kh in 0:KH, kw in 0:KW
}
"""


def test_strided_nhwc_conv_gradient_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    I, W = rng.standard_normal((2, 9, 11, 3)), rng.standard_normal((3, 2, 3, 4))
    forward = tcpy.define(NHWC)
    dO = rng.standard_normal(forward(I, W).shape)
    dI, dW = tcpy.grad(forward, wrt=("I", "Wt"))(I, W, dO)
    ti, tw = torch.from_numpy(I).requires_grad_(), torch.from_numpy(W).requires_grad_()
    out = torch.nn.functional.conv2d(ti.permute(0, 3, 1, 2), tw.permute(3, 2, 0, 1), stride=(2, 3))
    out.backward(torch.from_numpy(dO).permute(0, 3, 1, 2))
    np.testing.assert_allclose(dI, ti.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, tw.grad.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k, stride, pad", [(3, 2, 1), (1, 2, 0), (3, 3, 1)])
def test_strided_conv_gradient_matches_torch_float32(k, stride, pad):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    I = rng.standard_normal((2, 5, 11, 10)).astype(np.float32)
    W = rng.standard_normal((6, 5, k, k)).astype(np.float32)
    forward = tcpy.define(demo.padded_conv2d_source(k, stride, pad))
    dO = rng.standard_normal(forward(I, W).shape).astype(np.float32)
    dI, dW = tcpy.grad(forward, wrt=("I", "Wt"))(I, W, dO)
    ti, tw = torch.from_numpy(I).requires_grad_(), torch.from_numpy(W).requires_grad_()
    torch.nn.functional.conv2d(ti, tw, stride=stride, padding=pad).backward(torch.from_numpy(dO))
    assert dI.dtype == np.float32
    np.testing.assert_allclose(dI, ti.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dW, tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_strided_depthwise_conv_gradient_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    I, W = rng.standard_normal((2, 4, 9, 8)), rng.standard_normal((4, 3, 3))
    forward = tcpy.define(demo.padded_conv2d_source(3, 2, 1, depthwise=True).replace("float(", "double("))
    dO = rng.standard_normal(forward(I, W).shape)
    dI, dW = tcpy.grad(forward)(I, W, dO)
    ti, tw = torch.from_numpy(I).requires_grad_(), torch.from_numpy(W).requires_grad_()
    torch.nn.functional.conv2d(ti, tw[:, None], stride=2, padding=1, groups=4).backward(torch.from_numpy(dO))
    np.testing.assert_allclose(dI, ti.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, tw.grad.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("length", [9, 10, 11])
def test_strided_elementwise_read_gradient(length):
    """No taps: one phase receives the cotangent, the others are zero, over every length."""
    src = "def down(double(N,H) I) -> (O) { O(n, h) = I(n, 3*h + 1) * I(n, 3*h + 1) where h in 0:(H - 2) / 3 + 1 }"
    rng = np.random.default_rng(length)
    I = rng.standard_normal((2, length))
    forward = tcpy.define(src)
    out = forward(I)
    dO = rng.standard_normal(out.shape)
    want = np.zeros_like(I)
    want[:, 1:1 + 3 * out.shape[1]:3] = 2 * I[:, 1:1 + 3 * out.shape[1]:3] * dO
    np.testing.assert_array_equal(tcpy.grad(forward)(I, dO), want)


def test_large_strides_keep_the_masked_sum():
    """A 5x5 window moved by 5 would be 25 phases: its gradient stays one masked statement."""
    src = ("def pool(double(N,H,W) I) -> (O) { O(n, h, w) +=! I(n, 5*h + kh, 5*w + kw) "
           "where h in 0:H / 5, w in 0:W / 5, kh in 0:5, kw in 0:5 }")
    forward = tcpy.define(src)
    backward = tcpy.grad(forward)
    assert "_phase" not in backward.source
    I = np.random.default_rng(0).standard_normal((1, 11, 12))
    dO = np.random.default_rng(1).standard_normal(forward(I).shape)
    want = np.zeros_like(I)
    want[:, :10, :10] = np.repeat(np.repeat(dO, 5, 1), 5, 2)
    np.testing.assert_allclose(backward(I, dO), want, rtol=1e-12)


def dilated_conv_source(stride: int, dilation: int, pad: int) -> str:
    """A 3x3 NCHW convolution with stride, dilation and zero padding (a guarded read)."""
    y, x = (f"{stride}*{o} + {dilation}*{t}" + (f" - {pad}" if pad else "") for o, t in (("h", "kh"), ("w", "kw")))
    read = f"I(n, c, {y}, {x}) * Wt(f, c, kh, kw)"
    if pad:
        read = f"({y} >= 0 && {y} < H && {x} >= 0 && {x} < W) ? {read} : 0.0"
    extent = lambda size: f"({size} + {2 * pad - 2 * dilation - 1}) / {stride} + 1"  # noqa: E731
    return (f"def conv(double(N,C,H,W) I, double(F,C,KH,KW) Wt) -> (O) {{ O(n, f, h, w) +=! {read} "
            f"where h in 0:{extent('H')}, w in 0:{extent('W')}, kh in 0:KH, kw in 0:KW }}")


@pytest.mark.parametrize("stride, dilation, pad", [(2, 2, 0), (2, 2, 2), (2, 3, 1), (3, 2, 0), (2, 4, 0)])
def test_dilated_strided_conv_gradient(stride, dilation, pad):
    """Taps ``e*y`` under a stride ``s``: each phase sums the taps that reach it (none when
    gcd(e, s) does not divide its offset: a zero phase, read as 0), checked against the
    reference evaluator of the same backward and against torch.autograd."""
    rng = np.random.default_rng(stride * 10 + dilation)
    I, W = rng.standard_normal((2, 3, 13, 12)), rng.standard_normal((4, 3, 3, 3))
    forward = tcpy.define(dilated_conv_source(stride, dilation, pad))
    dO = rng.standard_normal(forward(I, W).shape)
    backward = tcpy.grad(forward)
    assert "%" not in backward.source.split("dI(")[0]  # (the phases are gathers, not masked sums)
    dI, dW = backward(I, W, dO)
    want_dI, want_dW = tcpy.define(backward.source, backend="reference")(I, W, dO)
    np.testing.assert_allclose(dI, want_dI, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, want_dW, rtol=1e-10, atol=1e-10)
    torch = pytest.importorskip("torch")
    ti, tw = torch.from_numpy(I).requires_grad_(), torch.from_numpy(W).requires_grad_()
    out = torch.nn.functional.conv2d(ti, tw, stride=stride, padding=pad, dilation=dilation)
    assert tuple(out.shape) == dO.shape
    out.backward(torch.from_numpy(dO))
    np.testing.assert_allclose(dI, ti.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, tw.grad.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("specialize", ["always", "never"])
def test_phases_no_tap_reaches_do_not_run(specialize):
    """A 1x1 window moved by 2 reaches one phase of four: at these sizes the other three sum over
    nothing, so the specialised kernel has no statement and no buffer for them and reads zeros;
    the size-generic kernel, which serves every size, runs them."""
    rng = np.random.default_rng(11)
    I, W = rng.standard_normal((2, 3, 8, 7)), rng.standard_normal((4, 3, 1, 1))
    forward = tcpy.define(conv_source(1, 2, 0), options=tcpy.Options(specialize=specialize))
    dO = rng.standard_normal(forward(I, W).shape)
    backward = tcpy.grad(forward, wrt=("I",))
    assert "dI_phase01(" in backward.source
    if specialize == "always":
        schedule = backward.explain(I, W, dO).split("schedule:")[1]
        assert "dI_phase00(" in schedule and "dI_phase01(" not in schedule and "dI_phase11(" not in schedule
    np.testing.assert_allclose(backward(I, W, dO), scatter_input_gradient(dO, W, 2, 0, (8, 7)), rtol=1e-10, atol=1e-10)


def nhwc_source(k: int, stride: int, pad: int) -> str:
    """:func:`conv_source` with the image and output channels-last, the weights (KH, KW, C, F)."""
    return (conv_source(k, stride, pad).replace("double(N,C,H,W) I", "double(N,H,W,C) I")
            .replace("double(F,C,KH,KW) Wt", "double(KH,KW,C,F) Wt").replace("Wt(f, c, kh, kw)", "Wt(kh, kw, c, f)")
            .replace("O(n, f, h, w)", "O(n, h, w, f)").replace("I(n, c, ", "I(n, ").replace(") * Wt", ", c) * Wt"))


def merge_schedules(kernel, *args):
    """The phases of each loop nest of ``kernel``'s specialised program at these arguments."""
    return [nest.schedule.phases for nest in kernel.specialize(*args).ir.nests if nest.schedule is not None]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 3), stride=st.sampled_from([2, 3]), pad=st.integers(0, 1), h=st.integers(3, 8),
       w=st.integers(3, 8), nhwc=st.booleans(), threads=st.sampled_from([1, 2]), seed=st.integers(0, 99))
def test_phase_interleaving_matches_the_reference(k, stride, pad, h, w, nhwc, threads, seed):
    """The statement interleaving a strided read's phases runs split by the residues of the
    image's row and column (each piece a plain copy): the compiled gradient equals the
    reference evaluator's of the same backward, odd and even sizes, padding, NCHW and NHWC."""
    pad = min(pad, k - 1)
    source = nhwc_source(k, stride, pad) if nhwc else conv_source(k, stride, pad)
    rng = np.random.default_rng(seed)
    I = rng.standard_normal((2, h, w, 3) if nhwc else (2, 3, h, w))
    W = rng.standard_normal((k, k, 3, 4) if nhwc else (4, 3, k, k))
    forward = tcpy.define(source, options=tcpy.Options(specialize="always", num_threads=threads))
    dO = rng.standard_normal(forward(I, W).shape)
    backward = tcpy.grad(forward)
    rows, columns = ("i1", "i2") if nhwc else ("i2", "i3")
    assert ((rows, stride), (columns, stride)) in merge_schedules(backward, I, W, dO)
    dI, dW = backward(I, W, dO)
    want_dI, want_dW = tcpy.grad(tcpy.define(source, backend="reference"))(I, W, dO)
    assert dI.shape == I.shape and dI.dtype == np.float64
    np.testing.assert_allclose(dI, want_dI, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, want_dW, rtol=1e-10, atol=1e-10)
