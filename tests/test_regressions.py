"""Regression tests for bugs the differential tests found, numbered in the order they were found.

Each test is the minimal program of one bug (its docstring says what went wrong), checked
against the reference evaluator and against values worked out by hand.
"""
import numpy as np
import pytest

import tcpy

BACKENDS = ["compiled", "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unwritten_temporary_elements_are_zero(backend):
    """Bug 1: T(0) is written by no statement; it must read as 0, not as uninitialised memory."""
    k = tcpy.define("""
    def f(float(N) A) -> (O) {
        T(i) = A(i - 1)
        O(i) = T(i) + 1.0
    }""", backend=backend)
    A = np.arange(1, 5, dtype=np.float32)
    for _ in range(3):  # garbage differs between calls; zero does not
        np.testing.assert_array_equal(k(A), [1, 2, 3, 4, 5])
        scratch = [np.full(64, 7.0, np.float32) for _ in range(8)]  # dirty the allocator
        del scratch


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", ["", "# only a comment\n"])
def test_define_of_an_empty_source_raises_lookup_error(backend, source):
    """Bug 2: a source without defs must raise, not return an empty Library."""
    with pytest.raises(tcpy.TCLookupError, match="defines no def"):
        tcpy.define(source, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_division_in_a_ternary_inside_an_index_floors(backend):
    """Bug 3: / and % anywhere inside an index expression round toward -inf (TC's index semantics)."""
    X = np.arange(6, dtype=np.float32)
    k = tcpy.define("def f(float(N) X) -> (Y) { Y(i) = X(i >= 0 ? (i - 3) / 2 + 2 : 0) where i in 0:N }",
                    backend=backend)
    np.testing.assert_array_equal(k(X), [0, 1, 1, 2, 2, 3])  # truncation would give 1 1 2 2 2 3
    m = tcpy.define("def f(float(N) X, int32(N) I) -> (Y) { Y(i) = X(max((I(i) - 3) % 4, 0)) }", backend=backend)
    np.testing.assert_array_equal(m(X, np.array([0, 1, 2, 3, 4, 5], np.int32)), [1, 2, 3, 0, 1, 2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_builtins_are_correctly_rounded(backend):
    """Bug 4 (reference): float32 exp/cos of an int are the correctly rounded float32 values."""
    k = tcpy.define("def f(float(N) A) -> (E, C) { E(i) = double(exp(N)) + 0.0 * A(i)\n"
                    " C(i) = double(cos(N)) + 0.0 * A(i) }", backend=backend)
    e, c = k(np.zeros(2, np.float32))
    assert e.dtype == np.float64
    np.testing.assert_array_equal(e, np.float64(np.float32(np.exp(2.0))))  # N = 2
    np.testing.assert_array_equal(c, np.float64(np.float32(np.cos(2.0))))


def test_scalar_builtins_on_rank0_values_and_poles():
    """Bug 5 (reference): math-module builtins on 0-d values; C's values at the poles."""
    k = tcpy.define("def f(double B, double(N) X) -> (E, L, G) { E = erf(B)\n L(i) = lgamma(X(i))\n"
                    " G(i) = tgamma(X(i)) }", backend="reference")
    e, lg, g = k(0.5, np.array([0.0, -1.0, 0.5]))
    import math
    assert e == math.erf(0.5)
    np.testing.assert_array_equal(lg, [np.inf, np.inf, math.lgamma(0.5)])
    assert g[0] == np.inf and np.isnan(g[1]) and g[2] == math.gamma(0.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_keeps_the_sign_of_zero(backend):
    """Bug 6 (reference): C's round(-0.25) is -0.0, so 1 / round(-0.25) is -inf."""
    k = tcpy.define("def f(double(N) A) -> (O) { O(i) = 1.0 / round(A(i)) }", backend=backend)
    np.testing.assert_array_equal(k(np.array([-0.25, 0.25, -0.5])), [-np.inf, np.inf, -1.0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", ["half", "float", "double"])
def test_max_min_ties_of_signed_zeros_return_the_first_operand(backend, t):
    """Bug 7 (reference): max(0.0, -0.0) is 0.0 and min(-0.0, 0.0) is -0.0 (a >= b ? a : b)."""
    k = tcpy.define(f"def f({t}(N) A) -> (P, Q) {{ P(i) = 1.0 / max(0.0, A(i))\n"
                    f" Q(i) = 1.0 / min(A(i), 0.0) }}", backend=backend)
    p, q = k(np.array([-0.0, 0.0], np.dtype(tcpy.lang.types.TYPE_NAMES[t].numpy_name)))
    np.testing.assert_array_equal(p, [np.inf, np.inf])
    np.testing.assert_array_equal(q, [-np.inf, np.inf])


@pytest.mark.skipif(tcpy.Target.host().arch != "x86_64", reason="MMX and x87 are x86")
@pytest.mark.parametrize("preset", ["x86-64", "host"])
def test_a_kernel_leaves_the_x87_unit_usable(preset):
    """Bug 8: built for baseline x86-64, an int64 GEMM moved values through an MMX register
    (gcc: movq2dq) and never cleared it (emms); every x87 operation after it, numpy's long
    double sum included, was NaN. Kernels are built without MMX."""
    k = tcpy.define("def f(int64(M,K) A, int64(N,K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
                    options=tcpy.Options(target=preset, loop_order=("j", "i", "l"), unroll=4,
                                         tile_sizes={"q": 1}, register_tile=False, parallel=False))
    rng = np.random.default_rng(0)
    a, b = rng.integers(-5, 5, (53, 63)), rng.integers(-5, 5, (49, 63))
    np.testing.assert_array_equal(k(a, b), a @ b.T)
    assert np.array([1.5, 2.25], dtype=np.longdouble).sum() == 3.75


@pytest.mark.parametrize("flags", [{"fast_math": True}, {"cflags": ["-Ofast"]}])
def test_a_fast_math_kernel_leaves_the_process_denormals_alone(flags, tmp_path, monkeypatch):
    """Bug 9: built with -ffast-math (or -Ofast), gcc linked crtfastmath.o into the kernel's
    library, whose constructor set flush-to-zero and denormals-are-zero when it was loaded: from
    then on NumPy's float arithmetic flushed denormals to 0 in the whole process."""
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))  # a fresh build, not a cached library
    k = tcpy.define("def f(float(N) A) -> (O) { O(i) = exp(A(i)) }", options=tcpy.Options(**flags))
    np.testing.assert_allclose(k(np.zeros(5, np.float32)), np.ones(5), rtol=1e-6)
    assert np.float32(1e-38) * np.float32(1e-3) > 0
    assert np.float64(1e-300) * 1e-10 > 0
