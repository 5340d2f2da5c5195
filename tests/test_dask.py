"""tcpy.dask: kernels on chunked Dask arrays equal the kernel on the whole arrays, and the plan
(blockwise, halo depths, reductions across chunks, rechunks) is the one range inference implies.

Hypothesis draws chunkings (one chunk, uneven last chunks, chunks smaller than a halo) and runs
the blocks with the reference evaluator (no compiler in the loop); fixed chunkings run the
compiled kernel, and one test runs on a two-process LocalCluster.
"""
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array")
import tcpy  # noqa: E402
import tcpy.dask as tcd  # noqa: E402
from tcpy.demo import SOFTMAX  # noqa: E402

from strategies import programs  # noqa: E402

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
rng = np.random.default_rng(0)


def chunkings(size: int):
    """Chunks of one axis: one chunk, a regular size with an uneven last chunk, or cut points."""
    regular = st.integers(1, size).map(lambda c: (c,) * (size // c) + ((size % c,) if size % c else ()))
    cuts = st.sets(st.integers(1, size - 1), max_size=4).map(
        lambda cs: tuple(np.diff([0, *sorted(cs), size]).tolist()))
    return st.one_of(st.just((size,)), regular, cuts)


def chunked(array, chunks):
    return da.from_array(array, chunks=chunks)


def run(kernel, *arrays, **options):
    """The Dask result(s), computed, and the kernel on the whole arrays."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        got = tcd.apply(kernel, *arrays, **options)
    got = tuple(g.compute(scheduler="threads") for g in got) if isinstance(got, tuple) else got.compute()
    whole = kernel(*[a.compute() if isinstance(a, da.Array) else a for a in arrays])
    return got, whole


def kinds(kernel, *arrays) -> dict:
    return {d.name: d.kind for d in tcd.plan(kernel, *arrays).dimensions}


def split(chunks) -> bool:
    return len(chunks) > 1


# ----------------------------------------------------------------------------- element-wise


ELEMENTWISE = "def ew(float64(M,N) X, float64(M,N) Z) -> (Y) { Y(i, j) = exp(X(i, j)) * 2.0 + Z(i, j) }"


@SETTINGS
@given(cm=chunkings(9), cn=chunkings(7))
def test_elementwise_blockwise(cm, cn):
    kernel = tcpy.define(ELEMENTWISE, backend="reference")
    X, Z = rng.random((9, 7)), rng.random((9, 7))
    dX = chunked(X, (cm, cn))
    got, whole = run(kernel, dX, Z)  # a NumPy array mixed in
    np.testing.assert_array_equal(got, whole)
    assert tcd.apply(kernel, dX, Z).chunks == (cm, cn)
    assert kinds(kernel, dX, Z) == {"M": "blockwise" if split(cm) else "whole",
                                    "N": "blockwise" if split(cn) else "whole"}


# ----------------------------------------------------------------------------- softmax



@SETTINGS
@given(cn=chunkings(10), cd=chunkings(6))
def test_softmax_rows_blockwise_columns_rechunked(cn, cd):
    kernel = tcpy.define(SOFTMAX, backend="reference")
    X = rng.standard_normal((10, 6)).astype(np.float32)
    dX = chunked(X, (cn, cd))
    got, whole = run(kernel, dX)
    np.testing.assert_array_equal(got, whole)
    assert kinds(kernel, dX) == {"N": "blockwise" if split(cn) else "whole",
                                 "D": "rechunked" if split(cd) else "whole"}


def test_softmax_chunked_reduction_warns_or_raises_naming_the_dimension():
    kernel = tcpy.define(SOFTMAX)
    X = rng.standard_normal((8, 6)).astype(np.float32)
    dX = chunked(X, (4, 3))
    with pytest.warns(tcpy.TCWarning, match=r"dimension D \(axis 1 of X\) must be one chunk: mx reduces it"):
        Y = tcd.apply(kernel, dX)
    assert Y.chunks == ((4, 4), (6,))
    np.testing.assert_allclose(Y.compute(), kernel(X), rtol=1e-6)
    with pytest.raises(tcpy.TCArgumentError, match=r"dimension D \(axis 1 of X\) must be one chunk.*got 2 chunks"):
        tcd.apply(kernel, dX, rechunk=False)


# ----------------------------------------------------------------------------- convolutions


def conv_source(stride: int, dilation: int, pad: int) -> str:
    """A 2-d convolution; padding by ternaries with the output and window ranges in `where`."""
    h, w = f"{stride}*h + {dilation}*kh - {pad}", f"{stride}*w + {dilation}*kw - {pad}"
    out = lambda S, K: f"({S} + {2 * pad} - {dilation}*({K} - 1) - 1)/{stride} + 1"  # noqa: E731
    guard = f"{h} >= 0 && {h} < H && {w} >= 0 && {w} < W" if pad else "1 == 1"
    return f"""
def conv(float64(N, C, H, W) I, float64(F, C, KH, KW) Wt) -> (O) {{
    O(n, f, h, w) +=! ({guard}) ? I(n, c, {h}, {w}) * Wt(f, c, kh, kw) : 0.0
        where h in 0:{out("H", "KH")}, w in 0:{out("W", "KW")}, kh in 0:KH, kw in 0:KW
}}
"""


def conv_halo(stride, dilation, pad, k=3):
    """Input elements read before and after an aligned block of a convolution."""
    return pad, max(0, dilation * (k - 1) - pad - (stride - 1))


@SETTINGS
@given(geometry=st.sampled_from([(1, 1, 0), (1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 2, 0), (3, 1, 1)]),
       cn=chunkings(2), ch=chunkings(13), cw=chunkings(11))
def test_conv_halos(geometry, cn, ch, cw):
    stride, dilation, pad = geometry
    kernel = tcpy.define(conv_source(stride, dilation, pad), backend="reference")
    I, Wt = rng.random((2, 2, 13, 11)), rng.random((3, 2, 3, 3))
    dI = chunked(I, (cn, 2, ch, cw))
    got, whole = run(kernel, dI, Wt)
    np.testing.assert_allclose(got, whole, rtol=1e-12)
    plan = tcd.plan(kernel, dI, Wt)
    before, after = conv_halo(*geometry)
    for name, chunks, axis in (("H", ch, 2), ("W", cw, 3)):
        dim = plan.dimension(name)
        if not split(chunks):
            assert dim.kind == "whole"
            continue
        assert dim.kind == ("blockwise" if (before, after, stride) == (0, 0, 1) else "halo")
        assert dim.halo == ((("I", axis), before, after),)
    assert plan.dimension("N").kind == ("blockwise" if split(cn) else "whole")


def test_valid_conv_has_depth_kh_minus_1_and_equals_the_compiled_kernel():
    kernel = tcpy.define(conv_source(1, 1, 0).replace("float64", "float"))
    I = rng.random((2, 3, 16, 16), dtype=np.float32)
    Wt = rng.random((4, 3, 3, 3), dtype=np.float32)
    dI = chunked(I, (1, 3, 8, 16))
    plan = tcd.plan(kernel, dI, Wt)
    assert plan.dimension("H").depth == 2 and plan.dimension("H").kind == "halo"
    assert plan.output_chunks["O"] == ((1, 1), (4,), (8, 6), (14,))
    got, whole = run(kernel, dI, Wt)
    np.testing.assert_allclose(got, whole, rtol=1e-5)
    assert "H (I.2): halo of depth 2 in 2 blocks (I.2: 0 before, 2 after)" in tcd.explain(kernel, dI, Wt)


CHAIN = """
def chain(float64(H) X, float64(K) W) -> (Z) {
    T(h) +=! X(h + k) * W(k)
    Z(h) +=! T(2*h + k) * W(k)
}
"""


@SETTINGS
@given(ch=chunkings(40))
def test_stencils_in_a_chain_compose_their_halos(ch):
    kernel = tcpy.define(CHAIN, backend="reference")
    X, W = rng.random(40), rng.random(3)
    dX = chunked(X, ch)
    got, whole = run(kernel, dX, W)
    np.testing.assert_allclose(got, whole, rtol=1e-12)
    dim = tcd.plan(kernel, dX, W).dimension("H")
    # Z(h) needs T(2h .. 2h+2), which needs X(2h .. 2h+4): 3 past the 2 X elements of h
    assert (dim.kind, dim.halo) == (("halo", ((("X", 0), 0, 3),)) if split(ch) else ("whole", ()))


CONV_RELU = """
def conv_relu(float(N, C, H, W) I, float(F, C, KH, KW) Wt, float(F) b) -> (Y) {
    O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
                      ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
                      where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
    Y(n, f, h, w) = fmax(O(n, f, h, w) + b(f), 0.0)
}
"""


def test_padded_conv_with_activation_compiled():
    kernel = tcpy.define(CONV_RELU)
    I = rng.random((2, 3, 12, 12), dtype=np.float32) - 0.5
    Wt, b = rng.random((4, 3, 3, 3), dtype=np.float32) - 0.5, rng.random(4, dtype=np.float32) - 0.5
    dI = chunked(I, (2, 3, 6, 6))
    got, whole = run(kernel, dI, Wt, b)
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)
    plan = tcd.plan(kernel, dI, Wt, b)
    assert plan.dimension("H").halo == ((("I", 2), 1, 1),)
    assert plan.output_chunks["Y"] == ((2,), (4,), (6, 6), (6, 6))


# ----------------------------------------------------------------------------- GEMM and reductions

GEMM = "def gemm(float64(M, K) A, float64(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


@SETTINGS
@given(cm=chunkings(7), cka=chunkings(9), ckb=chunkings(9), cn=chunkings(5))
def test_gemm_chunked_on_m_n_and_k(cm, cka, ckb, cn):
    kernel = tcpy.define(GEMM, backend="reference")
    A, B = rng.random((7, 9)), rng.random((9, 5))
    dA, dB = chunked(A, (cm, cka)), chunked(B, (ckb, cn))
    got, whole = run(kernel, dA, dB)
    np.testing.assert_allclose(got, whole, rtol=1e-12)
    plan = tcd.plan(kernel, dA, dB)
    k_split = split(cka) or split(ckb)
    assert {d.name: d.kind for d in plan.dimensions} == {
        "M": "blockwise" if split(cm) else "whole", "K": "reduced" if k_split else "whole",
        "N": "blockwise" if split(cn) else "whole"}
    if k_split:
        assert plan.dimension("K").operator == "+"
        assert plan.dimension("K").blocks == max(len(cka), len(ckb))


def test_gemm_k_chunked_compiled_keeps_dtype():
    kernel = tcpy.define(GEMM.replace("float64", "float"))
    A, B = rng.random((32, 96), dtype=np.float32), rng.random((96, 24), dtype=np.float32)
    C = tcd.apply(kernel, chunked(A, (16, 32)), chunked(B, (32, 24)))
    assert C.dtype == np.float32 and C.chunks == ((16, 16), (24,))
    got = C.compute()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, kernel(A, B), rtol=1e-5)
    one_thread = tcd.apply(kernel, chunked(A, (16, 32)), chunked(B, (32, 24)), options=tcpy.Options(num_threads=1))
    np.testing.assert_allclose(one_thread.compute(), got, rtol=1e-6)


def test_integer_gemm_wraps_like_the_kernel():
    kernel = tcpy.define(GEMM.replace("float64", "int32"), backend="reference")
    A = rng.integers(-2**20, 2**20, (5, 12)).astype(np.int32)
    B = rng.integers(-2**20, 2**20, (12, 4)).astype(np.int32)
    got, whole = run(kernel, chunked(A, (5, 5)), chunked(B, (5, 4)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, whole)


@SETTINGS
@given(op=st.sampled_from(["max", "min", "+", "*"]), cm=chunkings(8), ck=chunkings(6))
def test_column_reductions_across_chunks(op, cm, ck):
    kernel = tcpy.define(f"def red(float64(M, K) A) -> (R) {{ R(k) {op}=! A(m, k) }}", backend="reference")
    A = rng.random((8, 6)) + 0.5
    dA = chunked(A, (cm, ck))
    got, whole = run(kernel, dA)
    np.testing.assert_allclose(got, whole, rtol=1e-12)
    plan = tcd.plan(kernel, dA)
    assert plan.dimension("M").kind == ("reduced" if split(cm) else "whole")
    assert plan.dimension("M").operator == (op if split(cm) else None)
    assert plan.dimension("K").kind == ("blockwise" if split(ck) else "whole")


def test_dot_product_gives_a_rank_0_array_and_takes_a_scalar():
    kernel = tcpy.define("def dot(float64(N) x, float64(N) y, double alpha) -> (s) { s +=! alpha * x(i) * y(i) }")
    x, y = rng.random(10), rng.random(10)
    got = tcd.apply(kernel, chunked(x, 3), chunked(y, 4), 2.0)
    assert got.shape == () and got.dtype == np.float64
    assert tcd.plan(kernel, chunked(x, 3), chunked(y, 4), 2.0).dimension("N").kind == "reduced"
    np.testing.assert_allclose(got.compute(), kernel(x, y, 2.0), rtol=1e-12)


def test_reductions_that_cannot_be_combined_are_rechunked():
    kernel = tcpy.define("def r(float(M, K) A) -> (R, S) { R(k) max=! A(m, k)\n S(k) min=! A(m, k) }",
                         backend="reference")
    A = rng.random((6, 4)).astype(np.float32)
    dA = chunked(A, (2, 4))
    with pytest.warns(tcpy.TCWarning, match="dimension M .* must be one chunk: 2 statements reduce it"):
        tcd.apply(kernel, dA)
    got, whole = run(kernel, dA)
    for g, w in zip(got, whole):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("backend", ["reference", "compiled"])
def test_half_reduction_combines_float32_partials(backend):
    # each chunk's partial sum stays float32, the type a half sum accumulates in; one cast at the end
    kernel = tcpy.define("def r(half(M, K) A) -> (R) { R(k) +=! A(m, k) }", backend=backend)
    A = (rng.random((64, 5)) * 4).astype(np.float16)
    A[:16], A[16:32] = 5000, -5000  # partial sums of +-80000: infinite in half, exact in float32
    dA = chunked(A, (16, 5))
    assert tcd.plan(kernel, dA).dimension("M").kind == "reduced"
    got = tcd.apply(kernel, dA)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.compute().astype(np.float32), kernel(A).astype(np.float32), rtol=1e-3)
    np.testing.assert_allclose(got.compute().astype(np.float32), A.astype(np.float32).sum(0), rtol=1e-3)


def test_index_used_as_a_value_and_data_dependent_gather_are_rechunked():
    iota = tcpy.define("def iota(float(N) X) -> (Y) { Y(i) = X(i) * float(i) }", backend="reference")
    dX = chunked(np.arange(10, dtype=np.float32), 3)
    with pytest.warns(tcpy.TCWarning, match=r"dimension N .* Y uses an index as a value \(i\)"):
        tcd.apply(iota, dX)
    got, whole = run(iota, dX)
    np.testing.assert_array_equal(got, whole)

    gather = tcpy.define("def g(float(N) T, int32(M) L) -> (Y) { Y(i) = T(L(i)) }", backend="reference")
    L = rng.integers(0, 10, 11).astype(np.int32)
    dL = chunked(L, 4)
    with pytest.warns(tcpy.TCWarning, match=r"dimension N \(axis 0 of T\) must be one chunk: T\(L\(i\)\) indexes it by data"):
        tcd.apply(gather, dX, dL)
    assert kinds(gather, dX, dL) == {"N": "rechunked", "M": "blockwise"}
    got, whole = run(gather, dX, dL)
    np.testing.assert_array_equal(got, whole)


def test_bad_arguments():
    kernel = tcpy.define(GEMM)
    A = chunked(rng.random((4, 6)), 2)
    with pytest.raises(tcpy.TCShapeError, match="size K is 6"):
        tcd.apply(kernel, A, chunked(rng.random((5, 3)), 2))
    with pytest.raises(tcpy.TCArgumentError, match="must have dtype float64"):
        tcd.apply(kernel, A, chunked(rng.random((6, 3)).astype(np.float32), 2))
    with pytest.raises(tcpy.TCArgumentError, match="takes 2 arguments"):
        tcd.apply(kernel, A)
    with pytest.raises(tcpy.TCArgumentError, match="needs a kernel from tcpy.define"):
        tcd.apply(np.matmul, A, A)


# ----------------------------------------------------------------------------- random programs


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(prog=programs(), data=st.data())
def test_random_programs_on_random_chunks_equal_the_whole_arrays(prog, data):
    """Whatever the def and the chunks, a plan either splits exactly or rechunks."""
    kernel = tcpy.define(prog.source, prog.name, backend="reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        try:
            whole = kernel(*prog.args)
        except tcpy.TCError:  # a lookup table with an index out of range: an error either way
            return
    args = [chunked(a, tuple(data.draw(st.integers(1, max(1, n)), label="chunk") for n in a.shape))
            if isinstance(a, np.ndarray) and a.ndim else a for a in prog.args]
    got, _ = run(kernel, *args)
    as_tuple = lambda x: x if isinstance(x, tuple) else (x,)  # noqa: E731
    for g, w in zip(as_tuple(got), as_tuple(whole)):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-2 if w.dtype == np.float16 else 1e-4, atol=1e-3)
        else:
            np.testing.assert_array_equal(g, w)


# ----------------------------------------------------------------------------- dask.distributed


@pytest.fixture
def environment_kept():
    """This process's environment restored after the test: distributed's nanny sets
    OMP_NUM_THREADS=1 (and MKL's, OpenBLAS's, glibc's trim threshold) here for its workers and
    leaves them, and another OpenMP user's first parallel region (torch's) would read it and set
    the process's OpenMP thread count to 1 for the tests after."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_local_cluster_two_processes(tmp_path, monkeypatch, environment_kept):
    distributed = pytest.importorskip("distributed")
    # workers inherit this: they build the kernels into their own cache from the def's source
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "worker-cache"))
    conv = tcpy.define(CONV_RELU)
    gemm = tcpy.define(GEMM.replace("float64", "float"))
    I = rng.random((2, 3, 12, 12), dtype=np.float32)
    Wt, b = rng.random((4, 3, 3, 3), dtype=np.float32), rng.random(4, dtype=np.float32)
    A, B = rng.random((16, 64), dtype=np.float32), rng.random((64, 8), dtype=np.float32)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        Y = tcd.apply(conv, chunked(I, (2, 3, 6, 12)), Wt, b)
        C = tcd.apply(gemm, chunked(A, (16, 16)), chunked(B, (16, 8)))
        y, c = client.compute([Y, C], sync=True)
        task = tcd._BlockTask.for_kernel(gemm, gemm.options, 4, gemm.def_)
        threads = client.submit(task.threads, pure=False).result()
    assert list((tmp_path / "worker-cache").rglob("*.so"))  # only the workers have compiled
    np.testing.assert_allclose(y, conv(I, Wt, b), rtol=1e-5)
    np.testing.assert_allclose(c, gemm(A, B), rtol=1e-5)
    assert threads == max(1, len(os.sched_getaffinity(0)) // 2)  # 2 worker threads share the cores
