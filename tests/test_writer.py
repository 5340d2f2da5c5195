"""tcpy.lang.writer: every constant a scalar type holds is written as TC that evaluates to exactly it."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tcpy
from tcpy.lang import writer
from tcpy.lang.types import ScalarType


def _evaluate(literals: list[str], dtype: ScalarType, backend: str = "reference") -> list:
    """The values of TC expressions of type ``dtype``, one output each."""
    body = "\n".join(f"    O{k}(i) = {text} where i in 0:1" for k, text in enumerate(literals))
    outputs = ", ".join(f"O{k}" for k in range(len(literals)))
    kernel = tcpy.define(f"def constants() -> ({outputs}) {{\n{body}\n}}", backend=backend)
    results = kernel()
    results = results if isinstance(results, tuple) else (results,)
    assert all(r.dtype == np.dtype(dtype.numpy_name) for r in results)
    return [r[0] for r in results]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=8))
def test_doubles_are_exact_over_their_whole_range(values):
    results = _evaluate([writer.literal(v, ScalarType.FLOAT64) for v in values], ScalarType.FLOAT64)
    for value, result in zip(values, results):
        assert result == value and math.copysign(1, result) == math.copysign(1, value), writer.literal(
            value, ScalarType.FLOAT64)


def test_extreme_doubles_and_special_values():
    float32_max = float(np.finfo(np.float32).max)  # its shortest 4-digit spelling is beyond float32
    values = [5e-324, -2.2250738585072014e-308, 1.7976931348623157e308, 1e-300, -1e300, float32_max, 0.1, -0.0]
    results = _evaluate([writer.literal(v, ScalarType.FLOAT64) for v in values], ScalarType.FLOAT64)
    assert [float(r) for r in results] == values and math.copysign(1, results[-1]) == -1
    assert _evaluate([writer.literal(-float32_max, ScalarType.FLOAT32)], ScalarType.FLOAT32) == [-float32_max]
    specials = _evaluate([writer.literal(v, ScalarType.FLOAT64) for v in (math.inf, -math.inf, math.nan)],
                         ScalarType.FLOAT64)
    assert specials[0] == math.inf and specials[1] == -math.inf and math.isnan(specials[2])


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(-65504, 65504), min_size=1, max_size=8))
def test_half_constants_round_once_to_nearest_even(values):
    results = _evaluate([writer.literal(v, ScalarType.FLOAT16) for v in values], ScalarType.FLOAT16)
    assert [float(r) for r in results] == [float(np.float16(v)) for v in values]


@pytest.mark.parametrize("dtype", [ScalarType.INT64, ScalarType.UINT64, ScalarType.INT32, ScalarType.INT8,
                                   ScalarType.UINT32])
def test_integer_limits_are_exact(dtype):
    low, high = writer.int_range(dtype)
    values = [low, low + 1, high, high - 1, 0, -2**31 if low < -2**31 else low, 2**31 if high >= 2**31 else high]
    backend = "compiled" if dtype.bits == 64 else "reference"
    results = _evaluate([writer.literal(v, dtype) for v in values], dtype, backend)
    assert [int(r) for r in results] == values
    assert _evaluate([writer.lowest(dtype), writer.highest(dtype)], dtype) == [low, high]


@pytest.mark.parametrize("value, dtype, message", [
    (0.5, ScalarType.INT32, "the constant 0.5 is not an integer, as int32 needs"),
    (2**31, ScalarType.INT32, "the constant 2147483648 does not fit int32 [-2147483648, 2147483647]"),
    (-1, ScalarType.UINT64, "the constant -1 does not fit uint64 [0, 18446744073709551615]"),
    (1e39, ScalarType.FLOAT32, "the constant 1e+39 is outside the float32 range"),
    (70000.0, ScalarType.FLOAT16, "the constant 70000.0 is outside the float16 range"),
])
def test_values_a_type_cannot_hold_are_rejected(value, dtype, message):
    with pytest.raises(writer.LiteralError) as err:
        writer.literal(value, dtype)
    assert str(err.value) == message and isinstance(err.value, tcpy.TCError)
