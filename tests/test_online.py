"""Online softmax in fused chains (flash attention's form, see tcpy.loopir.Online): when a block
of whole score rows would not fit half of L2, the score columns run in blocks too, with a
running maximum and sum per row and the partial output rows rescaled when the maximum grows.

Tiny caches (tests/test_chain.py's) make short rows "long": blocks of 16 columns, a
shorter last block, many rescalings per row. Results are checked against the reference
evaluator, special values included (the rows the online form cannot give exactly are computed
again whole, as the statements say).
"""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy import demo
from tcpy.target import Target
from test_chain import EXAMPLES, PLANNED, RUNNABLE, chains_of, tiny_caches

SOFTMAX_TIMES_V = """def f(float(M,K) X, float(N,K) Y, float(N,P) Z, float t, float(M) W) -> (O) {{
    T(m, n) +=! X(m, k) * Y(n, k)
    R(m) max=! T(m, n)
    E(m, n) = exp({u})
    S(m) +=! E(m, n)
    Q(m, n) = E(m, n) / S(m)
    O(m, p) +=! Q(m, n) * Z(n, p)
}}"""
# exponents of the online form: the difference to the row maximum, scaled by anything that is the
# same for every column
ONLINE = ["T(m, n) - R(m)", "t * (T(m, n) - R(m))", "(T(m, n) - R(m)) / t", "(T(m, n) - R(m)) * W(m)"]
# and of forms that are not: exp(u(T) - u(T')) is not exp(u(T)) / exp(u(T'))
WHOLE = ["T(m, n) - 2 * R(m)", "T(m, n) - R(m) + t", "(T(m, n) - R(m)) * Y(n, 0)", "t * T(m, n) - t * R(m)"]


def kernel(source, threads, target, dtype="float"):
    return tcpy.define(source.replace("float", dtype), options=tcpy.Options(num_threads=threads, target=target))


def compare(got, want, rtol):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(["float", "double"]))
    np_dtype = np.float32 if dtype == "float" else np.float64
    m, n = draw(st.sampled_from([2, 5, 13, 37])), draw(st.sampled_from([67, 97, 131, 250]))
    k, p = draw(st.sampled_from([1, 3, 8])), draw(st.sampled_from([1, 5, 16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    spread = draw(st.sampled_from([0.5, 4.0, 40.0]))  # 40: peaky rows, factors that underflow
    x = (rng.standard_normal((m, k)) * spread).astype(np_dtype)
    y = rng.standard_normal((n, k)).astype(np_dtype)
    z = rng.standard_normal((n, p)).astype(np_dtype)
    t = np_dtype(draw(st.sampled_from([0.3, 1.0, -0.3, 0.0, 1e-20, np.inf, np.nan])))
    w = rng.uniform(0.2, 2.0, m).astype(np_dtype)
    special = draw(st.sampled_from(["none", "nan score", "inf key", "-inf first columns", "inf value"]))
    if special == "nan score":
        x[rng.integers(m)] = np.nan
    elif special == "inf key":
        y[rng.integers(n), 0] = np.inf
    elif special == "-inf first columns":  # the first blocks' scores -inf: E NaN there, not in the statements
        x[:] = np.abs(x) + 0.1
        y[: n // 3] = -np.inf
    elif special == "inf value":
        z[rng.integers(n), 0] = np.inf
    return dtype, draw(st.sampled_from(ONLINE)), [x, y, z, t, w], draw(st.sampled_from([1, 2, 7])), \
        draw(st.sampled_from(RUNNABLE))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_online_chains_match_the_reference(case):
    dtype, u, args, threads, target = case
    source = SOFTMAX_TIMES_V.format(u=u)
    online = kernel(source, threads, tiny_caches(Target.preset(target)), dtype)
    (chain,) = chains_of(online, *args)
    assert chain.online is not None
    with np.errstate(all="ignore"):
        got = online(*args)
        want = tcpy.define(source.replace("float", dtype), backend="reference")(*args)
    compare(got, want, 2e-4 if dtype == "float" else 1e-9)


@pytest.mark.parametrize("u", WHOLE)
def test_other_exponents_keep_whole_rows(u):
    source = SOFTMAX_TIMES_V.format(u=u)
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((13, 3), (97, 3), (97, 5))]
    args += [np.float32(0.5), rng.uniform(0.5, 2, 13).astype(np.float32)]
    tiny = kernel(source, 2, tiny_caches(PLANNED))
    (chain,) = chains_of(tiny, *args)
    assert chain.online is None
    assert "not a softmax whose columns could run in blocks" in str(tiny.explain(*args))
    compare(tiny(*args), tcpy.define(source, backend="reference")(*args), 2e-4)


def test_long_rows_are_explained():
    # a preset, not the host: the blocks of columns follow the micro-tile (8 x 24 on AVX-512)
    q = np.zeros((1, 2, 131, 7), np.float32)
    text = str(kernel(demo.ATTENTION, 2, tiny_caches(PLANNED)).explain(q, q, q, np.float32(1)))
    assert "online softmax" in text and "s runs in blocks of 16 too" in text
    assert "running maximum Mx and sum Sm per row" in text
    # (a kernel specialised to these sizes: the size-generic one runs the online form at every size)
    whole = tcpy.define(demo.ATTENTION, options=tcpy.Options(target=PLANNED, specialize="always"))
    assert "online" not in str(whole.explain(q, q, q, np.float32(1)))


def test_rows_whose_first_columns_are_minus_inf_are_computed_again_whole():
    """The first blocks' scores are -inf, so their E is exp(-inf - -inf) = NaN online, while the
    statements (whose maximum is the row's) give 0 there: those rows run again whole."""
    source = SOFTMAX_TIMES_V.format(u="T(m, n) - R(m)")
    rng = np.random.default_rng(2)
    x = rng.uniform(0.5, 1, (7, 2)).astype(np.float32)
    y = rng.standard_normal((100, 2)).astype(np.float32)
    y[:40] = -np.inf
    z = rng.standard_normal((100, 3)).astype(np.float32)
    args = [x, y, z, np.float32(1), np.ones(7, np.float32)]
    got = kernel(source, 2, tiny_caches(Target.host()))(*args)
    want = tcpy.define(source, backend="reference")(*args)
    assert np.isfinite(want).all()
    compare(got, want, 2e-4)


@pytest.mark.parametrize("preset, threads", [("x86-64-v3", 1), ("x86-64", 2), ("x86-64-v3", 7)])
def test_a_generic_chain_computes_rows_again_whole_over_every_block_of_columns(preset, threads):
    """One size-generic kernel: the rows whose first columns are -inf run again whole on the
    blocks' plans, one block of columns after the other (several, a shorter last one, or none:
    no keys), for every call shape."""
    source = SOFTMAX_TIMES_V.format(u="T(m, n) - R(m)")
    options = tcpy.Options(num_threads=threads, target=tiny_caches(Target.preset(preset)), specialize="never")
    generic, reference = tcpy.define(source, options=options), tcpy.define(source, backend="reference")
    rng = np.random.default_rng(4)
    for m, n, k, p in ((7, 100, 2, 3), (13, 250, 3, 16), (5, 16, 1, 5), (3, 17, 8, 1), (4, 0, 2, 3)):
        x = rng.uniform(0.5, 1, (m, k)).astype(np.float32)
        y = rng.standard_normal((n, k)).astype(np.float32)
        y[: n // 3] = -np.inf
        args = [x, y, rng.standard_normal((n, p)).astype(np.float32), np.float32(1), np.ones(m, np.float32)]
        with np.errstate(all="ignore"):
            want = reference(*args)
        compare(generic(*args), want, 2e-4)
        assert "kernel: generic" in str(generic.explain(*args))


def test_a_negative_scale_that_overflows_gives_the_statements_values():
    """t < 0: exp(t * (T - R)) grows with the distance to the maximum and overflows to inf in
    the statements (then S = inf and the quotients inf / inf = NaN or 0)."""
    source = SOFTMAX_TIMES_V.format(u="t * (T(m, n) - R(m))")
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) * 30 for s in ((5, 4), (120, 4))]
    args += [rng.standard_normal((120, 3)).astype(np.float32), np.float32(-2), np.ones(5, np.float32)]
    with np.errstate(all="ignore"):
        want = tcpy.define(source, backend="reference")(*args)
        got = kernel(source, 1, tiny_caches(Target.host()))(*args)
    assert not np.isfinite(want).all()
    compare(got, want, 2e-4)


def test_online_loop_ir_golden(golden):
    """The loops of an online chain: blocks of rows, blocks of columns (a shorter last one), the
    online steps in each row, the rows computed again whole."""
    attention = tcpy.define(demo.ATTENTION, options=tcpy.Options(
        num_threads=2, target=tiny_caches(Target.preset("x86-64-v3"))))
    shapes = ((1, 2, 13, 16), (1, 2, 70, 16), (1, 2, 70, 16), np.float32(0.25))
    golden.check(Path(__file__).parent / "golden" / "loopir" / "attention_online.expected", attention.loop_ir(*shapes))
