"""Index-set splitting by phase (tcpy.transform.phases): an element-wise statement selecting by
``v % s`` runs in pieces, one per residue, with its selects resolved; against the reference
evaluator."""
import numpy as np
import pytest

import tcpy

INTERLEAVE3 = """
def interleave(int32(N, H3, W3) A, int32(N, H3, W3) B, int32(N, H3, W3) C) -> (X) {
    X(n, h, w) = h % 3 == 0 ? A(n, h / 3, w / 3) + w % 3 : (h % 3 == 1 && n > 0) ? B(n, h / 3, w / 3) : w % 3 == 2 ? C(n, h / 3, w / 3) : -1
        where n in 0:N, h in 0:3 * H3 - 1, w in 0:3 * W3 - 2
}"""

# w is read as itself too: the odd piece reads B at 2*q + 1
MIXED = """
def mixed(float(N, W2) A, float(N, W) B) -> (X) {
    X(n, w) = w % 2 == 0 ? A(n, w / 2) : B(n, w) where n in 0:N, w in 0:W
}"""


def phases(kernel, *args):
    """The phases of each loop nest of ``kernel`` specialised to ``args``."""
    return [nest.schedule.phases for nest in kernel.specialize(*args).ir.nests if nest.schedule is not None]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n, h3, w3", [(2, 3, 4), (3, 5, 1), (1, 1, 7)])
def test_stride_3_pieces_match_the_reference(threads, n, h3, w3):
    """Nine pieces, ranges that end inside a period (the last row and columns of a period have
    no piece), a select on another variable kept in the pieces, ``w % 3`` read as a value."""
    kernel = tcpy.define(INTERLEAVE3, options=tcpy.Options(specialize="always", num_threads=threads))
    rng = np.random.default_rng(n * 100 + h3 * 10 + w3)
    args = [rng.integers(-50, 50, (n, h3, w3)).astype(np.int32) for _ in range(3)]
    assert phases(kernel, *args) == [(("h", 3), ("w", 3))]
    got, want = kernel(*args), tcpy.define(INTERLEAVE3, backend="reference")(*args)
    assert got.dtype == np.int32 and got.shape == (n, 3 * h3 - 1, 3 * w3 - 2)
    np.testing.assert_array_equal(got, want)


def test_the_size_generic_kernel_runs_the_pieces_at_every_size():
    """The pieces' loops over the quotients run over each call's sizes (one build)."""
    kernel = tcpy.define(INTERLEAVE3, options=tcpy.Options(specialize="never", num_threads=2))
    reference = tcpy.define(INTERLEAVE3, backend="reference")
    plan = kernel.explain((2, 3, 4), (2, 3, 4), (2, 3, 4))
    assert "generic kernel: X(n, h, w) = " in plan and "split by phase h mod 3, w mod 3" in plan, plan
    rng = np.random.default_rng(5)
    for n, h3, w3 in [(2, 3, 4), (3, 5, 1), (1, 1, 7), (1, 40, 33), (0, 2, 2), (2, 1, 1)]:
        args = [rng.integers(-50, 50, (n, h3, w3)).astype(np.int32) for _ in range(3)]
        got = kernel(*args)
        assert got.dtype == np.int32 and got.shape == (n, max(3 * h3 - 1, 0), max(3 * w3 - 2, 0))
        np.testing.assert_array_equal(got, reference(*args))


def test_a_variable_also_read_as_itself():
    kernel = tcpy.define(MIXED, options=tcpy.Options(specialize="always"))
    rng = np.random.default_rng(4)
    A, B = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((2, 7)).astype(np.float32)
    assert phases(kernel, A, B) == [(("w", 2),)]
    np.testing.assert_array_equal(kernel(A, B), tcpy.define(MIXED, backend="reference")(A, B))


def test_explain_names_the_split():
    kernel = tcpy.define(INTERLEAVE3, options=tcpy.Options(specialize="always"))
    plan = kernel.explain((2, 3, 4), (2, 3, 4), (2, 3, 4))
    assert "split by phase h mod 3, w mod 3 (one piece per residue, its selects resolved)" in plan


# one split variable, the innermost, of a literal extent (a reshape's read as tinyir lowers it)
RESHAPED = """
def reshaped(float(M, 2) A, float(N, 4) B) -> (X) {
    X(i, j) = A(2 * i + j / 2, j % 2) + B(i, j)
}"""


@pytest.mark.parametrize("specialize", ["never", "always"])
def test_the_innermost_variable_split_leaves_its_quotient_loop_to_simd(specialize):
    """When the only split variable is the innermost, its quotient loop is the SIMD loop, never
    part of the parallel collapse (a generic kernel parallelises its leading loops whatever the
    work: gcc rejected the collapse into the SIMD loop)."""
    kernel = tcpy.define(RESHAPED, options=tcpy.Options(specialize=specialize, num_threads=2))
    reference = tcpy.define(RESHAPED, backend="reference")
    rng = np.random.default_rng(6)
    for m, n in [(4, 2), (9, 3), (40, 17)]:
        A, B = rng.standard_normal((m, 2)).astype(np.float32), rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_array_equal(kernel(A, B), reference(A, B))
