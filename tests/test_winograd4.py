"""Winograd F(4x4, 3x3), the winograd path's second tile size: its matrices, which layers the
planner gives it (preset targets), differential tests against the reference evaluator with it
forced (sizes not multiples of 4, padding, NCHW/NHWC, presets, 1/2/7 threads), special values,
its float32 rounding against F(2x2)'s, and a size-generic kernel that keeps F(2x2)."""
import dataclasses
import os
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tcpy
import tcpy.target
from tcpy.target import DEFAULT_COST_MODEL
from tcpy.winograd_matrices import transforms
from test_contraction import EPS
from test_conv import GUARDED_WEIGHTS, PADDED
from test_winograd import ALWAYS_WINOGRAD, _conv_source, _paths, _zeros, check_planted_values, winograd_convolutions

# the path as F(4x4, 3x3) wherever both output axes hold a tile, on any gain and ISA
ALWAYS_F4 = dataclasses.replace(DEFAULT_COST_MODEL, winograd_gain_min=0.0, winograd_f4_gain_min=0.0)
EXAMPLES = int(os.environ.get("TCPY_CONV_EXAMPLES", "25")) * 3 // 5
F4_TEXT = "Winograd F(4x4, 3x3) over"
# max |error| / max |result| of F(4x4, 3x3) in float32 against float64 sums, random normal data
F4_RELATIVE_ERROR = 5e-5


def _explain(kernel, *args) -> str:
    return str(kernel.explain(*args))


@pytest.mark.parametrize("tile", [2, 4])
def test_the_matrices_give_the_2d_correlation_exactly(tile):
    t = transforms(tile)
    a = t.tile + 2
    rng = random.Random(tile)
    for _ in range(5):
        d = [[Fraction(rng.randint(-9, 9)) for _ in range(a)] for _ in range(a)]
        g = [[Fraction(rng.randint(-9, 9)) for _ in range(3)] for _ in range(3)]
        mul = lambda x, y: [[sum(x[i][k] * y[k][j] for k in range(len(y))) for j in range(len(y[0]))]  # noqa: E731
                            for i in range(len(x))]
        tr = lambda x: [list(r) for r in zip(*x)]  # noqa: E731
        u, v = mul(mul(t.g, g), tr(t.g)), mul(mul(t.bt, d), tr(t.bt))
        y = mul(mul(t.at, [[u[i][j] * v[i][j] for j in range(a)] for i in range(a)]), tr(t.at))
        assert y == [[sum(d[i + p][j + q] * g[p][q] for p in range(3) for q in range(3)) for j in range(tile)]
                     for i in range(tile)]


@pytest.mark.parametrize("target, n, c, hw, tile", [
    ("x86-64-v4", 1, 64, 56, 4), ("x86-64-v4", 8, 128, 28, 4), ("x86-64-v4", 1, 256, 14, 2),
    ("x86-64-v4", 8, 512, 7, 2), ("x86-64-v3", 8, 64, 56, 4), ("x86-64-v3", 1, 256, 14, 2),
])
def test_the_planner_takes_f4_on_large_images_only(target, n, c, hw, tile):
    """F(4x4) where F(2x2)'s estimate is the margin above its own (many tiles: ResNet's 56x56
    layer, its 28x28 layer at N=8), F(2x2) where few tiles fill few slivers."""
    kernel = tcpy.define(_conv_source(), options=tcpy.Options(num_threads=2, target=target))
    args = _zeros(n, c, c, hw)
    assert _paths(kernel, *args) == ["winograd"]
    text = _explain(kernel, *args)
    assert f"Winograd F({tile}x{tile}, 3x3) over (h + kh, w + kw)" in text
    assert ("F(2x2, 3x3) estimated" in text) == (tile == 4)


def test_the_margin_and_axes_shorter_than_a_tile_keep_f2():
    never = dataclasses.replace(DEFAULT_COST_MODEL, winograd_f4_gain_min=float("inf"))
    args = _zeros(1, 64, 64, 56)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: never)
        assert "Winograd F(2x2, 3x3)" in _explain(tcpy.define(_conv_source()), *args)
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_F4)
        assert F4_TEXT in _explain(tcpy.define(_conv_source()), *args)
        I, Wt = np.zeros((1, 8, 3, 40), np.float32), np.zeros((8, 8, 3, 3), np.float32)  # 3 output rows
        assert "Winograd F(2x2, 3x3)" in _explain(tcpy.define(_conv_source()), I, Wt)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=winograd_convolutions(min_out=4))
def test_random_f4_convolutions_match_the_reference(case):
    source, args, options, dtype, k_len = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_F4)
        kernel = tcpy.define(source, options=tcpy.Options(**options))
        assert F4_TEXT in _explain(kernel, *args)
        got = kernel(*args)
    want = tcpy.define(source, backend="reference")(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    # (the transforms' constants, up to 8 and 1/24, grow the rounding: 4x F(2x2)'s tolerance)
    eps = 4 * EPS[dtype]
    np.testing.assert_allclose(got, want, rtol=16 * eps * (k_len + 1), atol=16 * eps * (k_len + 1) * k_len)


@pytest.mark.parametrize("threads", [1, 2])
def test_inf_nan_and_huge_values_give_the_direct_sums(threads):
    rng = np.random.default_rng(5)
    I = rng.standard_normal((1, 32, 13, 14), dtype=np.float32)
    Wt = rng.standard_normal((32, 32, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(32, dtype=np.float32)
    reference = tcpy.define(GUARDED_WEIGHTS, backend="reference")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcpy.target, "cost_model", lambda target: ALWAYS_F4)
        kernel = tcpy.define(GUARDED_WEIGHTS, options=tcpy.Options(num_threads=threads))
        assert F4_TEXT in _explain(kernel, I, Wt, bias)
    check_planted_values(kernel, reference, (I, Wt, bias),
                         ((0, (0, 3, 5, 6), np.inf), (1, (7, 2, 0, 0), np.nan), (0, (0, 1, 4, 4), 3e30),
                          (1, (31, 31, 2, 2), -np.inf)))


def test_float32_rounding_is_bounded():
    """max |error| / max |result| against float64 sums on random normal data, a 64-channel
    padded layer: below F4_RELATIVE_ERROR, and at most 40x F(2x2)'s (measured: ~20x); PyTorch's
    float32 convolution, if present, is printed beside for the record."""
    rng = np.random.default_rng(11)
    I = rng.standard_normal((1, 64, 22, 22), dtype=np.float32)
    Wt = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    exact = tcpy.define(PADDED.replace("float", "double"))(I.astype(np.float64), Wt.astype(np.float64))
    errors = {}
    for name, model, text in (("f4", ALWAYS_F4, F4_TEXT), ("f2", ALWAYS_WINOGRAD, "Winograd F(2x2, 3x3) over")):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tcpy.target, "cost_model", lambda target, model=model: model)
            kernel = tcpy.define(PADDED)
            assert text in _explain(kernel, I, Wt)
            errors[name] = np.abs(kernel(I, Wt) - exact).max() / np.abs(exact).max()
    assert errors["f4"] <= F4_RELATIVE_ERROR and errors["f4"] <= 40 * errors["f2"], errors
    torch = pytest.importorskip("torch")
    got = torch.nn.functional.conv2d(torch.from_numpy(I), torch.from_numpy(Wt), padding=1).numpy()
    print("relative errors:", errors, "torch:", np.abs(got - exact).max() / np.abs(exact).max())
