"""Convolutions through the contraction engine: padding by guarded reads, 1x1 convolutions,
and differential tests of random convolutions against the reference evaluator.

The random convolutions draw the layout (NCHW or NHWC), groups (one, several, or depthwise),
kernel sizes 1-7, strides 1-3, dilations 1-2, padding by a guarded product or a guarded image
read (or none), inf and NaN weights, odd and prime image sizes from 1 to 13 x 19 pixels, a
batch of 1-3, float32 or float64, every preset this CPU runs (half of them with tiny caches, so
small images run many blocks and edge slivers) and 1, 2 or 7 threads.
"""
import os
import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.loopir import ContractionNest
from tcpy.target import Target
from test_contraction import EPS, RUNNABLE, recognized, tiny_caches

EXAMPLES = int(os.environ.get("TCPY_CONV_EXAMPLES", "25"))

PADDED = """
def conv(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                      ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}
"""


def _engine(kernel, *args):
    return [n.body[0] for n in kernel.specialize(*args).ir.nests if n.body and isinstance(n.body[0], ContractionNest)]


def test_padded_convolution_packs_zeros_for_the_guard():
    con = recognized(PADDED, (2, 3, 9, 7), (4, 3, 3, 3))
    assert con.b.tensor == "I" and len(con.guards) == 4
    assert [g.vars for g in con.n] == [("n",), ("h",), ("w",)]  # the guard keeps h and w apart
    assert "guarded read of I" in con.describe() and "h + kh - 1 >= 0" in con.describe()
    kernel = tcpy.define(PADDED)
    rng = np.random.default_rng(0)
    I, Wt = rng.standard_normal((2, 3, 9, 7), dtype=np.float32), rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    assert _engine(kernel, I, Wt)
    assert "guarded read of I" in str(kernel.explain(I, Wt))
    want = tcpy.define(PADDED, backend="reference")(I, Wt)
    np.testing.assert_allclose(kernel(I, Wt), want, rtol=1e-5, atol=1e-5)


GUARDED_WEIGHTS = """
def conv(float(N,C,H,W) I, float(F,C,3,3) Wt, float(F) bias) -> (O, Y) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                      ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
    Y(n, f, h, w) = max(O(n, f, h, w) + bias(f), 0.0)
}
"""


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", RUNNABLE)
def test_inf_and_nan_weights_add_nothing_where_the_guard_fails(target, threads):
    """TC adds nothing where a guard fails; packing writes 0 there, and 0 x inf is NaN. With an
    inf and a NaN in the weights (the operand that is not guarded), the padded borders must
    hold what the reference computes (inf, not NaN, where only the padding meets the inf),
    through the engine and its epilogue (a bias and ReLU), and finite weights still take the
    engine."""
    rng = np.random.default_rng(3)
    I = rng.standard_normal((2, 5, 6, 11), dtype=np.float32)
    Wt = rng.standard_normal((16, 5, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(16, dtype=np.float32)
    kernel = tcpy.define(GUARDED_WEIGHTS, options=tcpy.Options(target=target, num_threads=threads))
    reference = tcpy.define(GUARDED_WEIGHTS, backend="reference")
    assert _engine(kernel, I, Wt, bias)
    for f, at, value in ((3, (2, 0, 0), np.inf), (7, (4, 2, 1), np.nan), (11, (0, 1, 2), -np.inf)):
        Wt[(f,) + at] = value
        got, want = kernel(I, Wt, bias), reference(I, Wt, bias)
        assert np.isfinite(want[0][:, 3]).sum() < want[0][:, 3].size  # the inf reaches the interior
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)  # inf and NaN exactly where the reference has them
    Wt = np.nan_to_num(Wt, posinf=0.5, neginf=-0.5, nan=0.25)
    for g, r in zip(kernel(I, Wt, bias), reference(I, Wt, bias)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


PADDED_PRODUCT = """
def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                      ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0
        where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
}
"""
PADDED_IMAGE = PADDED_PRODUCT.replace("? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0",
                                      "? I(n, c, h + kh - 1, w + kw - 1) : 0.0) * Wt(f, c, kh, kw)").replace(
                                      "+=! (h", "+=! ((h")


@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("size", [3, 5, 8, 16])
@pytest.mark.parametrize("form", ["product", "image"])
def test_the_expression_decides_what_the_padding_adds_at_every_image_size(form, size, threads):
    """``g ? I * W : 0`` adds nothing where ``g`` fails; ``(g ? I : 0) * W`` adds 0 x W there,
    NaN for an inf weight. The engine packed zeros for both and scanned the weights only when
    the image had at least 64 output pixels: a 5x5 image gave a NaN row for the first form, and
    the second form's NaN vanished from 8x8 up."""
    source = PADDED_PRODUCT if form == "product" else PADDED_IMAGE
    I = np.full((1, 3, size, size), 2, np.float32)
    Wt = np.ones((4, 3, 3, 3), np.float32)
    Wt[0, 0, 2, 1] = np.inf  # the bottom tap: only the last row's padding meets it
    kernel = tcpy.define(source, options=tcpy.Options(num_threads=threads))
    assert _engine(kernel, I, Wt)
    got, want = kernel(I, Wt), tcpy.define(source, backend="reference")(I, Wt)
    np.testing.assert_array_equal(got, want)
    last = got[0, 0, size - 1]
    if form == "product":
        assert (last == 24 + 12 * (np.arange(size) % (size - 1) != 0)).all()  # 3 channels x 2 x (2 or 3) taps x 2 rows
    else:
        assert np.isnan(last).all()
    assert np.isinf(got[0, 0, :size - 1, :]).all()


def test_guards_that_always_hold_are_dropped():
    con = recognized("def f(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {"
                     " O(n, f, h, w) +=! (h + kh >= 0 && w + kw < W + 5) ? I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)"
                     " : 0.0 where h in 0:H-2, w in 0:W-2, kh in 0:3, kw in 0:3 }", (1, 2, 6, 6), (3, 2, 3, 3))
    assert con.guards == ()


def test_a_guarded_factor_is_a_guarded_contraction():
    con = recognized("def f(float(N,C,H) I, float(F,C,3) Wt) -> (O) {"
                     " O(n, f, h) +=! Wt(f, c, k) * (h + k >= 1 && h + k <= H ? I(n, c, h + k - 1) : 0.0)"
                     " where h in 0:H, k in 0:3 }", (1, 2, 6), (3, 2, 3))
    assert con is not None and con.b.tensor == "I" and len(con.guards) == 2


@pytest.mark.parametrize("cond", ["h + k >= 1 || h + k <= H", "f + h >= 2", "c * c >= 1", "!(h + k >= 1)"])
def test_other_guards_keep_the_loop_path(cond):
    """A disjunction, a guard on variables of both operands, a non-affine one: not the engine."""
    assert recognized("def f(float(N,C,H) I, float(F,C,3) Wt) -> (O) {"
                      f" O(n, f, h) +=! ({cond}) ? I(n, c, h + k - 1) * Wt(f, c, k) : 0.0"
                      " where h in 1:H-1, k in 0:3 }", (1, 2, 6), (3, 2, 3)) is None


def _after_nan(rng, shape, dtype):
    """A C-contiguous array of ``shape`` whose memory is preceded and followed by NaN (a view
    into a larger buffer, so the launcher passes it as it is): a read out of its bounds shows."""
    size = int(np.prod(shape))
    buffer = np.full(size + 64, np.nan, dtype)
    buffer[32:32 + size] = rng.standard_normal(size)
    return buffer[32:32 + size].reshape(shape)


ONE_ROW_WINDOW = """
def dw({t}(N,C,H,W) I, {t}(C,KH,KW) Wt) -> (O) {{
 O(n, c, y, x) +=! (2*y + a - 1 >= 0 && 2*y + a - 1 < H && 2*x + b >= 0 && 2*x + b < W) ?
     I(n, c, 2*y + a - 1, 2*x + b) * Wt(c, a, b) : 0.0 where y in 0:1, x in 0:1, a in 0:3, b in 0:7
}}
"""


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("depthwise", [True, False])
def test_the_guard_stays_on_the_operand_it_protects(dtype, depthwise):
    """One output row: the padding guard's variables (the window's) index both operands, and
    the weights are always in bounds while the image is not (its row above is padding): the
    image must be the guarded operand, read only where the guard holds (it was read at offset
    -W, before the array, and NaN there gave a NaN output)."""
    src = ONE_ROW_WINDOW.format(t=dtype)
    if not depthwise:
        src = (src.replace("(C,KH,KW) Wt", "(F,C,KH,KW) Wt").replace("Wt(c, a, b)", "Wt(f, c, a, b)")
               .replace("O(n, c, y, x)", "O(n, f, y, x)"))
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(1)
    I = _after_nan(rng, (1, 2, 1, 8), np_type)
    Wt = rng.standard_normal((2, 3, 7) if depthwise else (3, 2, 3, 7)).astype(np_type)
    con = recognized(src, I.shape, Wt.shape)
    assert con is None or getattr(con, con.guarded).tensor == "I"
    want = tcpy.define(src, backend="reference")(I, Wt)
    assert np.isfinite(want).all()
    for target in RUNNABLE:
        got = tcpy.define(src, options=tcpy.Options(target=target))(I, Wt)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_depthwise_convolutions_take_the_direct_path():
    src = ("def dw(float(N,C,H,W) I, float(C,3,3) Wt) -> (O) {"
           " O(n, c, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)"
           " ? I(n, c, h + kh - 1, w + kw - 1) * Wt(c, kh, kw) : 0.0 where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3 }")
    rng = np.random.default_rng(2)
    for threads, shape in ((1, (2, 5, 9, 23)), (2, (1, 3, 1, 40)), (7, (3, 4, 6, 2))):
        kernel = tcpy.define(src, options=tcpy.Options(num_threads=threads))
        I, Wt = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal((shape[1], 3, 3), dtype=np.float32)
        (node,) = _engine(kernel, I, Wt)
        assert node.plan.path == "direct" and "direct path" in str(kernel.explain(I, Wt))
        want = tcpy.define(src, backend="reference")(I, Wt)
        np.testing.assert_allclose(kernel(I, Wt), want, rtol=1e-5, atol=1e-5)


DEPTHWISE_GUARDED = """
def dw(float(N,C,H,W) I, float(C,3,3) Wt) -> (O) {{
    O(n, c, h, w) +=! ({cond}) ? I(n, c, h + kh - 1, w + kw - 1) * Wt(c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}}
"""


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", RUNNABLE)
def test_direct_path_reads_a_zero_padded_copy_when_the_guards_bound_the_indices(target, threads):
    """Guards that are exactly the image's bounds: each channel is copied with zeros around it
    and read with no guards; a channel whose taps hold inf or NaN keeps the guarded reads (a
    padded tap adds nothing there, where 0 x inf would be NaN). Guards that cut deeper into the
    image (not the bounds of an index) keep the guarded reads everywhere."""
    rng = np.random.default_rng(5)
    I = rng.standard_normal((2, 4, 7, 19), dtype=np.float32)
    Wt = rng.standard_normal((4, 3, 3), dtype=np.float32)
    Wt[1, 0, 0], Wt[2, 2, 1] = np.inf, np.nan
    bounds = "h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W"
    deeper = "h + kh >= 2 && h + kh <= H && w + kw >= 2 && w + kw <= W"
    for cond, padded in ((bounds, True), (deeper, False)):
        src = DEPTHWISE_GUARDED.format(cond=cond)
        kernel = tcpy.define(src, options=tcpy.Options(target=target, num_threads=threads))
        (node,) = _engine(kernel, I, Wt)
        assert node.plan.path == "direct" and node.plan.padded_copy is padded
        assert ("copied with zeros around it" in str(kernel.explain(I, Wt))) is padded
        want = tcpy.define(src, backend="reference")(I, Wt)
        got = kernel(I, Wt)
        assert np.isfinite(want[:, 0]).all() and not np.isfinite(want[:, 1:3]).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # NaN and inf where the reference has them


def _draw_window(draw, h: int, w: int, kw_max: int):
    """A window over an h x w image (size, stride 1-2, dilation 1-2, padding): ``(kh, kw, ho,
    wo, y, x)`` with the output extent and the input row and column of output ``y, x`` at tap
    ``a, b`` (TC expressions), or None when the output is empty."""
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, kw_max))
    stride, dil = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, kh - 1)), draw(st.integers(0, (kw - 1) * dil))
    ho, wo = (h + 2 * ph - dil * (kh - 1) - 1) // stride + 1, (w + 2 * pw - dil * (kw - 1) - 1) // stride + 1
    if ho < 1 or wo < 1:
        return None
    return kh, kw, ho, wo, f"{stride}*y + {dil}*a - {ph}", f"{stride}*x + {dil}*b - {pw}"


def _draw_run(draw):
    """(accumulate into a bias first, threads, target preset)."""
    return draw(st.booleans()), draw(st.sampled_from([1, 2, 7])), draw(st.sampled_from(RUNNABLE))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_direct_path_windows_match_the_reference(data):
    """The direct path's runs: every width around the vector steps (short runs, steps of four,
    two and one vectors, overlapping last steps, scalar leftovers), windows 1-7 with stride and
    dilation, padding that switches whole taps off (the first and last rows) or clamps them (the
    row ends), overwriting and accumulating (``+=`` after a bias) forms, float and double, 1, 2
    and 7 threads."""
    draw = data.draw
    dtype = draw(st.sampled_from(["float", "double"]))
    n, c, h = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    w = draw(st.sampled_from([1, 3, 7, 8, 9, 15, 16, 17, 23, 31, 33, 40, 47, 65, 71, 100]))
    window = _draw_window(draw, h, w, 7)
    if window is None:
        return
    kh, kw, ho, wo, y, x = window
    accumulate, threads, target = _draw_run(draw)
    conv = (f"({y} >= 0 && {y} < H && {x} >= 0 && {x} < W) ? I(n, c, {y}, {x}) * Wt(c, a, b) : 0.0"
            f" where y in 0:{ho}, x in 0:{wo}, a in 0:{kh}, b in 0:{kw}")
    if accumulate:
        body = f"O(n, c, y, x) = bias(c) where n in 0:N, y in 0:{ho}, x in 0:{wo}\n O(n, c, y, x) += {conv}"
    else:
        body = f"O(n, c, y, x) +=! {conv}"
    src = f"def dw({dtype}(N,C,H,W) I, {dtype}(C,KH,KW) Wt, {dtype}(C) bias) -> (O) {{\n {body}\n}}"
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    args = (rng.standard_normal((n, c, h, w)).astype(np_type), rng.standard_normal((c, kh, kw)).astype(np_type),
            rng.standard_normal(c).astype(np_type))
    kernel = tcpy.define(src, options=tcpy.Options(num_threads=threads, target=target))
    want = tcpy.define(src, backend="reference")(*args)
    got = kernel(*args)
    assert got.dtype == want.dtype and got.shape == want.shape == (n, c, ho, wo)
    tol = 8 * kh * kw * EPS[dtype]  # the direct path sums the taps in another order
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_channels_last_depthwise_windows_match_the_reference(data):
    """Depthwise windows in NHWC take the batch-lanes path (lanes over the channels): channel
    counts around the vector steps (four vectors, one, scalar leftovers), windows 1-5 with
    stride, dilation and padding (guards that switch taps off per pixel), overwriting and
    accumulating forms, a batch made of two groups (channels split in groups of channels),
    float and double, 1, 2 and 7 threads, every runnable preset."""
    draw = data.draw
    dtype = draw(st.sampled_from(["float", "double"]))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 9))
    c = draw(st.sampled_from([1, 3, 4, 8, 13, 31, 32, 33, 67]))
    groups = draw(st.sampled_from([1, 2]))
    window = _draw_window(draw, h, w, 5)
    if window is None:
        return
    kh, kw, ho, wo, y, x = window
    accumulate, threads, target = _draw_run(draw)
    chans, lhs = ("g, c", "n, y, x, g, c") if groups == 2 else ("c", "n, y, x, c")
    conv = (f"({y} >= 0 && {y} < H && {x} >= 0 && {x} < W) ? I(n, {y}, {x}, {chans}) * Wt(a, b, {chans}) : 0.0"
            f" where y in 0:{ho}, x in 0:{wo}, a in 0:{kh}, b in 0:{kw}")
    shape = "G,C" if groups == 2 else "C"
    if accumulate:
        body = f"O({lhs}) = bias({chans}) where n in 0:N, y in 0:{ho}, x in 0:{wo}\n O({lhs}) += {conv}"
    else:
        body = f"O({lhs}) +=! {conv}"
    src = (f"def dw({dtype}(N,H,W,{shape}) I, {dtype}(KH,KW,{shape}) Wt, {dtype}({shape}) bias) -> (O) {{\n"
           f" {body}\n}}")
    np_type = np.float32 if dtype == "float" else np.float64
    chan_shape = (groups, c) if groups == 2 else (c,)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    args = (rng.standard_normal((n, h, w) + chan_shape).astype(np_type),
            rng.standard_normal((kh, kw) + chan_shape).astype(np_type), rng.standard_normal(chan_shape).astype(np_type))
    kernel = tcpy.define(src, options=tcpy.Options(num_threads=threads, target=target))
    if c * groups > 1 and n * ho * wo > 1 and kh * kw > 1:  # (a role of extent 1 is no role)
        assert [node.plan.path for node in _engine(kernel, *args)] == ["batch_lanes"]
    want = tcpy.define(src, backend="reference")(*args)
    got = kernel(*args)
    assert got.dtype == want.dtype and got.shape == want.shape == (n, ho, wo) + chan_shape
    tol = 8 * kh * kw * EPS[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_direct_path_row_blocks_match_the_reference(data):
    """The specialised direct path computing whole rows several at a time: windows 1-3 x 1-3
    padded by guards at the image's bounds (read from the zero-padded copy) or unpadded (no
    guards), rows around the vector steps (one step, steps of one to four vectors with an
    overlapping last one), image heights below, at and beyond a row block (leftover rows run one
    at a time), 1-2 images, a fused ReLU epilogue or none, float and double, 1, 2 and 7 threads,
    every runnable preset, half of them with an L3 so small that the row blocks are stored
    non-temporally (blocks that start and end inside a vector)."""
    draw = data.draw
    dtype = draw(st.sampled_from(["float", "double"]))
    n, c, h = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 19))
    w = draw(st.sampled_from([4, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 56, 63, 65]))
    kh, kw, padded = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.booleans())
    relu, threads, target = draw(st.booleans()), draw(st.sampled_from([1, 2, 7])), draw(st.sampled_from(RUNNABLE))
    if draw(st.booleans()):
        target = small_l3(Target.preset(target))
    ph, pw = (kh // 2, kw // 2) if padded else (0, 0)
    ho, wo = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    if ho < 1 or wo < 1:
        return
    y, x = f"y + a - {ph}", f"x + b - {pw}"
    read = f"I(n, c, {y}, {x}) * Wt(c, a, b)"
    if padded:
        read = f"({y} >= 0 && {y} < H && {x} >= 0 && {x} < W) ? {read} : 0.0"
    body = f"O(n, c, y, x) +=! {read} where y in 0:{ho}, x in 0:{wo}, a in 0:{kh}, b in 0:{kw}"
    if relu:
        body += "\n Y(n, c, y, x) = max(O(n, c, y, x), 0.0)"
    src = f"def dw({dtype}(N,C,H,W) I, {dtype}(C,KH,KW) Wt) -> ({'O, Y' if relu else 'O'}) {{\n {body}\n}}"
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    args = (rng.standard_normal((n, c, h, w)).astype(np_type), rng.standard_normal((c, kh, kw)).astype(np_type))
    kernel = tcpy.define(src, options=tcpy.Options(num_threads=threads, target=target, specialize="always"))
    want = tcpy.define(src, backend="reference")(*args)
    got = kernel(*args)
    for g, r in zip(got if relu else (got,), want if relu else (want,)):
        assert g.dtype == r.dtype and g.shape == r.shape == (n, c, ho, wo)
        tol = 8 * kh * kw * EPS[dtype]  # the direct path sums the taps in another order
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)


def small_l3(target: Target) -> Target:
    """The same ISA with an L3 so small that a few KiB of output count as beyond it."""
    return dataclasses.replace(target, name=target.name + "-small-l3", l3=4096, l3_sharing=1)


@pytest.mark.parametrize("padded", [True, False])
def test_direct_path_computes_whole_rows_several_at_a_time(padded):
    """A depthwise 3x3 on rows of 56 at one thread (a cell holds whole channels: padding read
    from the zero-padded copy): the direct path plans row blocks that fill the registers the
    taps leave (x86-64-v3: 16 registers of 8 floats, one vector per step, 7 vectors a row:
    fewer than 2 or 4 per step would compute) and says so; the result is the reference's."""
    src = DEPTHWISE_GUARDED.format(cond="h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W")
    if not padded:
        src = ("def dw(float(N,C,H,W) I, float(C,3,3) Wt) -> (O) {"
               " O(n, c, h, w) +=! I(n, c, h + kh, w + kw) * Wt(c, kh, kw) where h in 0:H-2, w in 0:W-2, kh in 0:3, kw in 0:3 }")
    rng = np.random.default_rng(6)
    I, Wt = rng.standard_normal((2, 3, 20, 56 + 2 * (not padded)), dtype=np.float32), rng.standard_normal((3, 3, 3), dtype=np.float32)
    kernel = tcpy.define(src, options=tcpy.Options(target="x86-64-v3", specialize="always", num_threads=1))
    (node,) = _engine(kernel, I, Wt)
    assert node.plan.path == "direct" and node.plan.padded_copy is padded
    assert (node.plan.rows, node.plan.row_vectors) == (5, 1)
    assert "whole rows 5 at a time in steps of 1 vectors" in str(kernel.explain(I, Wt))
    assert not node.plan.stream_stores  # (the output, 26 KiB, fits L3)
    streaming = tcpy.define(src, options=tcpy.Options(target=small_l3(Target.preset("x86-64-v3")),
                                                      specialize="always", num_threads=1))
    (node,) = _engine(streaming, I, Wt)
    assert node.plan.rows == 5 and node.plan.stream_stores
    assert "non-temporal stores: each row block (1120 bytes, contiguous)" in str(streaming.explain(I, Wt))
    if Target.preset("x86-64-v3").can_run_here():
        want = tcpy.define(src, backend="reference")(I, Wt)
        np.testing.assert_allclose(kernel(I, Wt), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(streaming(I, Wt), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("dtype, threads", [("float", 1), ("double", 2), ("float", 7)])
def test_rows_shorter_than_a_vector_are_summed_in_one(target, dtype, threads):
    """Padded depthwise 3x3 images 2-7 and 14 pixels wide: a row shorter than a vector is summed
    in one vector over the zero-padded copy (its last lanes read past the row, and past the
    copy's end on the last row) and only the row's outputs are stored."""
    src = DEPTHWISE_GUARDED.format(cond="h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W")
    if dtype == "double":
        src = src.replace("float(", "double(")
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(7)
    lanes = Target.preset(target).lanes(np.dtype(np_type).itemsize) if target != "host" else None
    for w in (2, 3, 5, 7, 14):
        I = rng.standard_normal((2, 4, 11, w)).astype(np_type)
        Wt = rng.standard_normal((4, 3, 3)).astype(np_type)
        kernel = tcpy.define(src, options=tcpy.Options(target=target, num_threads=threads, specialize="always"))
        (node,) = _engine(kernel, I, Wt)
        if lanes is not None and w < lanes and node.plan.padded_copy:
            assert node.plan.rows > 1 and "a row shorter than a vector" in str(kernel.explain(I, Wt))
        want = tcpy.define(src, backend="reference")(I, Wt)
        got = kernel(I, Wt)
        assert got.dtype == want.dtype and got.shape == want.shape
        tol = 8 * 9 * EPS[dtype]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_channels_last_depthwise_convolutions_vectorise_over_the_channels():
    src = ("def dw(float(N,H,W,C) I, float(3,3,C) Wt) -> (O) {"
           " O(n, h, w, c) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)"
           " ? I(n, h + kh - 1, w + kw - 1, c) * Wt(kh, kw, c) : 0.0 where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3 }")
    rng = np.random.default_rng(4)
    I, Wt = rng.standard_normal((2, 7, 9, 37), dtype=np.float32), rng.standard_normal((3, 3, 37), dtype=np.float32)
    kernel = tcpy.define(src)
    (node,) = _engine(kernel, I, Wt)
    assert node.plan.path == "batch_lanes" and "batch-lanes path" in str(kernel.explain(I, Wt))
    np.testing.assert_allclose(kernel(I, Wt), tcpy.define(src, backend="reference")(I, Wt), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_few_output_pixels_read_the_weights_in_place(threads):
    """7x7 outputs with many channels: N = 49 is too narrow for packing the weights per block to
    pay, and their K = (c, kh, kw) is one run in memory (though three groups in the input): the
    stream path reads them in place (or the direct convolution rearranges them once per call and
    reads the image in place)."""
    rng = np.random.default_rng(4)
    I = rng.standard_normal((1, 40, 7, 7), dtype=np.float32)
    Wt = rng.standard_normal((64, 40, 3, 3), dtype=np.float32)
    kernel = tcpy.define(PADDED, options=tcpy.Options(num_threads=threads))
    (node,) = _engine(kernel, I, Wt)
    assert node.plan.path in ("stream", "direct_conv") and len(node.contraction.k) > 1
    want = tcpy.define(PADDED, backend="reference")(I, Wt)
    np.testing.assert_allclose(kernel(I, Wt), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("window, pad", [(7, 3), (3, 1), (1, 0)])
def test_stride_two_rows_longer_than_a_sliver(dtype, window, pad, target):
    """Stride-2 rows of 40 outputs: whole slivers of every other input element are packed by
    vector loads and shuffles (the last load must stop at the row's last element read)."""
    src = f"""def conv({dtype}(N,C,H,W) I, {dtype}(F,C,{window},{window}) Wt) -> (O) {{
        O(n, f, h, w) +=! (2*h + kh >= {pad} && 2*h + kh < H + {pad} && 2*w + kw >= {pad} && 2*w + kw < W + {pad})
                          ? I(n, c, 2*h + kh - {pad}, 2*w + kw - {pad}) * Wt(f, c, kh, kw) : 0.0
            where h in 0:(H + {2 * pad - window}) / 2 + 1, w in 0:(W + {2 * pad - window}) / 2 + 1,
                  kh in 0:{window}, kw in 0:{window}
    }}"""
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(window)
    I = rng.standard_normal((2, 3, 9, 80)).astype(np_type)
    Wt = rng.standard_normal((5, 3, window, window)).astype(np_type)
    want = tcpy.define(src, backend="reference")(I, Wt)
    got = tcpy.define(src, options=tcpy.Options(target=target))(I, Wt)
    assert got.shape == want.shape and got.shape[-1] == 40
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("dtype, window, threads", [("float", 1, 1), ("double", 1, 2), ("float", 7, 2)])
def test_stride_two_slivers_across_rows_shorter_than_a_sliver(dtype, window, threads, target):
    """Unpadded stride-2 convolutions (ResNet's 1x1 downsampling, the 7x7 stem) with output
    rows of 21 pixels on the packed path: a sliver spans several rows, copied row part by row
    part by vector loads and shuffles (parts longer and shorter than a vector; tiny caches put
    the panels at columns that start inside a row)."""
    src = f"""def conv({dtype}(N,C,H,W) I, {dtype}(F,C,{window},{window}) Wt) -> (O) {{
        O(n, f, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(f, c, kh, kw)
            where h in 0:(H - {window}) / 2 + 1, w in 0:(W - {window}) / 2 + 1, kh in 0:{window}, kw in 0:{window}
    }}"""
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(window)
    I = rng.standard_normal((2, 3, 19 + window, 41 + window)).astype(np_type)
    Wt = rng.standard_normal((5, 3, window, window)).astype(np_type)
    want = tcpy.define(src, backend="reference")(I, Wt)
    for t in (Target.preset(target), tiny_caches(Target.preset(target))):
        kernel = tcpy.define(src, options=tcpy.Options(target=t, num_threads=threads, plan={"path": "packed"}))
        assert [node.plan.path for node in _engine(kernel, I, Wt)] == ["packed"]
        got = kernel(I, Wt)
        assert got.shape == want.shape == (2, 5, 10, 21) and got.dtype == np_type
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("stride", [1, 2])
def test_padded_rows_of_every_length_around_a_vector(dtype, target, threads, stride):
    """Padded 3x3 output rows shorter than a vector (a masked copy), of whole vectors, and a
    few elements past them (the last vector overlaps the one before) within slivers of many
    rows; at stride 2 the vectors hold every other input element."""
    t = Target.preset(target)
    lanes = t.lanes(4 if dtype == "float" else 8)
    src = f"""def conv({dtype}(N,C,H,W) I, {dtype}(F,C,3,3) Wt) -> (O) {{
        O(n, f, h, w) +=! ({stride}*h + kh >= 1 && {stride}*h + kh <= H && {stride}*w + kw >= 1 && {stride}*w + kw <= W)
                          ? I(n, c, {stride}*h + kh - 1, {stride}*w + kw - 1) * Wt(f, c, kh, kw) : 0.0
            where h in 0:(H - 1) / {stride} + 1, w in 0:(W - 1) / {stride} + 1, kh in 0:3, kw in 0:3
    }}"""
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(lanes + threads)
    for width in sorted({max(1, lanes - 3), lanes, lanes + 1, 2 * lanes + 3, 3 * lanes - 1}):
        I = rng.standard_normal((2, 4, 5, stride * width)).astype(np_type)
        Wt = rng.standard_normal((9, 4, 3, 3)).astype(np_type)
        kernel = tcpy.define(src, options=tcpy.Options(target=t, num_threads=threads))
        assert _engine(kernel, I, Wt)
        want = tcpy.define(src, backend="reference")(I, Wt)
        got = kernel(I, Wt)
        assert got.shape == want.shape and got.dtype == np_type
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("window, dilation", [(3, 1), (5, 1), (7, 1), (3, 2), (9, 1)])
def test_slivers_across_image_rows_zero_their_padded_lanes(dtype, target, window, dilation):
    """Stride 1: a sliver of output pixels is contiguous in the input even where it crosses the
    end of an image row, so its rows are copied whole, with the lanes that read the padding
    zeroed (the element loaded there is another pixel's). Images narrower than a vector, around
    it and wider (slivers cross one or several row ends), a batch of two (slivers that cross
    images are not contiguous), the input surrounded by NaN (its first and last rows are read
    with lanes before and after it). Windows of up to 7x7 classify a sliver's rows once per
    window position (the guards repeat along the input channels); 9x9 (81 positions) tests
    each row."""
    t = Target.preset(target)
    pad = dilation * (window // 2)
    src = f"""def conv({dtype}(N,C,H,W) I, {dtype}(F,C,{window},{window}) Wt) -> (O) {{
        O(n, f, h, w) +=! (h + {dilation}*kh >= {pad} && h + {dilation}*kh < H + {pad} &&
                           w + {dilation}*kw >= {pad} && w + {dilation}*kw < W + {pad})
                          ? I(n, c, h + {dilation}*kh - {pad}, w + {dilation}*kw - {pad}) * Wt(f, c, kh, kw) : 0.0
            where h in 0:H, w in 0:W, kh in 0:{window}, kw in 0:{window}
    }}"""
    np_type = np.float32 if dtype == "float" else np.float64
    lanes = t.lanes(np.dtype(np_type).itemsize)
    rng = np.random.default_rng(window + lanes)
    for width in sorted({2, lanes - 1, lanes + 1, 2 * lanes + 3}):
        I = _after_nan(rng, (2, 3, 6, width), np_type)
        Wt = rng.standard_normal((7, 3, window, window)).astype(np_type)
        kernel = tcpy.define(src, options=tcpy.Options(target=t, num_threads=2))
        assert _engine(kernel, I, Wt)
        want = tcpy.define(src, backend="reference")(I, Wt)
        got = kernel(I, Wt)
        assert got.shape == want.shape and got.dtype == np_type and np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 1), (1, 2)])
def test_weight_gradients_gather_the_window_runs_of_interior_rows(dtype, stride, pad):
    """A padded convolution's weight gradient: its N is (c, kh, kw), so a sliver of lanes is
    many runs of kw apart in the input; rows of pixels away from the padding gather them, the
    others copy each run's valid part. Checked against the reference with the input's values
    around it NaN (a gather reads no lane outside the window), on tiny caches too (many K
    blocks and edge slivers)."""
    src = f"""def dw({dtype}(N,F,P,Q) dO, {dtype}(N,C,H,W) I) -> (dWt) {{
        dWt(f, c, kh, kw) +=! ({stride}*h + kh >= {pad} && {stride}*h + kh < H + {pad} &&
                               {stride}*w + kw >= {pad} && {stride}*w + kw < W + {pad})
                              ? dO(n, f, h, w) * I(n, c, {stride}*h + kh - {pad}, {stride}*w + kw - {pad}) : 0
            where h in 0:P, w in 0:Q, kh in 0:3, kw in 0:3
    }}"""
    np_type = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(stride * 10 + pad)
    size = 13
    out = (size + 2 * pad - 3) // stride + 1
    I = _after_nan(rng, (2, 11, size, size), np_type)
    dO = rng.standard_normal((2, 6, out, out)).astype(np_type)
    want = tcpy.define(src, backend="reference")(dO, I)
    for t in (Target.preset("x86-64-v3"), tiny_caches(Target.preset("x86-64-v3"))):
        kernel = tcpy.define(src, options=tcpy.Options(target=t, num_threads=2))
        assert _engine(kernel, dO, I)
        got = kernel(dO, I)
        assert got.shape == want.shape and got.dtype == np_type and np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_1x1_convolutions_are_plain_contractions():
    con = recognized("def f(float(N,C,H,W) I, float(F,C) Wt) -> (O) { O(n, f, h, w) +=! I(n, c, h, w) * Wt(f, c) }",
                     (2, 8, 5, 5), (16, 8))
    assert [g.vars for g in con.n] == [("n",), ("h", "w")] and [g.vars for g in con.k] == [("c",)]
    assert con.guards == ()
    strided = recognized("def f(float(N,C,H,W) I, float(F,C) Wt) -> (O) { O(n, f, h, w) +=! I(n, c, 2*h, 2*w) * "
                         "Wt(f, c) where h in 0:3, w in 0:3 }", (1, 4, 6, 6), (8, 4))
    assert strided.b.stride("w") == 2 and strided.guards == ()


# ----------------------------------------------------------------------------- differential


@dataclass(frozen=True)
class Conv:
    source: str
    args: tuple
    k_len: int
    options: dict
    dtype: str

    def __repr__(self):
        shapes = [a.shape for a in self.args]
        return f"Conv({self.source!r}, shapes={shapes}, options={self.options})"


@st.composite
def convolutions(draw):
    dtype = draw(st.sampled_from(["float", "float", "double"]))
    layout = draw(st.sampled_from(["nchw", "nhwc"]))
    kind = draw(st.sampled_from(["dense", "dense", "grouped", "depthwise"]))
    n = draw(st.sampled_from([1, 1, 2, 3]))
    g = {"dense": 1, "grouped": draw(st.integers(2, 3)), "depthwise": draw(st.sampled_from([1, 3, 8, 17]))}[kind]
    c = 1 if kind == "depthwise" else draw(st.sampled_from([1, 2, 3, 5, 8]))
    f = 1 if kind == "depthwise" else draw(st.sampled_from([1, 3, 7, 16, 17]))
    kh, kw = draw(st.integers(1, 7)), draw(st.sampled_from([1, 3, 5, 7, draw(st.integers(1, 7))]))
    s, d = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    ph, pw = (draw(st.integers(0, k - 1)) if draw(st.booleans()) else 0 for k in (kh, kw))
    h = draw(st.integers(max(1, d * (kh - 1) + 1 - 2 * ph), 13))
    w = draw(st.integers(max(1, d * (kw - 1) + 1 - 2 * pw), 19))
    oh, ow = (h + 2 * ph - d * (kh - 1) - 1) // s + 1, (w + 2 * pw - d * (kw - 1) - 1) // s + 1
    y, x = f"{s}*h + {d}*kh - {ph}", f"{s}*w + {d}*kw - {pw}"
    guard = []
    if ph:
        guard += [f"{s}*h + {d}*kh >= {ph}", f"{s}*h + {d}*kh < H + {ph}"]
    if pw:
        guard += [f"{s}*w + {d}*kw >= {pw}", f"{s}*w + {d}*kw < W + {pw}"]
    # the channel indices of each tensor: (g, c) or g alone (depthwise) or c alone (dense)
    gs = ["g"] if kind != "dense" else []
    cs = ["c"] if kind != "depthwise" else []
    fs = ["f"] if kind != "depthwise" else []
    if layout == "nchw":
        i_idx, i_shape = ["n", *gs, *cs, y, x], [n, *([g] if gs else []), *([c] if cs else []), h, w]
        w_idx = [*gs, *fs, *cs, "kh", "kw"]
        o_idx = ["n", *gs, *fs, "h", "w"]
        sizes = ["N", *(["G"] if gs else []), *(["C"] if cs else []), "H", "W"]
    else:
        i_idx, i_shape = ["n", y, x, *gs, *cs], [n, h, w, *([g] if gs else []), *([c] if cs else [])]
        w_idx = ["kh", "kw", *gs, *cs, *fs]
        o_idx = ["n", "h", "w", *gs, *fs]
        sizes = ["N", "H", "W", *(["G"] if gs else []), *(["C"] if cs else [])]
    extent = {"g": g, "c": c, "f": f, "kh": kh, "kw": kw}
    w_shape = [extent[v] for v in w_idx]
    image, weight = f"I({', '.join(i_idx)})", f"Wt({', '.join(w_idx)})"
    read = f"{image} * {weight}"
    rhs = read
    if guard and draw(st.booleans()):  # the whole product guarded: the padding adds nothing
        rhs = f"({' && '.join(guard)}) ? {read} : 0.0"
    elif guard:  # the image's read guarded: the padding's 0 multiplies the weight (0 x inf is NaN)
        factor = f"(({' && '.join(guard)}) ? {image} : 0.0)"
        rhs = f"{factor} * {weight}" if draw(st.booleans()) else f"{weight} * {factor}"
    w_sizes = ", ".join(f"W{i}" for i in range(len(w_shape)))
    source = (f"def conv({dtype}({', '.join(sizes)}) I, {dtype}({w_sizes}) Wt) -> (O) {{\n"
              f"    O({', '.join(o_idx)}) +=! {rhs}\n"
              f"        where h in 0:{oh}, w in 0:{ow}, kh in 0:{kh}, kw in 0:{kw}\n}}\n")
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    np_dtype = np.float32 if dtype == "float" else np.float64
    args = (rng.uniform(-1, 1, i_shape).astype(np_dtype), rng.uniform(-1, 1, w_shape).astype(np_dtype))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # inf and NaN weights
        args[1].flat[draw(st.integers(0, args[1].size - 1))] = draw(st.sampled_from([np.inf, -np.inf, np.nan]))
    target = draw(st.sampled_from(RUNNABLE))
    options = {"num_threads": draw(st.sampled_from([1, 2, 7])),
               "target": tiny_caches(Target.preset(target)) if draw(st.booleans()) else target}
    return Conv(source, args, c * kh * kw, options, dtype)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=convolutions())
def test_random_convolutions_match_the_reference(case):
    kernel = tcpy.define(case.source, options=tcpy.Options(**case.options))
    assert _engine(kernel, *case.args), kernel.loop_ir(*case.args)
    got = kernel(*case.args)
    want = tcpy.define(case.source, backend="reference")(*case.args)
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = EPS[case.dtype]
    bound = 8 * eps * (case.k_len + 1) * case.k_len
    np.testing.assert_allclose(got, want, rtol=8 * eps * (case.k_len + 1), atol=bound)
