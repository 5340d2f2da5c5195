"""Pathological but valid-looking programs end in a TCError, never a RecursionError."""
import numpy as np
import pytest

import tcpy

DEEP = {
    "sum": "A(i)" + " + A(i)" * 3000,
    "unary": "-" * 400 + "A(i)",
    "calls": "exp(" * 300 + "A(i)" + ")" * 300,
    "ternaries": "A(i) > 0.0 ? " * 300 + "1.0" + " : 0.0" * 300,
}


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_too_deep_expressions_are_syntax_errors(kind):
    with pytest.raises(tcpy.TCSyntaxError, match="expression nested too deeply"):
        tcpy.define(f"def f(float(N) A) -> (B) {{ B(i) = {DEEP[kind]} }}")


def test_the_deepest_allowed_expression_runs_in_every_stage():
    src = "def f(float(N) A) -> (B) { B(i) = A(i)" + " * A(i)" * 180 + " }"
    X = np.full(3, 1.0, np.float32)
    np.testing.assert_array_equal(tcpy.define(src)(X), X)
    np.testing.assert_array_equal(tcpy.define(src, backend="reference")(X), X)
    assert tcpy.parse(str(tcpy.parse(src).defs[0])) == tcpy.parse(src)
