"""Long vectorised reductions (rows of softmax, layer norm, attention) run as several strips with
their own accumulators: same results as the reference evaluator for every operator and dtype, at
lengths around the threshold and with remainders, NaN in any strip, every runnable target."""
from pathlib import Path

import numpy as np
import pytest

import tcpy
from test_contraction import RUNNABLE

ROW_REDUCTION = """
def rows({dtype}(M,N) X) -> (R) {{
    R(m) {op}=! X(m, n)
}}
"""


def reduce(op, dtype, x, threads, target=None):
    source = ROW_REDUCTION.format(dtype=dtype, op=op)
    options = tcpy.Options(num_threads=threads, target=target)
    return tcpy.define(source, options=options)(x), tcpy.define(source, backend="reference")(x)


@pytest.mark.parametrize("op", ["+", "*", "max", "min"])
@pytest.mark.parametrize("dtype", ["float", "double", "int32"])
@pytest.mark.parametrize("n", [7, 63, 64, 65, 130, 517, 1031])
def test_row_reductions_match_the_reference(op, dtype, n):
    rng = np.random.default_rng(n)
    np_dtype = {"float": np.float32, "double": np.float64, "int32": np.int32}[dtype]
    if op == "*":  # products of values near 1 stay finite and exact enough to compare
        x = (1 + rng.uniform(-0.01, 0.01, (5, n))).astype(np_dtype) if dtype != "int32" else \
            rng.choice([-1, 1], (5, n)).astype(np_dtype)
    else:
        x = (rng.standard_normal((5, n)) * 100).astype(np_dtype)
    for threads in (1, 2):
        got, want = reduce(op, dtype, x, threads)
        assert got.dtype == want.dtype and got.shape == (5,)
        if op in ("max", "min") or dtype == "int32":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float" else 1e-12)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("position", [0, 200, 400, 700, 1030])
def test_nan_in_any_strip_gives_nan(op, position):
    x = np.random.default_rng(position).standard_normal((3, 1031)).astype(np.float32)
    x[1, position] = np.nan
    got, want = reduce(op, "float", x, 1)
    assert np.isnan(got[1]) and np.isnan(want[1])
    np.testing.assert_array_equal(got[[0, 2]], want[[0, 2]])


@pytest.mark.parametrize("preset", RUNNABLE)
def test_every_runnable_target_sums_long_rows_like_the_reference(preset):
    x = np.random.default_rng(3).standard_normal((4, 999)).astype(np.float32)
    for op in ("+", "max"):
        got, want = reduce(op, "float", x, 2, target=preset)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_softmax_rows_with_strips_match_the_reference():
    source = (Path(__file__).parent / "golden" / "good" / "softmax_temporaries.tc").read_text()
    x = (np.random.default_rng(5).standard_normal((37, 1021)) * 5).astype(np.float32)
    for threads in (1, 2, 7):
        got = tcpy.define(source, options=tcpy.Options(num_threads=threads))(x)
        want = tcpy.define(source, backend="reference")(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got.sum(axis=1), 1, rtol=1e-5)
