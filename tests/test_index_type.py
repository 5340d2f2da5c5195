"""TC's index type (issue 34, item 4): index values are int32 by type and exact in 64 bits.

An output defined from index variables, sizes or dimensions is int32, as in TC, so TC programs
that pass it to an ``int32`` input work. Kernels compute index values in 64 bits: intermediates
never wrap, ``int64(...)`` and subscripts take the exact value, and a call whose sizes would put
an int32 index result outside int32 raises ``TCPreconditionError`` naming the statement.
"""
import re
import warnings

import numpy as np
import pytest

import tcpy

BACKENDS = ["compiled", "reference"]
BIG = 2**31 - 2  # the largest N these tests bind, with a zero-size second dimension (no memory)


def define(source, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        return tcpy.define(source, backend=backend)


# TC's two-stage argmin (its min-distance example): the first def's index output is the second
# def's `int32(D) MinIdx` input.
ARGMIN = """
def argmin_2d(float(D, NBYD) S, float v) -> (MinIdx) {
    MinIdx(d) min=! (S(d, r_nbyd) == v) ? d * NBYD + r_nbyd : NBYD * D
}
def argmin_1d(float(N) S, int32(D) MinIdx) -> (min_idx) {
    min_idx min=! (MinIdx(r_d) < N) ? r_d : N
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_tc_argmin_example_chains_its_int32_index_output(backend):
    lib = define(ARGMIN, backend)
    S = np.random.default_rng(3).permutation(60).astype(np.float32)
    min_idx = lib.argmin_2d(S.reshape(6, 10), S.min())
    assert min_idx.dtype == np.int32 and min_idx.shape == (6,)
    block = lib.argmin_1d(S, min_idx)
    assert block.dtype == np.int32 and block.shape == ()
    assert block == S.argmin() // 10 and min_idx[block] == S.argmin()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rhs, where, expected", [
    ("i", " where i in 0:N", [0, 1, 2, 3, 4]),
    ("N", "", 5),
    ("i * N + A.0 - 1", " where i in 0:N", [4, 9, 14, 19, 24]),
    ("(i - 3) / 2", " where i in 0:N", [-1, -1, 0, 0, 0]),  # values truncate, as in C
])
def test_an_output_defined_from_indices_and_sizes_is_int32(backend, rhs, where, expected):
    lhs = "O(i)" if "i" in where else "O()"
    k = define(f"def f(float(N) A) -> (O) {{ {lhs} = {rhs}{where} }}", backend)
    out = k(np.zeros(5, np.float32))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argmax_index_output_is_int32(backend):
    k = define("def f(float(M, K) A) -> (best, at) { best(m) max=! A(m, k)\n"
               " at(m) max=! A(m, k) == best(m) ? k : -1 }", backend)
    A = np.random.default_rng(1).permutation(24).reshape(4, 6).astype(np.float32)
    best, at = k(A)
    assert at.dtype == np.int32
    np.testing.assert_array_equal(at, A.argmax(axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_values_are_computed_in_64_bits(backend):
    A = np.zeros((BIG, 0), np.float32)
    k = define("def f(float(N, Z) A) -> (O, P, Q) { O(i) = (i * N) / N where i in 0:4\n"
               " P(i) = int64(i * N + N) where i in 0:4\n Q(i) = double(i * N) where i in 0:4 }", backend)
    o, p, q = k(A)
    assert (o.dtype, p.dtype, q.dtype) == (np.int32, np.int64, np.float64)
    np.testing.assert_array_equal(o, [0, 1, 2, 3])
    np.testing.assert_array_equal(p, [BIG, 2 * BIG, 3 * BIG, 4 * BIG])
    np.testing.assert_array_equal(q, [0.0, BIG, 2.0 * BIG, 3.0 * BIG])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stmt, value, values", [
    ("O(i) = i + N where i in 0:4", "i + N", f"{BIG}..{BIG + 3}"),
    ("O(i) = int32(Z) + i * N where i in 0:3", "i * N", f"0..{2 * BIG}"),
    ("O(i) = -N - N + i where i in 0:2", "-N - N + i", f"{-2 * BIG}..{-2 * BIG + 1}"),
    ("O(i) +=! (i * N > 0) ? 1.0 : 0.0 where i in 0:2", "i * N", f"0..{BIG}"),  # fits: no error
])
def test_an_int32_index_result_that_would_overflow_raises(backend, stmt, value, values):
    k = define(f"def f(float(N, Z) A) -> (O) {{ {stmt} }}", backend)
    A = np.zeros((BIG, 0), np.float32)
    if values == f"0..{BIG}":
        np.testing.assert_array_equal(k(A), [0.0, 1.0])
        return
    message = (f"in def 'f', statement 1 (line 1) '{stmt}': with sizes N={BIG}, Z=0, the index value "
               f"'{value}' is int32 (TC's index type) but takes values {values}, outside "
               f"-2147483648..2147483647; write int64({value}) to use the exact value")
    with pytest.raises(tcpy.TCPreconditionError, match=re.escape(message)):
        k(A)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_value_in_a_subscript_is_not_an_int32_result(backend):
    # i * N + j would overflow int32; as a subscript it is exact and in bounds (Z = 0: no read)
    k = define("def f(float(N, Z) A, float(M) B) -> (O) { O(i) +=! A(i * N / N, j) + B(i) }", backend)
    np.testing.assert_array_equal(k(np.zeros((BIG, 0), np.float32), np.ones(3, np.float32)), [0, 0, 0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stmt, value", [
    ("O(i) = int64(i * N * N) where i in 0:4", "i * N * N"),
    ("O(i) = A(i * N * N / N / N) where i in 0:4", "i * N * N"),  # in a subscript
])
def test_an_index_value_beyond_64_bits_raises(backend, stmt, value):
    k = define(f"def f(float(N) A) -> (O) {{ {stmt} }}", backend)
    with pytest.raises(tcpy.TCPreconditionError, match=re.escape(
            f"statement 1 (line 1) '{stmt}': with sizes N={BIG}, the index value '{value}' takes values "
            f"0..{3 * BIG * BIG}, more than 64 bits hold")):
        k.explain((BIG,))  # binds the sizes as a call does, without the memory
