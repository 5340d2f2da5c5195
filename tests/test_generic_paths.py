"""The run-time engine's paths in size-generic kernels: one compile holds the packed, small and
stream paths, and each call shape takes the one the planner picks for it (operands read in
place for small GEMMs and narrow outputs, a B transposed packed by vector loads along K)."""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.demo import GEMM
from tcpy.target import Target

GEMM_NT = """
def gemm_nt(float(M,K) A, float(N,K) B) -> (C) {
    C(m, n) +=! A(m, k) * B(n, k)
}
"""
# A transposed (read in place along a stride of M), a scale, accumulation into an input
GEMM_TN_ACC = """
def gemm_tn_acc(double(K,M) A, double(K,N) B, double(M,N) C0) -> (C) {
    C(m, n) = C0(m, n)
    C(m, n) += 0.5 * A(k, m) * B(k, n)
}
"""
BMM = """
def bmm(float(Z,M,K) A, float(Z,K,N) B) -> (C) {
    C(z, m, n) +=! A(z, m, k) * B(z, k, n)
}
"""

# 0, 1, primes, micro-tile rows (6, 8) and columns (16, 24, 48, 64) +-1, K blocks' lengths +-1
# and a few larger sizes, where the planner leaves the small path for the stream or packed one
SIZES = (0, 1, 2, 5, 7, 8, 9, 13, 15, 16, 17, 23, 47, 48, 49, 63, 64, 65, 97, 130, 257, 300)
LONG = (1, 31, 64, 255, 256, 257, 600)  # K


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _gemm(rng, draw):
    m, n, k = draw(SIZES), draw(SIZES), draw(LONG)
    a, b = _f32(rng, m, k), _f32(rng, k, n)
    return (a, b), a.astype(np.float64) @ b


def _gemm_nt(rng, draw):
    m, n, k = draw(SIZES), draw(SIZES), draw(LONG)
    a, b = _f32(rng, m, k), _f32(rng, n, k)
    return (a, b), a.astype(np.float64) @ b.T


def _gemm_tn_acc(rng, draw):
    m, n, k = draw(SIZES), draw(SIZES), draw(LONG)
    a, b, c0 = rng.standard_normal((k, m)), rng.standard_normal((k, n)), rng.standard_normal((m, n))
    return (a, b, c0), c0 + 0.5 * a.T @ b


def _bmm(rng, draw):
    z, m, n, k = draw((0, 1, 3)), draw(SIZES), draw(SIZES), draw(LONG[:4])
    a, b = _f32(rng, z, m, k), _f32(rng, z, k, n)
    return (a, b), a.astype(np.float64) @ b


CASES = {"gemm": (GEMM, _gemm), "gemm_nt": (GEMM_NT, _gemm_nt), "gemm_tn_acc": (GEMM_TN_ACC, _gemm_tn_acc),
         "bmm": (BMM, _bmm)}
PRESETS = [p for p in ("x86-64-v3", "x86-64", "x86-64-v4") if Target.preset(p).can_run_here()]
CONFIGS = [(name, PRESETS[k % len(PRESETS)], (1, 2, 7)[k % 3]) for k, name in enumerate(CASES)]

_kernels = {}


def _kernel(name, preset, threads):
    """One kernel per configuration for the whole module (hypothesis calls it with many shapes)."""
    key = (name, preset, threads)
    if key not in _kernels:
        options = tcpy.Options(specialize="never", target=preset, num_threads=threads)
        _kernels[key] = tcpy.define(CASES[name][0], options=options)
    return _kernels[key]


def _path(kernel, *args) -> str:
    """The run-time engine's path that ``explain()`` names for these arguments."""
    return re.search(r"generic kernel: .*: run-time engine \((\w+) path", kernel.explain(*args)).group(1)


@pytest.mark.parametrize("name, preset, threads", CONFIGS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_generic_kernel_takes_each_shape_s_path(builds, name, preset, threads, data):
    kernel = _kernel(name, preset, threads)
    rng = np.random.default_rng(0)
    draw = lambda values: data.draw(st.sampled_from(values))  # noqa: E731
    for _ in range(3):
        args, want = CASES[name][1](rng, draw)
        got = kernel(*args)
        assert got.shape == want.shape and got.dtype == args[0].dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1, args[0].shape[-1]) ** 0.5)
        assert _path(kernel, *args) in ("packed", "small", "stream")
    # built once, at the kernel's first call (in this module's first example)
    assert len(builds) == 1 and "generic" in builds[0]


def test_explain_names_the_path_each_shape_takes(builds):
    """On one preset (the planner's choice depends on the Target's caches): a small GEMM reads
    its operands in place, B's slivers copied where its rows would crowd L1; a narrow output
    streams A against packed K blocks of B; a large one packs both; one build serves them all."""
    kernel = tcpy.define(GEMM, options=tcpy.Options(specialize="never", target="x86-64-v3", num_threads=2))
    rng = np.random.default_rng(1)
    expected = {(64, 64, 64): "small", (7, 200, 97): "small", (24, 256, 64): "small",
                (500, 64, 256): "stream", (300, 300, 300): "packed", (1, 64, 64): "packed"}
    for (m, n, k), path in expected.items():
        a, b = _f32(rng, m, k), _f32(rng, k, n)
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
        assert _path(kernel, a, b) == path, ((m, n, k), kernel.explain(a, b))
    assert "each B sliver copied" in kernel.explain(np.ones((24, 64), np.float32), np.ones((64, 256), np.float32))
    assert len(builds) == 1 and "generic" in builds[0]


@pytest.mark.skipif(not Target.preset("x86-64-v4").can_run_here(), reason="needs AVX-512")
def test_in_place_paths_take_the_planner_s_tile_for_their_n(builds):
    """The small and stream paths' kernels read A in place, so a kernel also holds the tile the
    planner picks for an N of whole 4-vector tiles (6x64 with AVX-512's 32 registers, where the
    kernel's 8x48 would compute 96 columns of 64), and a shape whose N suits it takes it."""
    kernel = tcpy.define(GEMM, options=tcpy.Options(specialize="never", target="x86-64-v4", num_threads=2))
    rng = np.random.default_rng(3)
    expected = {(64, 64, 64): ("small", "6x64"), (13, 128, 31): ("small", "6x64"), (64, 48, 64): ("small", "8x48"),
                (2000, 64, 300): ("stream", "6x64"), (2000, 48, 1000): ("stream", "8x48")}
    for (m, n, k), (path, tile) in expected.items():
        a, b = _f32(rng, m, k), _f32(rng, k, n)
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
        text = kernel.explain(a, b)
        assert _path(kernel, a, b) == path and f"micro-tile {tile}; at these sizes" in text, text
    assert len(builds) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_transposed_b_packs_every_sliver_and_remainder(threads):
    """B(n, k) packed by vector loads along K: whole slivers (with the columns of slivers ahead
    prefetched), N's last partial sliver, K's steps past a whole number of vectors, and a B
    that is a strided view of a larger array."""
    kernel = tcpy.define(GEMM_NT, options=tcpy.Options(specialize="never", target="x86-64-v3",
                                                       num_threads=threads))
    rng = np.random.default_rng(2)
    for m, n, k in ((20, 300, 200), (9, 97, 33), (300, 300, 300), (13, 64, 7)):
        a, b = _f32(rng, m, k), _f32(rng, n, k + 3)[:, 1:k + 1]
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b.T, rtol=1e-4, atol=1e-3)
