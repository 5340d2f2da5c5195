"""Size-generic convolutions: one compiled kernel holds the run-time engine's packed path and its
winograd path, and each call shape takes the one the cost model chooses for its sizes (NCHW and
NHWC, padding by guards, edge tiles, 1x1 images, windows that are no 3x3, stride 2), with the
reference evaluator's results and one build."""
import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
import tcpy.target
from tcpy.demo import CONV2D, padded_conv2d_source
from tcpy.target import DEFAULT_COST_MODEL, Target

# "same" padding by a guard around the whole product (a failing term adds nothing)
PADDED = """
def conv_padded(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
        ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
}
"""
# NHWC, double, the guard around the image's read alone (a failing term is 0 times the weight)
NHWC = """
def conv_nhwc(double(N,H,W,C) I, double(F,KH,KW,C) Wt) -> (O) {
    O(n, h, w, f) +=! ((h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
        ? I(n, h + kh - 1, w + kw - 1, c) : 0.0) * Wt(f, kh, kw, c)
        where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
}
"""
STRIDED = """
def conv_strided(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(f, c, kh, kw)
        where h in 0:(H - KH)/2 + 1, w in 0:(W - KW)/2 + 1
}
"""

BATCH = (1, 2, 3)
CHANNELS = (1, 2, 5, 16, 33)
PIXELS = (1, 2, 3, 5, 7, 13, 16, 29)  # 1x1 images, primes, edge tiles (odd), whole tiles
WINDOWS = ((3, 3), (3, 3), (3, 3), (1, 1), (3, 1), (2, 3))
FIRST = (1, 16, 16, 12, 12, 3, 3)  # the first call (N, C, F, H, W, KH, KW): a 3x3 window


def _conv_args(rng, source, n, c, f, h, w, kh, kw):
    """Arguments of ``source`` for a batch of ``n`` images of ``h x w`` outputs, ``c`` -> ``f``
    channels, a ``kh x kw`` window."""
    dtype = np.float64 if source is NHWC else np.float32
    if source is CONV2D:
        shapes = (n, c, h + kh - 1, w + kw - 1), (f, c, kh, kw)
    elif source is STRIDED:
        shapes = (n, c, 2 * (h - 1) + kh, 2 * (w - 1) + kw), (f, c, kh, kw)
    elif source is NHWC:
        shapes = (n, h, w, c), (f, kh, kw, c)
    else:
        shapes = (n, c, h, w), (f, c, kh, kw)
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in shapes)


def _runnable(preset):
    return Target.preset(preset).can_run_here()


# each def on the presets and thread counts taken in turn (the prepadded NCHW one on all three)
CONFIGS = [(source, preset, threads) for source, preset, threads in (
    (CONV2D, "x86-64-v3", 1), (CONV2D, "x86-64", 2), (CONV2D, "x86-64-v4", 7),
    (PADDED, "x86-64-v3", 2), (NHWC, "x86-64", 7), (STRIDED, "x86-64-v3", 7)) if _runnable(preset)]

_kernels = {}


def _kernel(source, preset, threads):
    """One generic kernel per configuration for the whole module, first called with a 3x3 window
    (the shape it is planned at: its winograd path is held from then on)."""
    key = (source, preset, threads)
    if key not in _kernels:
        options = tcpy.Options(specialize="never", target=preset, num_threads=threads)
        kernel, reference = tcpy.define(source, options=options), tcpy.define(source, backend="reference")
        _check(kernel, reference, _conv_args(np.random.default_rng(1), source, *FIRST))
        _kernels[key] = kernel, reference
    return _kernels[key]


def _check(kernel, reference, args):
    got, want = kernel(*args), reference(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    # Winograd's transforms round differently from the direct sums (by the largest terms)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max(initial=0))))


@pytest.mark.parametrize("source, preset, threads", CONFIGS)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_generic_conv_kernel_serves_every_shape(builds, source, preset, threads, data):
    kernel, reference = _kernel(source, preset, threads)
    rng = np.random.default_rng(0)
    draw = lambda values: data.draw(st.sampled_from(values))  # noqa: E731
    for _ in range(3):
        kh, kw = draw(WINDOWS)
        _check(kernel, reference, _conv_args(rng, source, draw(BATCH), draw(CHANNELS), draw(CHANNELS),
                                             draw(PIXELS), draw(PIXELS), kh, kw))
    # built once, at the kernel's first call (in this module's first example)
    assert len(builds) == 1 and "generic" in builds[0]


def _variant(kernel, *args) -> str:
    line = next(line for line in kernel.explain(*args).splitlines() if "generic kernel:" in line)
    found = re.search(r"run-time engine \((\w+) path", line)
    return found.group(1) if found else line


@pytest.mark.parametrize("source", [CONV2D, PADDED])
def test_explain_names_the_variant_each_shape_takes(builds, source):
    """Wide channels on a large image take the winograd path, a few channels, a window that is
    no 3x3 and an image of one output the packed path (an unpadded 1x1 window the small path: a
    GEMM whose operands are read in place); one build serves them all."""
    kernel = tcpy.define(source, options=tcpy.Options(specialize="never", target="x86-64-v3", num_threads=2))
    reference = tcpy.define(source, backend="reference")
    rng = np.random.default_rng(2)
    expected = {(1, 16, 16, 14, 14, 3, 3): "winograd", (2, 32, 32, 17, 9, 3, 3): "winograd",
                (1, 4, 4, 7, 7, 3, 3): "packed", (1, 16, 16, 14, 14, 1, 1): "small" if source is CONV2D else "packed",
                (1, 16, 16, 1, 1, 3, 3): "packed"}
    for shape, variant in expected.items():
        args = _conv_args(rng, source, *shape)
        _check(kernel, reference, args)
        assert _variant(kernel, *args) == variant, (shape, kernel.explain(*args))
    assert len(builds) == 1 and "generic" in builds[0]


def test_winograd_takes_the_micro_tile_the_planner_gives_each_shape(builds):
    """The kernel holds the winograd path for each micro-tile of the target: 24 tiles fill one
    4x24 tile exactly where 6x16 would compute 32 (AVX2's 16 registers, one thread)."""
    kernel = tcpy.define(CONV2D, options=tcpy.Options(specialize="never", target="x86-64-v3", num_threads=1))
    reference = tcpy.define(CONV2D, backend="reference")
    rng = np.random.default_rng(4)
    for shape, tile in (((1, 16, 16, 14, 14, 3, 3), "6x16"), ((1, 32, 32, 8, 12, 3, 3), "4x24"),
                        ((2, 64, 64, 6, 8, 3, 3), "4x24"), ((1, 64, 64, 16, 16, 3, 3), "6x16")):
        args = _conv_args(rng, CONV2D, *shape)
        _check(kernel, reference, args)
        line = next(line for line in kernel.explain(*args).splitlines() if "generic kernel:" in line)
        assert "winograd path" in line and f"): micro-tile {tile};" in line, (shape, line)
    assert len(builds) == 1


def test_winograd_sums_point_by_point_where_an_operand_is_not_finite():
    """inf or NaN in the image or the weights (which Winograd's transforms would spread over a
    tile) takes the exact sums, as the specialised kernel does."""
    kernel = tcpy.define(CONV2D, options=tcpy.Options(specialize="never", num_threads=2))
    reference = tcpy.define(CONV2D, backend="reference")
    rng = np.random.default_rng(3)
    image, weights = _conv_args(rng, CONV2D, 1, 16, 16, 14, 14, 3, 3)
    assert _variant(kernel, image, weights) == "winograd"
    for which, value in ((image, np.inf), (weights, np.nan), (image, 3e38)):
        which.flat[37] = value
        np.testing.assert_allclose(kernel(image, weights), reference(image, weights), rtol=1e-4, atol=1e-3)


def test_a_depthwise_convolution_is_specialised_to_each_shape(builds):
    """A depthwise convolution (M = 1, a window's K) takes the direct path, which the run-time
    engine does not hold: under "auto" its calls are specialised to their sizes (explain says
    why) instead of running on a packed path that would fill one row of each micro-tile."""
    source = padded_conv2d_source(3, 1, 1, depthwise=True)
    kernel = tcpy.define(source, options=tcpy.Options(specialize="auto", target="x86-64-v3", num_threads=2))
    reference = tcpy.define(source, backend="reference")
    rng = np.random.default_rng(5)
    for n, c, hw in ((1, 8, 12), (2, 3, 7)):
        image, weights = rng.standard_normal((n, c, hw, hw), np.float32), rng.standard_normal((c, 3, 3), np.float32)
        _check(kernel, reference, (image, weights))
        text = kernel.explain(image, weights)
        assert "no generic kernel, statement 1 takes the direct path" in text, text
    assert len(builds) == 2 and not any("generic" in symbol for symbol in builds)


@pytest.mark.parametrize("source, preset", [(source, preset) for source in (CONV2D, PADDED)
                                            for preset in ("x86-64-v3", "x86-64-v4") if _runnable(preset)])
def test_winograd_rows_of_tiles_that_are_no_multiple_of_a_vector(source, preset):
    """A tile row of 28 tiles (or 19, or 3) loads its last tiles in a vector group that overlaps
    the one before it: the results stay the reference's, at 1 and 2 threads."""
    rng = np.random.default_rng(6)
    reference = tcpy.define(source, backend="reference")
    for threads in (1, 2):
        kernel = tcpy.define(source, options=tcpy.Options(specialize="never", target=preset, num_threads=threads))
        for shape in ((1, 16, 16, 56, 56, 3, 3), (2, 16, 24, 38, 37, 3, 3), (1, 32, 16, 6, 40, 3, 3)):
            args = _conv_args(rng, source, *shape)
            _check(kernel, reference, args)
            assert _variant(kernel, *args) == "winograd", (shape, kernel.explain(*args))


# the winograd path as F(4x4, 3x3) wherever both output axes hold a tile of 4, else F(2x2, 3x3)
ALWAYS_F4 = dataclasses.replace(DEFAULT_COST_MODEL, winograd_gain_min=0.0, winograd_f4_gain_min=0.0)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_generic_kernel_runs_f4_and_f2_at_different_shapes(builds, threads):
    """The kernel holds F(4x4, 3x3) and F(2x2, 3x3) and each call runs the tile size its planner
    gives it (an output axis shorter than 4 keeps F(2x2)): padded images whose sizes are no
    multiple of 4 (partial edge tiles), with the reference evaluator's results and one build."""
    rng = np.random.default_rng(7)
    reference = tcpy.define(PADDED, backend="reference")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_F4)
        kernel = tcpy.define(PADDED, options=tcpy.Options(specialize="never", target="x86-64-v3",
                                                          num_threads=threads))
        for shape, tile in (((1, 16, 16, 21, 18, 3, 3), 4), ((2, 16, 24, 3, 13, 3, 3), 2),
                            ((2, 5, 33, 13, 7, 3, 3), 4), ((1, 16, 16, 9, 2, 3, 3), 2),
                            ((3, 8, 16, 6, 10, 3, 3), 4)):
            args = _conv_args(rng, PADDED, *shape)
            line = next(line for line in kernel.explain(*args).splitlines() if "generic kernel:" in line)
            assert f"run-time engine (winograd path F({tile}x{tile}, 3x3)" in line, (shape, line)
            _check(kernel, reference, args)
    assert len(builds) == 1 and "generic" in builds[0]


# the winograd path wherever it applies, with each tile size in turn
FORCED_TILE = {4: ALWAYS_F4, 2: dataclasses.replace(DEFAULT_COST_MODEL, winograd_gain_min=0.0,
                                                    winograd_f4_gain_min=float("inf"))}
SIDES = (3, 4, 5, 7, 8, 9, 15, 16, 17)  # around multiples of both tiles
LARGE_SIDES = (29, 31, 32, 33)  # an image of more tiles than a sliver holds
# unit column strides (NCHW: rows of whole tiles stored at once, gathers and weights' windows
# read at constant offsets) and others (NHWC), each tile size, the host and AVX2 presets
FORCED_CONFIGS = [(source, tile, preset, threads) for source, tile, preset, threads in (
    (CONV2D, 4, None, 2), (CONV2D, 2, "x86-64-v3", 7), (PADDED, 4, "x86-64-v3", 1),
    (NHWC, 4, None, 7), (NHWC, 2, "x86-64-v3", 2)) if preset is None or _runnable(preset)]
_forced = {}


@pytest.mark.parametrize("source, tile, preset, threads", FORCED_CONFIGS)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_winograd_tile_sizes_at_shapes_around_tile_multiples(source, tile, preset, threads, data):
    """One generic kernel per configuration on F(4x4, 3x3) or F(2x2, 3x3) at output sides around
    multiples of both tiles (partial edge tiles, blocks of several tile slivers and a partial
    last one), NCHW and NHWC: the reference evaluator's results."""
    key = (source, tile, preset, threads)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: FORCED_TILE[tile])
        if key not in _forced:
            options = tcpy.Options(specialize="never", target=preset, num_threads=threads)
            _forced[key] = tcpy.define(source, options=options), tcpy.define(source, backend="reference")
        kernel, reference = _forced[key]
        rng = np.random.default_rng(8)
        for sides in (SIDES, LARGE_SIDES):
            # (one input channel or one output channel: no GEMM to transform, the packed path)
            n, c, f = data.draw(st.sampled_from((1, 2, 3))), data.draw(st.sampled_from((2, 3, 8, 17))), \
                data.draw(st.sampled_from((2, 5, 8, 19)))
            h, w = data.draw(st.sampled_from(sides)), data.draw(st.sampled_from(sides))
            args = _conv_args(rng, source, n, c, f, h, w, 3, 3)
            size = tile if min(h, w) >= tile else 2  # an output axis shorter than 4 keeps F(2x2)
            line = next(line for line in kernel.explain(*args).splitlines() if "generic kernel:" in line)
            assert f"run-time engine (winograd path F({size}x{size}, 3x3)" in line, (h, w, line)
            _check(kernel, reference, args)
