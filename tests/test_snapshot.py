"""A statement that reads its own target sees it as it was before the statement, on every path.

Loop nests compute in place; a statement whose iterations read elements of its target that
other iterations write reads a snapshot taken before it (``tcpy.transform.snapshot``, decided by
isl's dependence analysis). Checked against the reference evaluator and values worked out by
hand, through the loop nests, the contraction engine, fused groups and epilogues, at 1, 2 and
7 threads.
"""
import numpy as np
import pytest

import tcpy
from tcpy.loopir import ContractionNest

BACKENDS = ["compiled", "reference"]
THREADS = [1, 2, 7]


def both(source, *args, threads=2, **options):
    """(compiled result, reference result)."""
    kernel = tcpy.define(source, options=tcpy.Options(num_threads=threads, **options))
    return kernel(*args), tcpy.define(source, backend="reference")(*args)


TRANSPOSE_IN_PLACE = """def f(float(N, N) A) -> (C) {
    C(i, j) = A(i, j)
    C(j, i) = C(i, j) + 1
}"""


@pytest.mark.parametrize("threads", THREADS)
def test_a_transpose_into_itself_reads_the_old_values(threads):
    """Issue 34, item 1: computed in place, the second statement read elements it had already
    transposed: [[1,4,7],[5,5,8],[8,9,9]] instead of [[1,4,7],[2,5,8],[3,6,9]]; at 512 x 512
    with threads, 130,806 elements were wrong."""
    A = np.arange(9, dtype=np.float32).reshape(3, 3)
    got, want = both(TRANSPOSE_IN_PLACE, A, threads=threads)
    np.testing.assert_array_equal(want, [[1, 4, 7], [2, 5, 8], [3, 6, 9]])
    np.testing.assert_array_equal(got, want)
    A = np.random.default_rng(threads).standard_normal((512, 512)).astype(np.float32)
    got = tcpy.define(TRANSPOSE_IN_PLACE, options=tcpy.Options(num_threads=threads))(A)
    np.testing.assert_array_equal(got, A.T + 1)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("n", [5, 300])
def test_a_reversal_into_itself_reads_the_old_values(n, threads):
    """``C(i) = C(N - 1 - i)`` gave [4,3,2,1,4] for [0,1,2,3,4]."""
    source = "def f(float(N) A) -> (C) {\n C(i) = A(i)\n C(i) = C(N - 1 - i)\n}"
    A = np.arange(n, dtype=np.float32)
    got, want = both(source, A, threads=threads)
    np.testing.assert_array_equal(want, A[::-1])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("threads", THREADS)
def test_a_reduction_reading_its_target_sees_it_before_the_statement(threads):
    """``C(i) += C(i) * A(i, k)`` adds C's old value times the row sum (in place, each k saw the
    sum of the ones before it); a ``!`` reduction reads the identity it starts from (0 for +,
    -inf for max), also where its accumulators stay in registers."""
    rng = np.random.default_rng(0)
    A = rng.integers(-3, 4, (37, 19)).astype(np.float64)
    source = """def f(double(M, K) A) -> (C, D, E) {
        C(i) +=! A(i, k)
        C(i) += C(i) * A(i, k)
        D(i) = A(i, 0)
        D(i) +=! D(i) + A(i, k)
        E(i) = A(i, 1)
        E(i) max=! max(E(i), A(i, k) - 100.0)
    }"""
    (c, d, e), want = both(source, A, threads=threads)
    for got, ref in zip((c, d, e), want):
        np.testing.assert_array_equal(got, ref)
    rows = A.sum(1)
    np.testing.assert_array_equal(c, rows + rows * rows)
    np.testing.assert_array_equal(d, rows)  # D(i) reads the fill (0), not D's old values
    np.testing.assert_array_equal(e, A.max(1) - 100)  # E(i) reads -inf, not A(i, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reduction_with_no_reduction_variable_is_an_assignment(backend):
    """``C(i) +=! C(i) + 1`` has no reduction variable: it is ``C(i) = C(i) + 1`` (TC), and
    reads C's old values, not an identity fill (the reference filled first)."""
    source = "def f(float(N) A) -> (C, D) {\n C(i) = A(i)\n C(i) +=! C(i) + 1\n D(i) = A(i)\n D(i) max=! D(3 - i)\n}"
    c, d = tcpy.define(source, backend=backend)(np.arange(1, 5, dtype=np.float32))
    np.testing.assert_array_equal(c, [2, 3, 4, 5])
    np.testing.assert_array_equal(d, [4, 3, 2, 1])


@pytest.mark.parametrize("threads", THREADS)
def test_a_contraction_reading_its_target_runs_in_the_engine_on_the_snapshot(threads):
    """``C += A C`` (C's old value on the right) through the contraction engine."""
    source = """def f(double(N, N) A, double(N, N) B) -> (C) {
        C(i, j) = B(i, j)
        C(m, n) += A(m, k) * C(k, n)
    }"""
    rng = np.random.default_rng(threads)
    A, B = rng.standard_normal((67, 67)), rng.standard_normal((67, 67))
    kernel = tcpy.define(source, options=tcpy.Options(num_threads=threads))
    assert any(isinstance(n.body[0], ContractionNest) for n in kernel.specialize(A, B).ir.nests if n.body)
    got, want = kernel(A, B), tcpy.define(source, backend="reference")(A, B)
    np.testing.assert_allclose(got, B + A @ B, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", THREADS)
def test_fused_rows_and_epilogues_reading_their_target_elsewhere(threads):
    """A row statement reading its target reversed inside a fusable group, and an element-wise
    consumer of a contraction that reads the contraction's output transposed (not at the element
    it writes: no epilogue may see half-stored tiles)."""
    source = """def f(float(N, N) A, float(N, N) B) -> (S, C) {
        T(i, j) = A(i, j) * 2.0
        T(i, j) = T(i, N - 1 - j) + 1.0
        S(i) +=! T(i, j) * A(i, j)
        C(m, n) +=! A(m, k) * B(k, n)
        C(m, n) = C(n, m) + C(m, n)
    }"""
    rng = np.random.default_rng(threads)
    A, B = (rng.integers(-2, 3, (64, 64)).astype(np.float32) for _ in range(2))
    (s, c), (s_ref, c_ref) = both(source, A, B, threads=threads)
    T = (A * 2)[:, ::-1] + 1
    np.testing.assert_allclose(s_ref, (T * A).sum(1), rtol=1e-6)
    np.testing.assert_allclose(c_ref, A @ B + (A @ B).T, rtol=1e-6)
    np.testing.assert_allclose(s, s_ref, rtol=1e-6)
    np.testing.assert_allclose(c, c_ref, rtol=1e-6)


def test_reads_at_the_element_written_take_no_snapshot():
    """``C(i, j) = C(i, j) * 2`` and ``C(i) += C(i)`` read only what the same iteration writes:
    computed in place, no copy of C."""
    source = """def f(float(N, N) A) -> (C, D) {
        C(i, j) = A(i, j)
        C(i, j) = C(i, j) * 2.0 + A(j, i)
        D(i) = A(i, i)
        D(i) += D(i)
    }"""
    kernel = tcpy.define(source)
    A = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert kernel.specialize(A).ir.program.copies == ()
    c, d = kernel(A)
    np.testing.assert_array_equal(c, A * 2 + A.T)
    np.testing.assert_array_equal(d, np.diag(A) * 2)


@pytest.mark.parametrize("threads", THREADS)
def test_data_dependent_reads_of_the_target_take_the_snapshot(threads):
    """``C(i) = C(P(i))``: isl cannot see where ``P`` points, so the read takes the snapshot."""
    source = "def f(float(N) A, int32(N) P) -> (C) {\n C(i) = A(i)\n C(i) = C(P(i)) * 10.0 + C(i)\n}"
    A = np.arange(6, dtype=np.float32)
    P = np.array([5, 0, 1, 2, 3, 4], np.int32)
    got, want = both(source, A, P, threads=threads)
    np.testing.assert_array_equal(want, A[P] * 10 + A)
    np.testing.assert_array_equal(got, want)
