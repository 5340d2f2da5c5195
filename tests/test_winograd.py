"""Winograd F(2x2, 3x3) convolutions (tcpy.transform.winograd): which convolutions take the
path, and differential tests against the reference evaluator with the path forced on small
random convolutions (layouts, groups, padding by guards, odd sizes, +=, scales, float and
double, every preset this CPU runs, tiny caches, 1, 2 and 7 threads), special values, the
fused epilogue and the rounding error against exact sums."""
import dataclasses
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
import tcpy.target
from tcpy.runtime.build import build_library
from tcpy.target import DEFAULT_COST_MODEL, PRESETS, Target
from test_contraction import EPS, RUNNABLE, tiny_caches
from test_conv import GUARDED_WEIGHTS, PADDED, _engine

# the path as F(2x2, 3x3) on any gain, any ISA
ALWAYS_WINOGRAD = dataclasses.replace(DEFAULT_COST_MODEL, winograd_gain_min=0.0, winograd_f4_gain_min=float("inf"))

EXAMPLES = int(os.environ.get("TCPY_CONV_EXAMPLES", "25"))
AVX2 = "x86-64-v3"  # the planning tests' target (which layers gain depends on the vector width)


def _paths(kernel, *args) -> list[str]:
    return [nest.plan.path for nest in _engine(kernel, *args)]


def _conv_source(stride=1, dilation=1, window=3, pad=1):
    y, x = f"{stride}*h + {dilation}*kh - {pad}", f"{stride}*w + {dilation}*kw - {pad}"
    return f"""
def conv(float(N,C,H,W) I, float(F,C,{window},{window}) Wt) -> (O) {{
    O(n, f, h, w) +=! ({y} >= 0 && {y} < H && {x} >= 0 && {x} < W) ? I(n, c, {y}, {x}) * Wt(f, c, kh, kw) : 0.0
        where h in 0:(H + {2 * pad} - {dilation * (window - 1) + 1}) / {stride} + 1,
              w in 0:(W + {2 * pad} - {dilation * (window - 1) + 1}) / {stride} + 1,
              kh in 0:{window}, kw in 0:{window}
}}
"""


def _zeros(n, c, f, hw, window=3):
    return np.zeros((n, c, hw, hw), np.float32), np.zeros((f, c, window, window), np.float32)


@pytest.mark.parametrize("n, c, hw", [(1, 64, 56), (1, 128, 28), (8, 256, 14), (8, 512, 7), (8, 64, 56)])
def test_3x3_stride_1_layers_with_enough_work_take_the_winograd_path(n, c, hw):
    kernel = tcpy.define(_conv_source(), options=tcpy.Options(num_threads=2, target=AVX2))
    args = _zeros(n, c, c, hw)
    assert _paths(kernel, *args) == ["winograd"]
    text = str(kernel.explain(*args))
    assert re.search(r"Winograd F\((2x2|4x4), 3x3\) over \(h \+ kh, w \+ kw\)", text) and "why: winograd path" in text


@pytest.mark.parametrize("source, shapes", [
    (_conv_source(stride=2), _zeros(8, 128, 128, 56)),  # stride 2
    (_conv_source(dilation=2, pad=2), _zeros(1, 64, 64, 56)),  # dilation 2
    (_conv_source(window=5, pad=2), _zeros(1, 64, 64, 56, 5)),  # a 5x5 window
    (_conv_source(), _zeros(1, 512, 512, 7)),  # 16 tiles: the weights' transform would dominate
    (_conv_source(), _zeros(1, 3, 64, 56)),  # three input channels
])
def test_other_convolutions_keep_the_gemm(source, shapes):
    """(or the direct convolution: a dilated or 5x5 window reads its image in place)"""
    kernel = tcpy.define(source, options=tcpy.Options(target=AVX2))
    assert _paths(kernel, *shapes) in (["packed"], ["small"], ["stream"], ["direct_conv"])


def test_the_gemm_s_window_gather_counts_against_it():
    """On AVX-512, the 14x14 ResNet layer at N=1 on one thread: padded by guards, the implicit
    GEMM would gather each window into packed B; unpadded, it packs rows as they are, so
    Winograd's estimated gain is smaller (both ran faster as Winograd on AMD Zen 5: 1.25-1.36x
    padded, 1.19-1.25x unpadded)."""
    options = tcpy.Options(num_threads=1, target="x86-64-v4")
    unpadded = ("def conv(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {\n"
                "    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)\n}")
    gains = []
    for source in (_conv_source(), unpadded):
        kernel = tcpy.define(source, options=options)
        assert _paths(kernel, *_zeros(1, 256, 256, 14)) == ["winograd"]
        gains.append(float(re.search(r"estimated ([0-9.]+)x less time", str(kernel.explain(*_zeros(1, 256, 256, 14))))[1]))
    assert gains[0] > gains[1] > 1.0


def test_a_small_image_s_tiles_are_split_over_the_threads():
    """On AVX-512, the 14x14 ResNet layer at N=1 has 49 tiles: one 6x64 sliver on one thread;
    two threads take 8x32 micro-tiles so that each gets a sliver (no thread idles)."""
    plans = {t: _engine(tcpy.define(_conv_source(), options=tcpy.Options(num_threads=t, target="x86-64-v4")),
                        *_zeros(1, 256, 256, 14))[0].plan for t in (1, 2)}
    assert [(p.path, p.mr, p.nr, p.grid) for p in plans.values()] == [
        ("winograd", 6, 64, (1, 1, 1, 1)), ("winograd", 8, 32, (1, 1, 2, 1))]


@pytest.mark.parametrize("threads", [2, 7])
@pytest.mark.parametrize("target", RUNNABLE)
def test_narrower_tiles_for_the_threads_match_the_reference(target, threads):
    """A 1-image convolution with fewer tiles than one wide sliver, padded by guards, +=! and
    a fused bias: every thread count's micro-tile gives the reference's sums."""
    rng = np.random.default_rng(3)
    I = rng.standard_normal((1, 24, 13, 13), dtype=np.float32)  # 49 tiles
    Wt = rng.standard_normal((40, 24, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(40, dtype=np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)
        kernel = tcpy.define(GUARDED_WEIGHTS, options=tcpy.Options(target=target, num_threads=threads))
        assert _paths(kernel, I, Wt, bias) == ["winograd"]
        got = kernel(I, Wt, bias)
    want = tcpy.define(GUARDED_WEIGHTS, backend="reference")(I, Wt, bias)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * 24 * 9)


def test_the_option_turns_the_path_off():
    args = _zeros(1, 64, 64, 56)
    assert _paths(tcpy.define(_conv_source(), options=tcpy.Options(target=AVX2)), *args) == ["winograd"]
    off = tcpy.Options(target=AVX2, winograd=False)
    assert _paths(tcpy.define(_conv_source(), options=off), *args) in (["packed"], ["direct_conv"])
    with pytest.raises(tcpy.TCOptionError, match="Options.winograd must be True or False, got 'no'"):
        tcpy.Options(winograd="no")


def test_block_buffers_do_not_grow_with_the_batch():
    """The transformed input and products are per block of tiles: N = 8 plans the blocks of N = 1."""
    kernel = tcpy.define(_conv_source(), options=tcpy.Options(target=AVX2))
    plans = [_engine(kernel, *_zeros(n, 64, 64, 56))[0].plan for n in (1, 8)]
    assert [p.path for p in plans] == ["winograd"] * 2 and plans[0].nc == plans[1].nc and plans[0].mc == plans[1].mc


@pytest.mark.parametrize("threads", [2, 8, 32, 128])
def test_threads_split_the_tile_slivers(threads):
    """Every thread gets a run of slivers (no idle threads while slivers are left)."""
    kernel = tcpy.define(_conv_source(), options=tcpy.Options(num_threads=threads, target=AVX2))
    plan = _engine(kernel, *_zeros(8, 64, 64, 56))[0].plan
    slivers = -(-8 * 28 * 28 // plan.nr)
    assert plan.path == "winograd" and plan.grid == (1, 1, min(threads, slivers), 1)
    assert plan.nc <= -(-slivers // plan.grid[2]) * plan.nr


@pytest.mark.parametrize("n, c, hw, threads", [(1, 64, 56, 256), (1, 128, 28, 64), (8, 512, 7, 16)])
def test_few_slivers_for_many_threads_keep_the_gemm(n, c, hw, threads):
    """49, 13 and 8 slivers of tiles cannot keep 256, 64 or 16 threads busy; the GEMM's micro-tiles
    (or the direct convolution's rows) can. (49 slivers on 128 threads, 13 on 32, are estimated
    to beat the GEMM, whose cells each gather their B panel's windows.)"""
    for count, paths in ((2, ["winograd"]), (threads, ["packed", "direct_conv"])):
        kernel = tcpy.define(_conv_source(), options=tcpy.Options(num_threads=count, target=AVX2))
        assert _paths(kernel, *_zeros(n, c, c, hw))[0] in paths


@st.composite
def winograd_convolutions(draw, min_out: int = 2):
    """A 3x3 stride-1 convolution in NCHW or NHWC, with groups or not, padded by a guard of
    0-2 per axis or not, odd sizes (outputs at least ``min_out`` per axis), written with ``+=!``
    or as ``+=`` after a bias, maybe scaled."""
    dtype = draw(st.sampled_from(["float", "float", "double"]))
    layout = draw(st.sampled_from(["nchw", "nhwc"]))
    g = draw(st.sampled_from([1, 1, 2, 3]))
    n, c, f = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2, 5, 8, 13])), draw(st.sampled_from([2, 7, 16]))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    h = draw(st.integers(max(1, min_out + 2 - 2 * ph), 13))
    w = draw(st.integers(max(1, min_out + 2 - 2 * pw), 19))
    oh, ow = h + 2 * ph - 2, w + 2 * pw - 2
    y, x = f"h + kh - {ph}", f"w + kw - {pw}"
    guard = ([f"h + kh >= {ph}", f"h + kh < H + {ph}"] if ph else []) + ([f"w + kw >= {pw}", f"w + kw < W + {pw}"]
                                                                            if pw else [])
    gs = ["g"] if g > 1 else []
    if layout == "nchw":
        i_idx, i_shape, o_idx = ["n", *gs, "c", y, x], [n, *([g] if gs else []), c, h, w], ["n", *gs, "f", "h", "w"]
        w_idx, sizes = [*gs, "f", "c", "kh", "kw"], ["N", *(["G"] if gs else []), "C", "H", "W"]
    else:
        i_idx, i_shape, o_idx = ["n", y, x, *gs, "c"], [n, h, w, *([g] if gs else []), c], ["n", "h", "w", *gs, "f"]
        w_idx, sizes = ["kh", "kw", *gs, "c", "f"], ["N", "H", "W", *(["G"] if gs else []), "C"]
    extent = {"g": g, "c": c, "f": f, "kh": 3, "kw": 3}
    w_shape = [extent[v] for v in w_idx]
    scale = draw(st.sampled_from(["", "", "0.5 * ", "-3.0 * "]))
    read = f"{scale}I({', '.join(i_idx)}) * Wt({', '.join(w_idx)})"
    rhs = f"({' && '.join(guard)}) ? {read} : 0.0" if guard else read
    w_sizes = ", ".join(f"W{i}" for i in range(len(w_shape)))
    where = f"where h in 0:{oh}, w in 0:{ow}, kh in 0:3, kw in 0:3"
    if draw(st.booleans()):  # +=! (overwrite)
        source = (f"def conv({dtype}({', '.join(sizes)}) I, {dtype}({w_sizes}) Wt) -> (O) {{\n"
                  f"    O({', '.join(o_idx)}) +=! {rhs}\n        {where}\n}}\n")
        extra = ()
    else:  # += onto a bias
        source = (f"def conv({dtype}({', '.join(sizes)}) I, {dtype}({w_sizes}) Wt, {dtype}(F) bias) -> (O) {{\n"
                  f"    O({', '.join(o_idx)}) = bias(f) where n in 0:N, {'g in 0:G, ' if gs else ''}h in 0:{oh}, "
                  f"w in 0:{ow}\n"
                  f"    O({', '.join(o_idx)}) += {rhs}\n        {where}\n}}\n")
        extra = (f,)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    np_dtype = np.float32 if dtype == "float" else np.float64
    args = tuple(rng.uniform(-1, 1, shape).astype(np_dtype) for shape in (i_shape, w_shape, *extra))
    target = draw(st.sampled_from(RUNNABLE))
    options = {"num_threads": draw(st.sampled_from([1, 2, 7])),
               "target": tiny_caches(Target.preset(target)) if draw(st.booleans()) else target}
    return source, args, options, dtype, c * 9


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=winograd_convolutions())
def test_random_winograd_convolutions_match_the_reference(case):
    source, args, options, dtype, k_len = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)  # every 3x3 stride-1 window takes the path
        kernel = tcpy.define(source, options=tcpy.Options(**options))
        assert "winograd" in _paths(kernel, *args), kernel.explain(*args)
        got = kernel(*args)
    want = tcpy.define(source, backend="reference")(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = EPS[dtype]
    np.testing.assert_allclose(got, want, rtol=16 * eps * (k_len + 1), atol=16 * eps * (k_len + 1) * k_len)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", RUNNABLE)
def test_inf_nan_and_huge_values_give_the_direct_sums(target, threads):
    """An inf in a tile's input would make NaN of the whole tile through the transforms'
    differences (and 0 x inf at the padding); these calls must hold what the reference
    computes, through the fused bias and ReLU; finite calls keep the path."""
    rng = np.random.default_rng(5)
    I = rng.standard_normal((1, 64, 12, 13), dtype=np.float32)
    Wt = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(64, dtype=np.float32)
    reference = tcpy.define(GUARDED_WEIGHTS, backend="reference")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)
        kernel = tcpy.define(GUARDED_WEIGHTS, options=tcpy.Options(target=target, num_threads=threads))
        assert _paths(kernel, I, Wt, bias) == ["winograd"]
    check_planted_values(kernel, reference, (I, Wt, bias),
                         ((0, (0, 3, 5, 6), np.inf), (1, (7, 2, 0, 0), np.nan), (0, (0, 9, 0, 0), -np.inf),
                          (0, (0, 1, 4, 4), 3e30), (1, (63, 63, 2, 2), -np.inf), (1, (0, 5, 1, 1), 3e30)))


def check_planted_values(kernel, reference, args, planted):
    """``kernel`` matches ``reference`` with each (argument index, element, value) of ``planted``
    (inf, NaN, huge) planted in turn: the same NaN and inf positions, the finite values close;
    then, every value restored, on the clean arguments."""
    for index, at, value in planted:
        original = args[index][at]
        args[index][at] = value
        got, want = kernel(*args), reference(*args)
        for g, r in zip(got, want):
            np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
            np.testing.assert_array_equal(np.isinf(g), np.isinf(r))
            finite = np.isfinite(r)
            np.testing.assert_allclose(g[finite], r[finite], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(r[finite]).max()))
        args[index][at] = original
    got, want = kernel(*args), reference(*args)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)


def test_rounding_stays_near_the_direct_sums():
    """Against exact (float64) sums, the float32 Winograd error stays within twice the GEMM
    path's on a ResNet-like layer (the transforms only add, subtract and halve)."""
    rng = np.random.default_rng(11)
    I = rng.standard_normal((1, 64, 20, 20), dtype=np.float32)
    Wt = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    exact = tcpy.define(PADDED.replace("float", "double"))(I.astype(np.float64), Wt.astype(np.float64))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)
        fast = tcpy.define(PADDED)
        assert _paths(fast, I, Wt) == ["winograd"]
        gemm = tcpy.define(PADDED, options=tcpy.Options(plan={"path": "packed"}))
        assert _paths(gemm, I, Wt) == ["packed"]
        direct_error = np.abs(gemm(I, Wt) - exact).max()
        winograd_error = np.abs(fast(I, Wt) - exact).max()
    assert winograd_error <= 2 * direct_error, (winograd_error, direct_error)


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("preset", [name for name in PRESETS if name.startswith("x86")])
def test_every_x86_preset_builds_the_path(preset, dtype):
    """The generated C (vector widths, shuffles of even and odd lanes) compiles for every x86
    preset, also those this CPU cannot run (AVX-512): built, not executed."""
    source = _conv_source().replace("float", dtype)
    kernel = tcpy.define(source, options=tcpy.Options(target=preset))
    shapes = ((1, 256, 28, 28), (256, 256, 3, 3))
    assert "winograd path" in str(kernel.explain(*shapes))
    assert build_library(kernel.c_source(*shapes), target=Target.preset(preset)).is_file()


UNUSUAL = {
    "half image, cast in the product": ("""
def conv(half(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                      ? float(I(n, c, h + kh - 1, w + kw - 1)) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}""", (((2, 5, 9, 11), np.float16), ((6, 5, 3, 3), np.float32))),
    "taps in another order, output transposed": ("""
def conv(float(N,C,H,W) I, float(F,KW,C,KH) Wt) -> (O) {
    O(n, f, w, h) +=! I(n, c, h + kh, w + kw) * Wt(f, kw, c, kh)
        where h in 0:H-2, w in 0:W-2, kh in 0:3, kw in 0:3
}""", (((1, 4, 10, 9), np.float32), ((7, 3, 4, 3), np.float32))),
    "padding on one side of each axis": ("""
def conv(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 2 && w + kw >= 1) ? I(n, c, h + kh - 2, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W - 1, kh in 0:3, kw in 0:3
}""", (((2, 3, 7, 8), np.float32), ((5, 3, 3, 3), np.float32))),
    "integer weights": ("""
def conv(float(N,C,H,W) I, int32(F,C,3,3) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * float(Wt(f, c, kh, kw))
        where h in 0:H-2, w in 0:W-2, kh in 0:3, kw in 0:3
}""", (((1, 3, 8, 8), np.float32), ((4, 3, 3, 3), np.int32))),
    "outputs of 2 x 3": ("""
def conv(double(N,C,H,W) I, double(F,C,3,3) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
        where h in 0:H-2, w in 0:W-2, kh in 0:3, kw in 0:3
}""", (((3, 2, 4, 5), np.float64), ((3, 2, 3, 3), np.float64))),
}


@pytest.mark.parametrize("name", list(UNUSUAL))
def test_unusual_types_and_layouts_match_the_reference(name):
    source, specs = UNUSUAL[name]
    rng = np.random.default_rng(1)
    args = [(rng.integers(-3, 4, shape) if dtype == np.int32 else rng.uniform(-1, 1, shape)).astype(dtype)
            for shape, dtype in specs]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_WINOGRAD)
        kernel = tcpy.define(source, options=tcpy.Options(num_threads=2))
        assert _paths(kernel, *args) == ["winograd"]
        got = kernel(*args)
    want = tcpy.define(source, backend="reference")(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
