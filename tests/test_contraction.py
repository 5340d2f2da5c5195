"""The contraction engine: recognition (roles, affine accesses), planning per Target, and
differential tests of the generated code against the reference evaluator.

The random contractions draw 0-1 batch, 0-2 M, 0-2 N and 1-2 K variables, lay each operand's
dimensions out in a random order (transposes), with strided (``2*v``), offset (``v+1``) and
convolution-window (``m + k``) indices, extents among 1, primes and multiples of the
micro-tile +- 1, an optional scale (a float32 literal, also inexact ones such as 0.1 in double;
negation; a rank-0 tensor), an optional second
``+=`` contraction into the same output, float32 and float64, at 1, 2 and 7 threads, for every
preset this CPU runs. Half of the examples use the preset with tiny caches, so that small
shapes run the packed path with many kc / mc / nc blocks, edge slivers and split K.
"""
import dataclasses
import itertools
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy import demo
from tcpy.loopir import ContractionNest
from tcpy.loopnest import build_program
from tcpy.target import PRESETS, Target
from tcpy.transform.contraction import cell_cost, micro_tile, plan
from tcpy.transform.recognition import recognize

EXAMPLES = int(os.environ.get("TCPY_CONTRACTION_EXAMPLES", "30"))
RUNNABLE = [name for name in PRESETS if name.startswith("x86") and Target.preset(name).can_run_here()]
if Target.host().arch == "x86_64":
    RUNNABLE.append("host")
EPS = {"float": 2.0**-23, "double": 2.0**-52}
EXTENTS = (1, 2, 3, 5, 7, 13, 5, 6, 7, 11, 12, 13, 15, 16, 17, 23, 31, 32, 33)


def tiny_caches(target: Target) -> Target:
    """The same ISA with caches small enough that the packed path blocks a 40-wide GEMM."""
    return dataclasses.replace(target, name=target.name + "-tiny", l1d=1024, l2=6144, l3=24576, l3_sharing=1)


def statement(src: str, *shapes):
    """(let-inlined statement, its ranges, the program) of the first statement of ``src``."""
    kernel = tcpy.define(src)
    sizes = kernel._sizes(shapes, {})
    program = build_program(kernel.def_, kernel.ranges.bind(sizes), kernel.types)
    st_ = program.statements[0]
    return st_.stmt, st_.ranges, program


def recognized(src: str, *shapes):
    stmt, ranges, program = statement(src, *shapes)
    return recognize(stmt, ranges, program.shapes, program.types, program.sizes)


# ----------------------------------------------------------------------------- recognition


def test_gemm_roles_and_strides():
    con = recognized("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                     (5, 7), (7, 3))
    assert [g.vars for g in con.m] == [("m",)] and [g.vars for g in con.n] == [("n",)]
    assert [g.vars for g in con.k] == [("k",)] and con.batch == ()
    assert (con.a.tensor, con.b.tensor, con.c.tensor) == ("A", "B", "C")
    assert con.a.stride("m") == 7 and con.a.stride("k") == 1
    assert con.b.stride("k") == 3 and con.b.stride("n") == 1
    assert con.sizes == (1, 5, 3, 7) and con.init and con.alpha == 1.0
    assert "M m = 5" in con.describe()


def test_batched_transposed_and_scaled():
    con = recognized("def f(double(B,I,K) X, double(B,J,K) Y, double s) -> (Z) "
                     "{ Z(b,i,j) +=! -2 * s * X(b,i,k) * Y(b,j,k) }", (2, 3, 4), (2, 5, 4), ())
    assert [g.vars for g in con.batch] == [("b",)]
    assert con.alpha == -2.0 and con.alpha_tensors == ("s",)
    assert con.b.tensor == "Y" and con.b.stride("n" if False else "j") == 4


@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("shape", [(2, 3, 2), (67, 45, 53)])
def test_a_float_literal_scales_a_double_contraction_as_float32(shape, threads):
    """A float literal is float32 in TC: ``0.1 * A * B`` on doubles scales by (double)0.1f in
    the engine too, as in the loop path and the reference (the engine scaled by the double 0.1,
    0.30000000000000004 where they give 0.30000000447034836)."""
    src = "def f(double(M,K) A, double(K,N) B) -> (C) { C(m,n) +=! 0.1 * A(m,k) * B(k,n) }"
    m, k, n = shape
    assert recognized(src, (m, k), (k, n)).alpha == float(np.float32(0.1))
    rng = np.random.default_rng(1)
    A, B = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    want = tcpy.define(src, backend="reference")(A, B)
    for options in ({"num_threads": threads}, {"contraction": False, "num_threads": threads}):
        got = tcpy.define(src, options=tcpy.Options(**options))(A, B)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15 * k)
    ones = tcpy.define(src, options=tcpy.Options(num_threads=threads))(np.ones((2, 3)), np.ones((3, 2)))
    np.testing.assert_allclose(ones, 3 * float(np.float32(0.1)), rtol=1e-15)


@pytest.mark.parametrize("rhs, alpha", [
    ("A(m,k) * B(k,n) / 8", 0.125),
    ("A(m,k) / 4.0 * -B(k,n)", -0.25),
    ("A(m,k) * (B(k,n) / double(2))", 0.5),
    ("A(m,k) * B(k,n) / 3", 1 / 3),
])
def test_a_literal_divisor_scales_alpha(rhs, alpha):
    src = f"def f(double(M,K) A, double(K,N) B) -> (C) {{ C(m,n) +=! {rhs} }}"
    assert recognized(src, (5, 7), (7, 3)).alpha == pytest.approx(alpha, rel=1e-15)
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((37, 29)), rng.standard_normal((29, 41))
    np.testing.assert_allclose(tcpy.define(src)(A, B), tcpy.define(src, backend="reference")(A, B), rtol=1e-12)


def test_a_zero_literal_divisor_is_not_the_engines():
    src = "def f(double(M,K) A, double(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) / 0.0 }"
    assert recognized(src, (5, 7), (7, 3)) is None


SCALED_PRODUCTS = [
    # (def, shapes): factors and divisors that read no reduction variable scale the result
    ("def f(T(B,L,S) P, T(B,S,E) V, T(B,L) l) -> (O) { O(b,t,e) +=! P(b,t,s) * V(b,s,e) / l(b,t) }",
     [(2, 37, 29), (2, 29, 19), (2, 37)]),
    ("def f(T(M,K) A, T(K,N) B, T(M) l) -> (C) { C(m,n) +=! A(m,k) / l(m) * B(k,n) }", [(37, 29), (29, 41), (37,)]),
    ("def f(T(M,K) A, T(K,N) B, T(N) s) -> (C) { C(m,n) +=! A(m,k) * B(k,n) * s(n) / sqrt(T(K)) }",
     [(37, 29), (29, 41), (41,)]),
    ("def f(T(M,K) A, T(K,N) B, T r) -> (C) { C(m,n) +=! -(A(m,k) * B(k,n)) / (r * T(m + 1)) }",
     [(37, 29), (29, 41), ()]),
    ("def f(T(M,K) A, T(K,N) B, T(M,N) w) -> (C) { C(m,n) +=! 2 * w(m,n) * A(m,k) * B(k,n) / 8 }",
     [(37, 29), (29, 41), (37, 41)]),
]


@pytest.mark.parametrize("scalar", ["float", "double"])
@pytest.mark.parametrize("src, shapes", SCALED_PRODUCTS)
def test_a_product_scaled_per_output_element_runs_through_the_engine(src, shapes, scalar):
    """The product goes through the engine and the scaling into its store (an epilogue), with
    the results of the statement as written."""
    src = src.replace("T(", f"{scalar}(").replace("T r", f"{scalar} r")
    dtype = np.float32 if scalar == "float" else np.float64
    rng = np.random.default_rng(3)
    args = [rng.uniform(0.5, 2.0, s).astype(dtype) for s in shapes]
    want = tcpy.define(src, backend="reference")(*args)
    for threads in (1, 2):
        kernel = tcpy.define(src, options=tcpy.Options(target="x86-64-v3", num_threads=threads))
        ir = kernel.loop_ir(*args, after="epilogues")
        assert re.search(r"S0 \(statement 0\): \w+\([^)]*\) \+=! .*\n  engine:", ir), ir
        assert "epilogue of S0: S1" in ir
        got = kernel(*args)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-5 if scalar == "float" else 1e-12)


@pytest.mark.parametrize("src", [
    # accumulating into earlier values: the scale must not apply to them
    "def f(float(M,K) A, float(K,N) B, float(M) l) -> (C) { C(m,n) = l(m) + B(0,n)\n C(m,n) += A(m,k) * B(k,n) / l(m) }",
    # the divisor reads the reduction variable: a term's factor, not the result's
    "def f(float(M,K) A, float(K,N) B, float(K) l) -> (C) { C(m,n) +=! A(m,k) * B(k,n) / l(k) }",
])
def test_scales_that_are_not_the_results_keep_the_loops(src):
    rng = np.random.default_rng(4)
    args = [rng.uniform(0.5, 2.0, s).astype(np.float32) for s in [(13, 11), (11, 17), (13 if "l(m)" in src else 11,)]]
    kernel = tcpy.define(src, options=tcpy.Options(target="x86-64-v3"))
    assert "epilogue" not in kernel.loop_ir(*args, after="epilogues")
    np.testing.assert_allclose(kernel(*args), tcpy.define(src, backend="reference")(*args), rtol=1e-5)


def test_operands_swap_so_the_output_contiguous_variable_is_n():
    con = recognized("def f(float(K,N) B, float(M,K) A) -> (C) { C(m,n) +=! B(k,n) * A(m,k) }",
                     (7, 3), (5, 7))
    assert con.a.tensor == "A" and con.b.tensor == "B"


def test_contiguous_multi_variable_roles_merge():
    con = recognized("def f(float(N,C,H,W) X, float(F,C,H,W) Wt) -> (O) "
                     "{ O(n,f) +=! X(n,c,h,w) * Wt(f,c,h,w) }", (2, 3, 4, 5), (6, 3, 4, 5))
    assert [g.vars for g in con.k] == [("c", "h", "w")] and con.k[0].extent == 60


def test_convolution_windows_are_affine_offsets_and_strides():
    con = recognized("def f(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) "
                     "{ O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }", (2, 2, 6, 6), (3, 2, 3, 3))
    assert con is not None
    assert {v for g in con.n for v in g.vars} == {"n", "h", "w"}  # the output's contiguous side
    assert {v for g in con.k for v in g.vars} == {"c", "kh", "kw"}
    assert con.b.stride("kh") == 6 and con.b.stride("h") == 6


def test_variables_of_one_value_take_no_role():
    # N = 1 and a 1x1 window: the contraction is a plain GEMM (one N group, one K group), with
    # the single values' offsets in the accesses
    con = recognized("def f(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) "
                     "{ O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }", (1, 4, 5, 5), (3, 4, 1, 1))
    assert [g.vars for g in con.n] == [("h", "w")] and [g.vars for g in con.k] == [("c",)]
    assert [g.vars for g in con.m] == [("f",)] and con.batch == ()


def test_offset_ranges_fold_into_the_offset():
    con = recognized("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k+1) * B(k,n) "
                     "where k in 0:K-1 }", (4, 6), (6, 3))
    assert con is not None and con.a.offset == 1 and con.size("k") == 5


@pytest.mark.parametrize("src, shapes", [
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) max=! A(m,k) * B(k,n) }", ((4, 5), (5, 3))),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) + B(k,n) }", ((4, 5), (5, 3))),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! exp(A(m,k)) * B(k,n) }", ((4, 5), (5, 3))),
    ("def f(float(M,K) A, float(K) B) -> (C) { C(m) +=! A(m,k) * B(k) * A(m,k) }", ((4, 5), (5,))),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) = A(m,n) * B(m,n) }", ((4, 4), (4, 4))),
    ("def f(float(M) A, float(N) B) -> (C) { C(m,n) +=! A(m) * B(n) }", ((4,), (5,))),
    ("def f(float(M,K) A, float(K) B) -> (C) { C(m,n) +=! A(m,k) * B(k) where n in 0:3 }", ((4, 5), (5,))),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) * A(m,k) }", ((4, 5), (5, 3))),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k/2) * B(k,n) where k in 0:4 }",
     ((4, 5), (5, 3))),
    ("def f(int32(M,K) A, int32(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }", ((4, 5), (5, 3))),
    ("def f(half(M,K) A, half(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }", ((4, 5), (5, 3))),
    ("def f(float(M,K) A, float(K) B) -> (C) { C(m) +=! A(m,k) * B(k) * B(m) }", ((5, 5), (5,))),
    ("def f(float(M,K) A, int32(K) L) -> (C) { C(m) +=! A(m,k) * A(m, L(k)) }", ((4, 5), (5,))),
])
def test_what_is_not_a_contraction(src, shapes):
    assert recognized(src, *shapes) is None


def test_gemv_and_dot_are_contractions():
    assert recognized("def f(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }", (4, 5), (5,))
    dot = recognized("def f(float(K) a, float(K) b) -> (s) { s +=! a(k) * b(k) }", (5,), (5,))
    assert dot is not None and dot.m == () and dot.n == ()


def test_the_engine_is_an_option():
    src = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    on = tcpy.define(src).specialize((40, 30), (30, 20)).ir
    off = tcpy.define(src, options=tcpy.Options(contraction=False)).specialize((40, 30), (30, 20)).ir
    assert isinstance(on.nests[0].body[0], ContractionNest)
    assert not any(isinstance(n.body[0], ContractionNest) for n in off.nests if n.body)


# ----------------------------------------------------------------------------- planning


def test_micro_tiles_fit_each_register_file():
    assert micro_tile(Target.preset("x86-64-v3"), 4) == (6, 2)  # 6 x 16 floats
    assert micro_tile(Target.preset("x86-64-v4"), 4) == (8, 3)  # at most 8 rows: 8 x 48 floats
    # N's extent: 64 columns fit one 6 x 64 tile (8 x 48 tiles would compute 96); 784 fit 8 x 48
    v4 = Target.preset("x86-64-v4")
    assert micro_tile(v4, 4, 64) == (6, 4) and micro_tile(v4, 4, 784) == (8, 3)
    assert micro_tile(v4, 4, 25) == (8, 2)  # 32 columns computed, not 48
    assert (plan(_gemm(512, 64, 512), v4, 1).mr, plan(_gemm(512, 64, 512), v4, 1).nr) == (6, 64)
    for name in PRESETS:
        t = Target.preset(name)
        for size, n in ((4, None), (8, None), (4, 64), (8, 49)):
            mr, nv = micro_tile(t, size, n)
            assert mr * nv + nv + 1 <= t.vector_registers
            assert mr + nv <= mr * nv


def _gemm(m, n, k, dtype="float"):
    return recognized(f"def f({dtype}(M,K) A, {dtype}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}",
                      (m, k), (k, n))


@pytest.mark.parametrize("name", PRESETS)
def test_blocks_follow_the_footprint_model(name):
    t = Target.preset(name)
    for dtype, s in (("float", 4), ("double", 8)):
        p = plan(_gemm(2048, 2048, 2048, dtype), t, 1)
        assert p.path == "packed" and p.grid == (1, 1, 1, 1)
        ways = t.l1d_ways - 1 - max(1, int((t.l1d_ways - 1) / (1 + p.nr / p.mr)))  # Low et al.
        assert p.kc * p.nr * s <= t.l1d * ways // t.l1d_ways and ways < t.l1d_ways - 1
        assert p.mc * p.kc * s <= t.l2 // 2 and p.mc % p.mr == 0
        assert p.kc * p.nc * s <= t.l3_per_core // 2 and p.nc % p.nr == 0
        assert p.nr == p.nr_vectors * t.lanes(s)
        assert "kc" in " ".join(p.reasons)


@pytest.mark.parametrize("name", PRESETS)
def test_a_short_k_runs_in_one_block_when_the_output_is_beyond_l2(name):
    t = Target.preset(name)
    kc = plan(_gemm(2048, 2048, 4096), t, 1).kc
    k = kc * 13 // 10
    assert plan(_gemm(2048, 2048, k), t, 1).kc >= k  # a second block: another pass over 16 MiB
    assert plan(_gemm(2048, 2048, 3 * kc), t, 1).kc < 3 * kc
    assert plan(_gemm(48, 48, k), t, 1).kc < k  # the output stays in L2


def test_small_shapes_take_the_small_path():
    t = Target.preset("x86-64-v3")
    assert plan(_gemm(64, 64, 64), t, 1).path == "small"
    assert plan(_gemm(128, 128, 128), t, 1).path == "small"
    assert plan(_gemm(512, 512, 512), t, 1).path == "packed"


@pytest.mark.parametrize("threads", [2, 3, 7, 16, 64, 128])
def test_thread_grids_use_the_threads_and_balance(threads):
    """Simulated large machines: the grid fills the threads where the work allows it."""
    t = Target.preset("x86-64-v4").with_cores(threads)
    for m, n, k in ((2048, 2048, 2048), (4096, 64, 512), (1024, 1024, 64)):
        p = plan(_gemm(m, n, k), t, threads)
        assert math.prod(p.grid) <= threads
        assert math.prod(p.grid) >= min(threads, 2) * 3 // 4 or threads == 3
    # a small output with a long reduction splits K when the threads outnumber its micro-tiles
    p = plan(_gemm(128, 128, 8192), t, threads)
    tiles = -(-128 // p.mr) * -(-128 // p.nr)
    assert math.prod(p.grid) <= threads and (threads <= tiles or p.grid[3] > 1)
    assert math.prod(p.grid) >= min(threads, tiles) // 2


def test_cost_model_prefers_splitting_the_longer_side():
    t = Target.preset("x86-64-v3")
    con = _gemm(4096, 64, 512)
    p = plan(con, t, 2)
    assert p.grid[1] == 2  # M is the long side
    assert cell_cost(con, "packed", p.mr, p.nr, p.nc, p.lanes, (1, 2, 1, 1), 2) < \
        cell_cost(con, "packed", p.mr, p.nr, p.nc, p.lanes, (1, 1, 1, 1), 2)


@settings(max_examples=300, deadline=None, database=None)
@given(sizes=st.tuples(st.sampled_from([1, 2, 3, 4, 8, 64]), st.integers(1, 3000), st.integers(1, 3000),
                       st.integers(1, 5000)),
       path=st.sampled_from(["packed", "stream", "small", "direct"]), mr=st.sampled_from([1, 6, 8, 14]),
       nr=st.sampled_from([16, 48, 64]), kc=st.sampled_from([16, 256]), nc_slivers=st.sampled_from([1, 4, 64]),
       threads=st.sampled_from([1, 2, 3, 7, 8, 24, 64, 128, 256]), b_in_kernel=st.booleans(),
       spawn=st.sampled_from([0.0, 10000.0]), block_rows=st.sampled_from([None, 7]))
def test_grid_search_is_the_exhaustive_one(sizes, path, mr, nr, kc, nc_slivers, threads, b_in_kernel, spawn,
                                           block_rows):
    """The planner's thread grid (its array pre-pass at many threads included; with
    ``block_rows``, its candidates weighed in arrays of at most that many, as at thread counts
    far beyond a machine's) is the one an exhaustive search with cell_cost and the planner's
    tie-breaks finds: least rounded estimate, then no split K, more cells, fewer rows of M, the
    first in lexicographic order."""
    from types import SimpleNamespace
    from tcpy.target import DEFAULT_COST_MODEL
    from tcpy.transform import contraction
    con, cost, nc = SimpleNamespace(sizes=sizes), dataclasses.replace(DEFAULT_COST_MODEL, spawn=spawn), nc_slivers * nr
    batch, M, N, K = sizes
    limits = (batch, -(-M // mr), -(-N // nr), max(1, K // (2 * kc)) if path == "packed" else 1)
    best = None
    for grid in itertools.product(*(range(1, min(limit, threads) + 1) for limit in limits)):
        if math.prod(grid) <= max(1, threads):
            estimate = cell_cost(con, path, mr, nr, nc, 16, grid, threads, cost, b_in_kernel)
            key = (round(estimate, 6), grid[3], -math.prod(grid), grid[1])
            best = (key, grid) if best is None or key < best[0] else best
    saved = contraction.GRID_BLOCK_ROWS
    contraction._grids.cache_clear()
    try:
        contraction.GRID_BLOCK_ROWS = block_rows or saved
        assert contraction._grid(con, path, mr, nr, kc, 1, nc, 16, threads, cost, b_in_kernel) == best[1]
    finally:
        contraction.GRID_BLOCK_ROWS = saved
        contraction._grids.cache_clear()


def test_explain_names_roles_path_and_blocks():
    k = tcpy.define("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                    options=tcpy.Options(target="x86-64-v3"))
    text = k.explain((600, 500), (500, 400))
    assert "contraction engine" in text and "M m = 600" in text and "packed path" in text
    assert "micro-tile 6x16" in text and "why: kc" in text and "why: mc" in text


def test_no_isa_numbers_outside_the_target():
    # the sources (the renderer and the planner run compiled: no source through inspect)
    package = Path(tcpy.__file__).parent
    renderer = sorted((package / "codegen" / "contraction").glob("*.py"))
    assert len(renderer) > 10
    planner = [package / name for name in ("transform/contraction.py", "transform/winograd.py", "contraction_ir.py",
                                           "transform/recognition.py")]
    for path in (*renderer, *planner):
        found = re.findall(r"\b(avx\w*|sse\w*|neon|512|256|128)\b", path.read_text(), re.IGNORECASE)
        assert not found, (path.name, found)


def test_the_cache_line_comes_from_the_target():
    # a 128-byte line: the spilled tile is aligned to it, B's rows are prefetched a line apart,
    # and the product is unchanged
    wide = dataclasses.replace(Target.preset("x86-64-v3"), cache_line=128)
    src = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((37, 50), np.float32), rng.standard_normal((50, 45), np.float32)
    narrow = tcpy.define(src, options=tcpy.Options(target="x86-64-v3")).c_source(a, b)
    kernel = tcpy.define(src, options=tcpy.Options(target=wide, num_threads=1))
    text = kernel.c_source(a, b)
    assert "aligned(64)" in narrow and "aligned(128)" not in narrow
    assert "aligned(128)" in text and "aligned(64)" not in text
    if wide.can_run_here():
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-5, atol=1e-4)


def test_cost_models_follow_the_isa_family_not_the_name(monkeypatch):
    families = {name: Target.preset(name).isa_family for name in ("x86-64", "x86-64-v3", "x86-64-v4", "aarch64")}
    assert families == {"x86-64": "SSE2", "x86-64-v3": "AVX2", "x86-64-v4": "AVX-512", "aarch64": "NEON"}
    # a host named after its microarchitecture takes its family's constants; a family measured
    # on no machine takes the default
    measured = dataclasses.replace(tcpy.target.DEFAULT_COST_MODEL, winograd_input=1.5)
    monkeypatch.setattr(tcpy.target, "COST_MODELS", {"AVX-512": measured})
    zen5 = dataclasses.replace(Target.preset("x86-64-v4"), name="zen5")
    assert zen5.cost is measured and Target.preset("x86-64-v4").cost is measured
    assert Target.preset("x86-64-v3").cost is tcpy.target.DEFAULT_COST_MODEL
    # AVX-512 features with 32-byte vectors build AVX2 kernels
    assert dataclasses.replace(zen5, vector_bytes=32).isa_family == "AVX2"
    assert "AVX-512" in zen5.describe()


def test_host_cache_line_read_from_sysfs(tmp_path):
    from tcpy.target import _sysfs_l1d_geometry
    for index, (level, kind, line) in enumerate([(1, "Instruction", 32), (1, "Data", 128), (2, "Unified", 64)]):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        for name, value in (("level", level), ("type", kind), ("coherency_line_size", line),
                            ("ways_of_associativity", 12)):
            (entry / name).write_text(f"{value}\n")
    assert _sysfs_l1d_geometry(tmp_path) == (12, 128)
    (tmp_path / "index1" / "coherency_line_size").unlink()
    assert _sysfs_l1d_geometry(tmp_path) == (12, 0)  # missing: the host gets 64
    assert {Target.preset(name).cache_line for name in PRESETS} == {64}


# ----------------------------------------------------------------------------- differential


@dataclasses.dataclass
class Case:
    source: str
    args: list
    k_len: int
    scale: float
    options: dict
    dtype: str

    def __repr__(self):
        shapes = [getattr(a, "shape", a) for a in self.args]
        return f"Case({self.source!r}, shapes={shapes}, options={self.options})"


@st.composite
def contractions(draw):
    dtype = draw(st.sampled_from(["float", "double"]))
    counts = {"b": draw(st.integers(0, 1)), "m": draw(st.integers(0, 2)), "n": draw(st.integers(0, 2)),
              "k": draw(st.integers(1, 2))}
    names = {r: [f"{r}{i}" for i in range(c)] for r, c in counts.items()}
    extent = {v: draw(st.sampled_from(EXTENTS)) for vs in names.values() for v in vs}
    # keep the reference's materialised domains small
    while math.prod(extent.values()) > 60000:
        v = max(extent, key=extent.get)
        extent[v] = max(1, extent[v] // 2)
    window = None
    if names["m"] and draw(st.booleans()) and draw(st.booleans()):
        window = (names["m"][0], names["k"][0])  # A indexes m0 + k0; B reads k0 alone

    k = names["k"]

    def operand(tensor, vars_, windowed):
        dims, shape = [], []
        order = draw(st.permutations(vars_))
        for v in order:
            if windowed and v == window[1]:
                continue
            if windowed and v == window[0]:
                dims.append(f"{v} + {window[1]}")
                shape.append(extent[v] + extent[window[1]] - 1)
                continue
            form = draw(st.sampled_from(["plain", "plain", "plain", "stride", "offset"]))
            if form == "offset" and v not in k:  # output indices must start at 0
                form = "plain"
            if form == "stride":
                dims.append(f"2*{v}")
                shape.append(2 * extent[v] - 1 + draw(st.integers(0, 1)))
            elif form == "offset":
                dims.append(f"{v} + 1")
                shape.append(extent[v] + 1)
            else:
                dims.append(v)
                shape.append(extent[v])
        return tensor, dims, shape

    b, m, n, k = names["b"], names["m"], names["n"], names["k"]
    ops = [operand("A", b + m + k, window is not None), operand("B", b + n + k, False)]
    if draw(st.booleans()):
        ops.reverse()
    out = draw(st.permutations(b + m + n))
    # scale
    scale_form = draw(st.sampled_from(["", "", "", "lit", "neg", "tensor"]))
    cast = dtype == "double" and draw(st.integers(0, 3)) == 0  # a float operand cast to double
    params, args, factors = [], [], []
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    np_dtype = np.float32 if dtype == "float" else np.float64
    for tensor, dims, shape in ops:
        t_dtype = "float" if (cast and tensor == "A") else dtype
        sizes = [f"{tensor}{d}" for d in range(len(shape))]
        params.append(f"{t_dtype}({', '.join(sizes)}) {tensor}" if shape else f"{t_dtype} {tensor}")
        arr = rng.uniform(-1, 1, shape).astype(np.float32 if t_dtype == "float" else np.float64)
        if arr.ndim >= 1 and draw(st.integers(0, 4)) == 0:  # a non-contiguous argument
            big = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1],), arr.dtype)
            big[..., ::2] = arr
            arr = big[..., ::2]
        args.append(arr)
        access = f"{tensor}({', '.join(dims)})" if dims else tensor
        factors.append(f"{dtype}({access})" if t_dtype != dtype else access)
    rhs = " * ".join(factors)
    scale = 1.0
    if scale_form == "lit":  # float32 literals: 0.1 scales a double contraction by (double)0.1f
        literal = draw(st.sampled_from(["0.5", "0.1", "0.17677669"]))
        rhs, scale = f"{literal} * {rhs}", float(literal)
    elif scale_form == "neg":
        rhs = f"-{rhs}" if draw(st.booleans()) else f"-({rhs})"
    elif scale_form == "tensor":
        params.append(f"{dtype} s")
        args.append(np_dtype(1.5))
        rhs, scale = f"s * {rhs}", 1.5
    lhs = f"C({', '.join(out)})" if out else "C"
    body = f"    {lhs} +=! {rhs}\n"
    k_len = math.prod(extent[v] for v in k)
    if out and draw(st.integers(0, 3)) == 0:  # a second contraction accumulating into C
        extra = [f"q{i}" for i in range(draw(st.integers(1, 2)))]
        extent.update((v, draw(st.sampled_from(EXTENTS[:12]))) for v in extra)
        d_vars = draw(st.permutations(b + m + extra))
        e_vars = draw(st.permutations(b + n + extra))
        for tensor, vars_ in (("D", d_vars), ("E", e_vars)):
            shape = [extent[v] for v in vars_]
            sizes = [f"{tensor}{d}" for d in range(len(shape))]
            params.append(f"{dtype}({', '.join(sizes)}) {tensor}")
            args.append(rng.uniform(-1, 1, shape).astype(np_dtype))
        body += f"    {lhs} += D({', '.join(d_vars)}) * E({', '.join(e_vars)})\n"
        k_len += math.prod(extent[v] for v in extra)
    source = f"def f({', '.join(params)}) -> (C) {{\n{body}}}\n"
    target = draw(st.sampled_from(RUNNABLE))
    tiny = draw(st.booleans())
    options = {"num_threads": draw(st.sampled_from([1, 2, 7])),
               "target": tiny_caches(Target.preset(target)) if tiny else target}
    return Case(source, args, k_len, scale, options, dtype)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=contractions())
def test_random_contractions_match_the_reference(case):
    kernel = tcpy.define(case.source, options=tcpy.Options(**case.options))
    nests = kernel.specialize(*case.args).ir.nests
    assert any(n.body and isinstance(n.body[0], ContractionNest) for n in nests), kernel.loop_ir(*case.args)
    got = kernel(*case.args)
    want = tcpy.define(case.source, backend="reference")(*case.args)
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = EPS[case.dtype]
    bound = 8 * eps * (case.k_len + 1) * case.k_len * abs(case.scale) + 1e-300
    np.testing.assert_allclose(got, want, rtol=8 * eps * (case.k_len + 1), atol=bound)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_gemm_edges_around_the_micro_tile(target, threads):
    """M and N at multiples of the micro-tile +- 1, K across several kc blocks, on the packed
    path (tiny caches) and the small path, at each thread count."""
    t = Target.preset(target)
    mr, nv = micro_tile(t, 4)
    nr = nv * t.lanes(4)
    src = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    rng = np.random.default_rng(threads)
    paths = set()
    for tt, (m, n, k) in ((t, (2 * mr + 1, 2 * nr - 1, 37)), (tiny_caches(t), (2 * mr + 1, 2 * nr - 1, 37)),
                          (tiny_caches(t), (20 * mr - 1, nr + 1, 37)), (tiny_caches(t), (3 * mr + 1, 12 * nr + 1, 37))):
        kernel = tcpy.define(src, options=tcpy.Options(target=tt, num_threads=threads))
        A = rng.standard_normal((m, k), dtype=np.float32)
        B = rng.standard_normal((k, n), dtype=np.float32)
        paths.add(kernel.specialize(A, B).ir.nests[0].body[0].plan.path)
        got = kernel(A, B)
        assert got.dtype == np.float32 and got.shape == (m, n)
        np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    assert paths == {"small", "packed", "stream"}


CONV_3X3 = ("def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) "
            "{ O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }")


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_a_plan_without_its_reasons_decides_the_same(target, threads):
    """plan(explain=False) (a size-generic kernel's at a call shape) is plan()'s plan with no
    reasons, on each path it formats them for."""
    t = Target.preset(target)
    mr, nv = micro_tile(t, 4)
    nr = nv * t.lanes(4)
    gemm = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    cases = [(gemm, t, ((2 * mr + 1, 37), (37, 2 * nr - 1)), {}),
             (gemm, tiny_caches(t), ((20 * mr - 1, 37), (37, nr + 1)), {}),
             (gemm, tiny_caches(t), ((3 * mr + 1, 37), (37, 12 * nr + 1)), {}),
             (gemm, t, ((300, 200), (200, 300)), {"path": "packed", "mr": mr, "nr": nr}),
             (CONV_3X3, t, ((1, 64, 30, 30), (64, 64, 3, 3)), {})]
    paths = set()
    for src, tt, shapes, overrides in cases:
        con = recognized(src, *shapes)
        explained = plan(con, tt, threads, overrides=overrides)
        quiet = plan(con, tt, threads, overrides=overrides, explain=False)
        assert explained.reasons and quiet.reasons == ()
        assert quiet == dataclasses.replace(explained, reasons=())
        paths.add(explained.path)
    assert paths == {"small", "stream", "packed", "winograd"}


def test_small_path_copies_b_slivers_only_when_their_rows_crowd_l1_sets():
    """B's rows one sliver wide (N = NR) spread over every set: read in place; rows 4 KiB apart
    map to the same sets: each sliver copied."""
    t = Target.preset("x86-64-v4")
    nr = micro_tile(t, 4, 64)[1] * t.lanes(4)
    assert nr == 64
    in_place, crowded = plan(_gemm(64, nr, 64), t, 1), plan(_gemm(64, 1024, 64), t, 1)
    assert (in_place.path, in_place.copy_b) == ("small", False)
    assert (crowded.path, crowded.copy_b) == ("small", True)
    assert any("reads B in place" in r for r in in_place.reasons)


SMALL_GEMM_BIAS = """
def f(float(M,K) A, float(K,N) B, float(N) bias, float(M,N) D) -> (C, Y) {
    C(m,n) +=! A(m,k) * B(k,n)
    C(m,n) += D(m,k2) * B(k2,n) where k2 in 0:3
    Y(m,n) = fmax(C(m,n) + bias(n), 0.0)
}
"""


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("threads", [1, 2])
def test_small_path_last_rows_of_whole_width(target, threads):
    """M not a multiple of the micro-tile's rows, N whole tiles: the last tile's rows are stored
    whole; K in several blocks (later blocks add), a second contraction adding to the output, and
    a bias and ReLU in the store; B read in place (N = NR) and copied (N = 16 NR)."""
    t = Target.preset(target)
    mr, nv = micro_tile(t, 4, 64)
    nr = nv * t.lanes(4)
    rng = np.random.default_rng(threads)
    reference = tcpy.define(SMALL_GEMM_BIAS, backend="reference")
    for m, n, k in ((mr + 1, nr, 40), (4 * mr + mr - 1, nr, 900), (3 * mr + 2, 16 * nr, 50)):
        kernel = tcpy.define(SMALL_GEMM_BIAS, options=tcpy.Options(target=target, num_threads=threads))
        args = [rng.standard_normal(shape, dtype=np.float32) for shape in ((m, k), (k, n), (n,), (m, n))]
        assert kernel.specialize(*args).ir.nests[0].body[0].plan.path == "small"
        for got, want in zip(kernel(*args), reference(*args)):
            assert got.dtype == np.float32 and got.shape == (m, n)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_b_read_transposed_packs_whole_blocks_of_k(target, dtype):
    """``C(m, n) +=! A(m, k) * B(n, k)`` (a linear layer's weights): B's sliver rows run along
    memory in k, so packing loads a vector of k per row and transposes blocks of lanes x lanes
    in registers; K = lanes * 5 + 3 leaves a remainder, N an edge sliver, kc blocks split K."""
    t = Target.preset(target)
    np_dtype = {"float": np.float32, "double": np.float64}[dtype]
    lanes = t.lanes(np.dtype(np_dtype).itemsize)
    mr, nv = micro_tile(t, np.dtype(np_dtype).itemsize)
    src = f"def f({dtype}(M,K) A, {dtype}(N,K) B) -> (C) {{ C(m,n) +=! A(m,k) * B(n,k) }}"
    rng = np.random.default_rng(3)
    m, n, k = 2 * mr + 1, 3 * nv * lanes + 1, 5 * lanes + 3
    A, B = (rng.integers(-9, 9, shape).astype(np_dtype) for shape in ((m, k), (n, k)))
    for tt in (t, tiny_caches(t)):
        kernel = tcpy.define(src, options=tcpy.Options(target=tt, num_threads=2))
        node = kernel.specialize(A, B).ir.nests[0].body[0]
        assert isinstance(node, ContractionNest) and (node.plan.path != "small" or tt is t)  # B packed
        got = kernel(A, B)
        assert got.dtype == np_dtype and got.shape == (m, n)
        np.testing.assert_array_equal(got, A.astype(np.int64) @ B.astype(np.int64).T)  # (exact: small integers)


@pytest.mark.parametrize("target", RUNNABLE)
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_outputs_written_once_bypass_the_caches(target, threads):
    """A contraction with K in one block and an output beyond the threads' halves of L3 stores
    its whole tiles non-temporally where the rows are vector-aligned, plainly elsewhere (an odd
    row length, a caller's misaligned out= array, an epilogue reading the rows back)."""
    t = dataclasses.replace(Target.preset(target), name=f"{target}-small-l3", l3=8 << 10, l3_sharing=1)
    options = tcpy.Options(target=t, num_threads=threads)
    rng = np.random.default_rng(threads)
    mr, nv = micro_tile(t, 4)
    nr = nv * t.lanes(4)
    gemm = "def f({0}(M,K) A, {0}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}"
    for dtype, n in (("float", 40 * nr), ("float", 40 * nr + 3), ("double", 40 * nr)):
        kernel = tcpy.define(gemm.format(dtype), options=options)
        np_dtype = np.float32 if dtype == "float" else np.float64
        A = rng.standard_normal((6 * mr + 5, 30)).astype(np_dtype)
        B = rng.standard_normal((30, n)).astype(np_dtype)
        assert kernel.specialize(A, B).ir.nests[0].body[0].plan.stream_stores
        assert "non-temporal stores" in str(kernel.explain(A, B))
        want = A.astype(np.float64) @ B
        got = kernel(A, B)
        assert got.dtype == A.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        spare = np.full(want.size + 64, np.nan, dtype=A.dtype)
        first = -(spare.ctypes.data // A.itemsize) % (64 // A.itemsize)
        for skip in (first, first + 1):  # rows on the vector alignment, and one element off it
            out = spare[skip:skip + want.size].reshape(want.shape)
            kernel(A, B, out=out)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    conv = ("def f(float(N,C,H,W) I, float(F,C) Wt) -> (O, R) {\n O(n,f,h,w) +=! I(n,c,h,w) * Wt(f,c)\n"
            " R(n,f,h,w) = fmax(O(n,f,h,w), 0.0) }")
    I = rng.standard_normal((2, 16, 19, 23), dtype=np.float32)
    W = rng.standard_normal((40, 16), dtype=np.float32)
    O, R = tcpy.define(conv, options=options)(I, W)
    want = np.einsum("nchw,fc->nfhw", I.astype(np.float64), W)
    np.testing.assert_allclose(O, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(R, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


def test_split_k_is_deterministic_and_right():
    src = "def f(double(M,K) A, double(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    t = tiny_caches(Target.preset("x86-64"))
    kernel = tcpy.define(src, options=tcpy.Options(target=t, num_threads=7))
    node = kernel.specialize((9, 4000), (4000, 5)).ir.nests[0].body[0]
    assert node.plan.grid[3] > 1
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((9, 4000)), rng.standard_normal((4000, 5))
    first = kernel(A, B)
    np.testing.assert_allclose(first, A @ B, rtol=1e-12, atol=1e-12)
    assert all(np.array_equal(first, kernel(A, B)) for _ in range(3))


RANK0_SCALED = [
    # (def, shapes of the tensor inputs): a rank-0 scale on the engine's paths and in a chain
    ("def f(float(M,K) A, float(K,N) B, float s) -> (C) { C(m,n) +=! s * A(m,k) * B(k,n) }", [(9, 7), (7, 11)]),
    ("def f(float(M,K) A, float(K,N) B, float s) -> (C) { C(m,n) +=! A(m,k) * B(k,n) * s }", [(130, 70), (70, 90)]),
    ("def f(float(N,C,H,W) I, float(F,C,3,3) W1, float s) -> (O) "
     "{ O(n,f,h,w) +=! s * I(n,c,h+kh,w+kw) * W1(f,c,kh,kw) }", [(1, 32, 18, 18), (32, 32, 3, 3)]),
    ("def f(float(T,D) Q, float(S,D) K, float(S,E) V, float s) -> (O) "
     "{ X(t,u) +=! Q(t,d) * K(u,d) * s\n O(t,e) +=! X(t,u) * V(u,e) }", [(40, 16), (40, 16), (40, 16)]),
]


@pytest.mark.parametrize("scale", [math.inf, -math.inf, math.nan, 0.5])
@pytest.mark.parametrize("src, shapes", RANK0_SCALED)
def test_a_rank0_scale_that_is_not_finite_scales_every_term(src, shapes, scale):
    """TC scales every term: with an infinite scale, a term with a zero factor is NaN, so the
    engine, which scales each sum once, must not answer inf there (it sums term by term)."""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    args[0].reshape(args[0].shape[0], -1)[::3, 0] = 0  # a zero term in every third row's sums
    args.append(np.float32(scale))
    want = tcpy.define(src, backend="reference")(*args)
    for threads in (1, 2):
        got = tcpy.define(src, options=tcpy.Options(target="x86-64-v3", num_threads=threads))(*args)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


CONV_1X1 = "def f(float(N,C,H,W) I, float(F,C) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h,w) * Wt(f,c) }"


@pytest.mark.parametrize("name", ["x86-64-v3", "x86-64-v4"])
def test_b_beyond_l2_is_packed_by_the_kernel_where_it_reads_in_place(name):
    """An NCHW 1x1 convolution of a batch (B, the images, far beyond L2; 64 output channels)
    packs B in its first micro-tile of each sliver, its threads splitting the pixels; B within
    L2, in runs of few slivers (small images), strided along N (a stride-2 convolution) or
    guarded (padding) is packed by a pass."""
    options = tcpy.Options(target=Target.preset(name), num_threads=2)

    def plan_of(src, *shapes):
        kernel = tcpy.define(src, options=options)
        return kernel.specialize(*shapes).ir.nests[0].body[0].plan, str(kernel.explain(*shapes))

    found, text = plan_of(CONV_1X1, (8, 256, 56, 56), (64, 256))
    assert found.path == "packed" and found.pack_b_in_kernel and found.grid == (1, 1, 2, 1)
    assert "B packed by the kernel" in text and "B packed by the first micro-tile" in text
    con = recognized(CONV_1X1, (8, 256, 56, 56), (64, 256))
    assert not plan(con, Target.preset(name), 2, pack_b_in_kernel=False).pack_b_in_kernel  # (a run-time engine's)
    assert not plan_of(CONV_1X1, (1, 64, 8, 8), (64, 64))[0].pack_b_in_kernel  # 16 KiB of B
    # 7x7 images: few slivers lie inside an image's 49 pixels
    assert not plan_of(CONV_1X1, (8, 2048, 7, 7), (512, 2048))[0].pack_b_in_kernel
    strided = "def f(float(N,C,H,W) I, float(F,C) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,2*h,2*w) * Wt(f,c) }"
    found, text = plan_of(strided, (8, 256, 56, 56), (512, 256))
    assert found.path == "packed" and not found.pack_b_in_kernel and "B packed by the kernel" not in text
    padded = demo.padded_conv2d_source(1, 1, 1)  # (a 1x1 window padded by 1: guarded reads of B)
    assert not plan_of(padded, (8, 256, 56, 56), (64, 256, 1, 1))[0].pack_b_in_kernel


@settings(max_examples=15, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from([name for name in RUNNABLE if name != "host"]), threads=st.sampled_from([1, 2, 7]),
       form=st.sampled_from(["conv", "conv_relu", "gemm_view"]), dtype=st.sampled_from(["float", "double"]),
       n=st.integers(1, 3), c=st.integers(8, 48), f=st.integers(6, 24), hw=st.integers(4, 16),
       seed=st.integers(0, 2**16))
def test_b_packed_by_the_kernel_matches_the_reference(target, threads, form, dtype, n, c, f, hw, seed):
    """The packed path whose first micro-tile of each B sliver reads B in place and packs it
    (caches small enough that B is beyond L2): slivers inside and across the runs of N (an
    image's pixels), an M of partial micro-tiles, K in several blocks, an epilogue, a B whose
    rows are a wider array's (a view); against the reference evaluator."""
    np_dtype = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(seed)
    if form == "gemm_view":
        src = f"def f({dtype}(M,K) A, {dtype}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}"
        wide = rng.uniform(-1, 1, (c, n * hw * hw + 9)).astype(np_dtype)
        args = (rng.uniform(-1, 1, (f, c)).astype(np_dtype), wide[:, 3:3 + n * hw * hw])
    else:
        src = CONV_1X1.replace("float", dtype)
        if form == "conv_relu":
            src = src.replace("-> (O) {", "-> (O, R) {").replace(" }", f"\n R(n,f,h,w) = fmax(O(n,f,h,w), 0.0) }}")
        args = (rng.uniform(-1, 1, (n, c, hw, hw)).astype(np_dtype), rng.uniform(-1, 1, (f, c)).astype(np_dtype))
    kernel = tcpy.define(src, options=tcpy.Options(target=tiny_caches(Target.preset(target)), num_threads=threads))
    got = kernel(*args)
    want = tcpy.define(src, backend="reference")(*args)
    for g, w in zip(got, want) if isinstance(want, tuple) else ((got, want),):
        assert g.dtype == w.dtype == np_dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=64 * EPS[dtype] * (c + 1), atol=64 * EPS[dtype] * (c + 1))
