"""Fused chains: a contraction, row statements, a contraction (attention's shape) run as one
parallel loop over blocks of rows (see tcpy.transform.fusion and tcpy.loopir.BlockChain); two
products back to back, the second reading the first's rows, the same way.

The random chains draw 0-1 batch variables, transposed operand layouts, 0-4 row statements
(row reductions with +, max, min and elementwise maps of what came before), the second
product with the rows on either side, extents among 1 and small primes, float32 and float64, at
1, 2 and 7 threads, for every preset this CPU runs, half of them with tiny caches (small row
blocks, many blocks per batch, operands packed once per batch). Results are checked against the
reference evaluator with their exact dtype and shape.
"""
import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy import demo
from tcpy.loopir import BlockChain
from tcpy.target import PRESETS, Target

EXAMPLES = int(os.environ.get("TCPY_CHAIN_EXAMPLES", "20"))
RUNNABLE = [name for name in PRESETS if name.startswith("x86") and Target.preset(name).can_run_here()]
if Target.host().arch == "x86_64":
    RUNNABLE.append("host")
# The target of the tests that assert a plan: a preset, because micro-tiles and blocks follow
# the target's ISA and caches, and a test must pass on every CPU.
PLANNED = Target.preset("x86-64-v3")
EXTENTS = (1, 2, 3, 5, 7, 13, 17, 31, 37)
GOOD = Path(__file__).parent / "golden" / "good"


def tiny_caches(target: Target) -> Target:
    """The same ISA with caches so small that a row block holds one micro-tile of rows."""
    return dataclasses.replace(target, name=target.name + "-tiny", l1d=1024, l2=6144, l3=24576, l3_sharing=1)


def chains_of(kernel, *args):
    ir = kernel.specialize(*args).ir
    return [node for nest in ir.nests for node in nest.body if isinstance(node, BlockChain)]


def check(source, args, options, rtol):
    got = tcpy.define(source, options=tcpy.Options(**options))(*args)
    want = tcpy.define(source, backend="reference")(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


@st.composite
def chains(draw):
    dtype = draw(st.sampled_from(["float", "double"]))
    np_dtype = np.float32 if dtype == "float" else np.float64
    batch = ["b"] if draw(st.booleans()) else []
    extent = {v: draw(st.sampled_from(EXTENTS)) for v in batch + ["m", "n", "k", "p"]}
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    params, args = [], []

    def operand(name, vars_):
        dims = draw(st.permutations(vars_))
        params.append(f"{dtype}({', '.join(f'{name}{d}' for d in range(len(dims)))}) {name}")
        args.append(rng.uniform(-1, 1, [extent[v] for v in dims]).astype(np_dtype))
        return f"{name}({', '.join(dims)})"

    rows = ", ".join(batch + ["m"])
    full = ", ".join(batch + ["m", "n"])
    x, y = operand("X", batch + ["m", "k"]), operand("Y", batch + ["n", "k"])
    lines = [f"T({full}) +=! {x} * {y}"]
    prev, reductions = "T", []
    statements = draw(st.integers(0, 4))  # 0: the second product reads T itself (a pair)
    for i in range(statements):
        if draw(st.booleans()) and i < 3:
            op = draw(st.sampled_from(["+=!", "max=!", "min=!"]))
            lines.append(f"R{i}({rows}) {op} {prev}({full})")
            reductions.append(f"R{i}")
        else:
            forms = ["exp({x} - {r})", "{x} * {r}", "tanh({x}) + {r}", "{x} / (1 + {r} * {r})"]
            if reductions and prev != "T":
                forms.append("{x} / {r}")  # a quotient the last product may defer (tcpy.loopir.Deferral)
            form = draw(st.sampled_from(forms))
            r = f"{draw(st.sampled_from(reductions))}({rows})" if reductions else "0.5"
            lines.append(f"E{i}({full}) = " + form.format(x=f"{prev}({full})", r=r))
            prev = f"E{i}"
    if prev == "T" and statements:
        lines.append(f"U({full}) = T({full}) * 0.25")
        prev = "U"
    z = operand("Z", batch + ["n", "p"])
    out = draw(st.sampled_from([batch + ["m", "p"], batch + ["p", "m"]]))
    product = f"{prev}({full}) * {z}" if draw(st.booleans()) else f"{z} * {prev}({full})"
    lines.append(f"O({', '.join(out)}) +=! {product}")
    source = f"def f({', '.join(params)}) -> (O) {{\n    " + "\n    ".join(lines) + "\n}\n"
    target = draw(st.sampled_from(RUNNABLE))
    options = {"num_threads": draw(st.sampled_from([1, 2, 7])),
               "target": tiny_caches(Target.preset(target)) if draw(st.booleans()) else target}
    return source, args, options, 2e-4 if dtype == "float" else 1e-9


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=chains())
def test_random_chains_match_the_reference(case):
    check(*case)


def test_random_chains_do_form_chains():
    """The strategy's chains do fuse (so the differential test exercises them)."""
    source = """def f(float(M,K) X, float(N,K) Y, float(N,P) Z) -> (O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        R0(m) max=! T(m, n)
        E1(m, n) = exp(T(m, n) - R0(m))
        O(m, p) +=! E1(m, n) * Z(n, p)
    }"""
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((37, 5), (31, 5), (31, 13))]
    for threads in (1, 2, 7):
        options = {"num_threads": threads, "target": tiny_caches(PLANNED)}
        (chain,) = chains_of(tcpy.define(source, options=tcpy.Options(**options)), *args)
        assert chain.head.prepacked and chain.tail.prepacked  # many small blocks: packed once per batch
        assert bool(chain.shared) == chain.parallel  # one batch for several threads: one shared copy
        check(source, args, options, 2e-4)


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_two_products_back_to_back_form_a_chain(threads):
    """(X Y^T) Z: the rows of T live in a block buffer, never the whole T."""
    source = """def f(float(B,M,K) X, float(B,N,K) Y, float(B,N,P) Z) -> (O) {
        T(b, m, n) +=! X(b, m, k) * Y(b, n, k)
        O(b, m, p) +=! T(b, m, n) * Z(b, n, p)
    }"""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 41, 7), (3, 29, 7), (3, 29, 13))]
    for target in (PLANNED, tiny_caches(PLANNED)):
        options = {"num_threads": threads, "target": target}
        kernel = tcpy.define(source, options=tcpy.Options(**options))
        (chain,) = chains_of(kernel, *args)
        assert chain.body == () and [name for name, _, _ in chain.buffers][:1] == ["block.0"]
        assert "fused S0-S1 over b, m" in str(kernel.explain(*args))
        check(source, args, options, 2e-4)


SMALL = ((23, 7), (23, 7), (23, 5))


@pytest.mark.parametrize("source, shapes", [
    # the second product reads T at row M - 1 - m: another row of the shared loop
    ("""def f(float(M,K) X, float(M,K) Y, float(M,P) Z) -> (O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        O(m, p) +=! T(M - 1 - m, n) * Z(n, p)
    }""", SMALL),
    # the second product sums over m, the first's rows: it needs every row before it runs
    ("""def f(float(M,K) X, float(M,K) Y, float(M,P) Z) -> (O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        O(n, p) +=! T(m, n) * Z(m, p)
    }""", SMALL),
    # Y and Z (each 64 x 64 floats) together exceed half of the tiny caches' L3: every block of
    # rows would read them again from memory (an MLP's weights), so the products stay apart
    ("""def f(float(M,K) X, float(K,N) Y, float(N,P) Z) -> (O) {
        T(m, n) +=! X(m, k) * Y(k, n)
        O(m, p) +=! T(m, n) * Z(n, p)
    }""", ((23, 64), (64, 64), (64, 64))),
    # T is an output: it is written whole
    ("""def f(float(M,K) X, float(M,K) Y, float(M,P) Z) -> (T, O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        O(m, p) +=! T(m, n) * Z(n, p)
    }""", SMALL),
    # a third statement reads T too
    ("""def f(float(M,K) X, float(M,K) Y, float(M,P) Z) -> (O, R) {
        T(m, n) +=! X(m, k) * Y(n, k)
        O(m, p) +=! T(m, n) * Z(n, p)
        R(m) +=! T(m, n)
    }""", SMALL),
])
def test_back_to_back_products_that_cannot_chain_stay_apart(source, shapes):
    rng = np.random.default_rng(6)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    options = tcpy.Options(num_threads=2, target=tiny_caches(PLANNED))
    assert chains_of(tcpy.define(source, options=options), *args) == []
    want = tcpy.define(source, backend="reference")(*args)
    got = tcpy.define(source, options=options)(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)


def test_a_row_read_at_another_row_stays_unchained():
    # E reads T at row M - 1 - m: not the shared point, so T's rows cannot be a block's own
    source = """def f(float(M,K) X, float(M,K) Y, float(M,P) Z) -> (O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        R(m) max=! T(m, n)
        E(m, n) = exp(T(M - 1 - m, n) - R(m))
        O(m, p) +=! E(m, n) * Z(n, p)
    }"""
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((23, 7), (23, 7), (23, 5))]
    assert chains_of(tcpy.define(source), *args) == []
    check(source, args, {"num_threads": 2}, 2e-4)


def test_a_product_summing_the_shared_loop_adds_each_block():
    # the last product sums over m, the rows' shared loop: each block of rows adds its terms
    # to the whole output (zeroed first), the blocks one after the other
    source = """def f(float(M,K) X, float(N,K) Y, float(M,P) Z) -> (O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        R(m) max=! T(m, n)
        E(m, n) = exp(T(m, n) - R(m))
        O(n, p) +=! E(m, n) * Z(m, p)
    }"""
    rng = np.random.default_rng(3)
    for m in (19, 48):
        args = [rng.standard_normal(s).astype(np.float32) for s in ((m, 7), (29, 7), (m, 5))]
        for rows in ((), (24,)) if m == 48 else ((),):
            options = {"num_threads": 2, "plan": {"rows": rows[0]}} if rows else {"num_threads": 2}
            (chain,) = chains_of(tcpy.define(source, options=tcpy.Options(**options)), *args)
            assert [p.cleared for p in chain.heads + chain.tails] == [False, True]
            assert m % chain.rows == 0 and (not rows or chain.rows == 24)
            check(source, args, options, 2e-4)


def test_a_score_tensor_that_is_an_output_stays_unchained():
    source = """def f(float(M,K) X, float(N,K) Y, float(N,P) Z) -> (T, O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        R(m) max=! T(m, n)
        E(m, n) = exp(T(m, n) - R(m))
        O(m, p) +=! E(m, n) * Z(n, p)
    }"""
    rng = np.random.default_rng(4)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((11, 7), (13, 7), (13, 5))]
    assert chains_of(tcpy.define(source), *args) == []
    reference = tcpy.define(source, backend="reference")(*args)
    for got, want in zip(tcpy.define(source)(*args), reference):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


SIZES = [(1, 3, 37, 16), (2, 1, 131, 7), (1, 2, 97, 13)]


# every size at every thread count, the runnable presets taken in turn (not all combinations:
# each case compiles two kernels)
@pytest.mark.parametrize("b, h, s, d, threads, target", [
    (*size, threads, RUNNABLE[(i + j) % len(RUNNABLE)])
    for i, size in enumerate(SIZES) for j, threads in enumerate([1, 2, 7])])
def test_attention_chain_at_odd_and_prime_sizes(b, h, s, d, threads, target):
    rng = np.random.default_rng(s)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    args = [q, k, v, np.float32(d ** -0.5)]
    for t in (target, tiny_caches(Target.preset(target))):
        options = {"num_threads": threads, "target": t}
        assert len(chains_of(tcpy.define(demo.ATTENTION, options=tcpy.Options(**options)), *args)) == 1
        check(demo.ATTENTION, args, options, 1e-4)


SCALED_DOUBLE_ATTENTION = """def attention(double(B,H,L,D) Q, double(B,H,S,D) K, double(B,H,S,D) V) -> (O) {
    Sc(b, h, l, s) +=! 0.17677669 * Q(b, h, l, d) * K(b, h, s, d)
    Mx(b, h, l) max=! Sc(b, h, l, s)
    E(b, h, l, s) = exp(Sc(b, h, l, s) - Mx(b, h, l))
    Sm(b, h, l) +=! E(b, h, l, s)
    P(b, h, l, s) = E(b, h, l, s) / Sm(b, h, l)
    O(b, h, l, d) +=! P(b, h, l, s) * V(b, h, s, d)
}"""


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_double_attention_scaled_by_a_literal_scales_by_its_float32_value(threads):
    """The literal is float32 in TC (0.17677669f): the chained scores scale by that value in
    double, as the reference does (the engine used the double 0.17677669, 1e-8 off)."""
    rng = np.random.default_rng(threads)
    q, k, v = (rng.standard_normal((1, 2, 37, 32)) for _ in range(3))
    kernel = tcpy.define(SCALED_DOUBLE_ATTENTION, options=tcpy.Options(num_threads=threads))
    assert len(chains_of(kernel, q, k, v)) == 1
    want = tcpy.define(SCALED_DOUBLE_ATTENTION, backend="reference")(q, k, v)
    np.testing.assert_allclose(kernel(q, k, v), want, rtol=1e-12, atol=1e-13)


SOFTMAX_TIMES_V = """def f(float(M,K) X, float(N,K) Y, float(N,P) Z, float(M) W) -> (O) {
    T(m, n) +=! X(m, k) * Y(n, k)
    R(m) max=! T(m, n)
    E(m, n) = exp(T(m, n) - R(m))
    S(m) +=! E(m, n) * W(m)
    Q(m, n) = E(m, n) / S(m)
    O(m, p) +=! Q(m, n) * Z(n, p)
}"""


def deferred_chain(source, args, threads=2, target=None):
    kernel = tcpy.define(source, options=tcpy.Options(num_threads=threads, target=target or PLANNED))
    (chain,) = chains_of(kernel, *args)
    return kernel, chain


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_a_quotient_read_only_by_the_last_product_is_deferred(threads):
    """Q = E / S runs as O = (E . Z) / S: the same values as the reference, no Q buffer."""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((37, 5), (31, 5), (31, 13))]
    args.append(rng.uniform(0.5, 2, 37).astype(np.float32))
    kernel, chain = deferred_chain(SOFTMAX_TIMES_V, args, threads, tiny_caches(PLANNED))
    assert chain.deferred is not None
    explained = str(kernel.explain(*args))
    assert "Q = E / S is read only by S5" in explained and "Q ->" not in explained
    check(SOFTMAX_TIMES_V, args, {"num_threads": threads, "target": tiny_caches(PLANNED)}, 2e-4)


def test_rows_with_a_zero_or_non_finite_divisor_take_the_quotient_itself():
    """A row whose S is 0, inf or NaN gives what Q = E / S gives (inf, NaN or 0 terms), not
    what dividing the product's sum would."""
    rng = np.random.default_rng(6)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((13, 5), (11, 5), (11, 7))]
    w = np.ones(13, np.float32)
    w[[1, 4, 7, 10]] = [0.0, np.inf, np.nan, -0.0]
    args.append(w)
    _, chain = deferred_chain(SOFTMAX_TIMES_V, args)
    assert chain.deferred is not None
    got = tcpy.define(SOFTMAX_TIMES_V)(*args)
    want = tcpy.define(SOFTMAX_TIMES_V, backend="reference")(*args)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)  # (NaN where the reference has NaN)
    # S = 0: terms of inf and -inf (NaN), where the divided sum would be +-inf; S = inf: 0
    assert np.isnan(got[1]).all() and np.all(got[4] == 0) and np.isnan(got[7]).all()


def test_rows_whose_undivided_sum_overflows_are_computed_again():
    """E . Z overflows float32 while (E / S) . Z does not: those rows take Q itself."""
    source = """def f(float(M,K) X, float(N,K) Y, float(N,P) Z, float(M) W) -> (O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        R(m) max=! T(m, n)
        E(m, n) = (T(m, n) - R(m) + 2) * W(m)
        S(m) +=! E(m, n)
        Q(m, n) = E(m, n) / S(m)
        O(m, p) +=! Q(m, n) * Z(n, p)
    }"""
    rng = np.random.default_rng(7)
    args = [rng.uniform(0.5, 1, s).astype(np.float32) for s in ((17, 3), (19, 3), (19, 5))]
    args[2] *= 1e10
    w = np.ones(17, np.float32)
    w[[2, 9]] = 1e30  # E ~ 1e30, E . Z ~ 1e41: inf before the division
    args.append(w)
    _, chain = deferred_chain(source, args)
    assert chain.deferred is not None
    got = tcpy.define(source)(*args)
    want = tcpy.define(source, backend="reference")(*args)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-4)


def test_a_quotient_of_the_first_products_rows_is_not_deferred():
    """Q = T / R with T the first product's own block: chained, Q computed row by row."""
    source = """def f(float(M,K) X, float(N,K) Y, float(N,P) Z) -> (O) {
        T(m, n) +=! X(m, k) * Y(n, k)
        R(m) +=! T(m, n)
        Q(m, n) = T(m, n) / R(m)
        O(m, p) +=! Q(m, n) * Z(n, p)
    }"""
    rng = np.random.default_rng(8)
    args = [rng.uniform(0.5, 1, s).astype(np.float32) for s in ((23, 5), (29, 5), (29, 3))]
    _, chain = deferred_chain(source, args)
    assert chain.deferred is None
    check(source, args, {"num_threads": 2}, 2e-4)


def test_rows_whose_quotient_would_overflow_take_the_quotient_itself():
    """Row 0: E = 1 everywhere and S a denormal, so E / S is inf and the row's terms inf and
    -inf (NaN); the undivided sum over Z's columns of +1 and -1 is exactly 0, and 0 / S = 0
    would hide that: a divisor below 1 in magnitude never defers."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    x[0] = 0  # T(0, n) = 0: R(0) = 0, E(0, n) = 1
    y = rng.standard_normal((8, 3)).astype(np.float32)
    z = np.tile(np.array([[1.0], [-1.0]], np.float32), (4, 3))
    w = np.ones(5, np.float32)
    w[0] = 1e-45
    args = [x, y, z, w]
    _, chain = deferred_chain(SOFTMAX_TIMES_V, args)
    assert chain.deferred is not None
    got = tcpy.define(SOFTMAX_TIMES_V)(*args)
    want = tcpy.define(SOFTMAX_TIMES_V, backend="reference")(*args)
    assert np.isnan(want[0]).all() and np.isnan(got[0]).all()
    np.testing.assert_allclose(got[1:], want[1:], rtol=2e-4, atol=2e-4)
