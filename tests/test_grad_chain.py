"""Backward defs that run as chains of several products (attention's: the scores and the
probabilities' cotangent of a block of query rows, the rows, then dQ, dK and dV, the last two
summing the blocks): checked against the reference evaluator and torch.autograd, and the
temporaries of attention's gradient counted."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy import demo
from tcpy.loopir import BlockChain

CAUSAL_ATTENTION = """
def attention(float(B,H,L,D) Q, float(B,H,L,D) K, float(B,H,L,D) V, float scale) -> (O) {
    Sc(b, h, l, s) +=! Q(b, h, l, d) * K(b, h, s, d)
    Mk(b, h, l, s) = s <= l ? Sc(b, h, l, s) : -1e30
    Mx(b, h, l) max=! Mk(b, h, l, s)
    E(b, h, l, s) = exp(scale * (Mk(b, h, l, s) - Mx(b, h, l)))
    Sm(b, h, l) +=! E(b, h, l, s)
    P(b, h, l, s) = E(b, h, l, s) / Sm(b, h, l)
    O(b, h, l, d) +=! P(b, h, l, s) * V(b, h, s, d)
}
"""
SOURCES = {"attention": demo.ATTENTION, "causal": CAUSAL_ATTENTION}
QKV = ("Q", "K", "V")
# (the kernels specialised to the calls' sizes: a generic kernel, serving a shape's first calls,
# runs no chain)
SPECIALIZED = {"specialize": "always"}


def chains_of(kernel, *args):
    return [node for nest in kernel.specialize(*args).ir.nests for node in nest.body if isinstance(node, BlockChain)]


def attention_args(rng, b, h, length, d, dtype=np.float32):
    return [rng.standard_normal((b, h, length, d)).astype(dtype) for _ in range(4)]


def check_attention(name, b, h, length, d, scale, options, seed=0):
    """grad of ``name`` wrt Q, K, V runs as one chain and matches the reference evaluator."""
    rng = np.random.default_rng(seed)
    Q, K, V, dO = attention_args(rng, b, h, length, d)
    backward = tcpy.grad(tcpy.define(SOURCES[name], options=options), QKV)
    (chain,) = chains_of(backward, Q, K, V, scale, dO)
    assert [p.cleared for p in chain.heads + chain.tails] == [False, False, False, True, True]
    assert length % chain.rows == 0
    got = backward(Q, K, V, scale, dO)
    want = tcpy.grad(tcpy.define(SOURCES[name], backend="reference"), QKV)(Q, K, V, scale, dO)
    for value, expected in zip(got, want):
        assert value.dtype == np.float32 and value.shape == expected.shape
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("name", sorted(SOURCES))
@pytest.mark.parametrize("b, h, length, d, scale", [(1, 1, 48, 8, 0.35), (2, 3, 40, 16, 1.0), (1, 2, 37, 5, 0.125)])
def test_attention_gradient_is_one_chain(name, b, h, length, d, scale):
    check_attention(name, b, h, length, d, scale, tcpy.Options(target="x86-64-v3", num_threads=2, **SPECIALIZED))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(SOURCES)), b=st.integers(1, 2), h=st.integers(1, 2),
       length=st.sampled_from([8, 24, 30, 64]), d=st.sampled_from([3, 8, 17]),
       scale=st.sampled_from([0.25, 1.0, 2.0]), rows=st.sampled_from([None, 8]), threads=st.integers(1, 2))
def test_attention_gradient_chain_at_random_sizes(name, b, h, length, d, scale, rows, threads):
    plan = {"rows": rows} if rows and length % rows == 0 else {}
    check_attention(name, b, h, length, d, scale,
                    tcpy.Options(target="x86-64-v3", num_threads=threads, plan=plan, **SPECIALIZED), seed=length * d)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_attention_gradient_matches_torch_autograd(name):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    Q, K, V, dO = attention_args(rng, 2, 2, 56, 16)
    scale = 0.25
    leaves = [torch.from_numpy(a).requires_grad_() for a in (Q, K, V)]
    scores = leaves[0] @ leaves[1].transpose(-1, -2)
    if name == "causal":
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, -1e30)
    (torch.softmax(scores * scale, -1) @ leaves[2]).backward(torch.from_numpy(dO))
    got = tcpy.grad(tcpy.define(SOURCES[name], options=tcpy.Options(**SPECIALIZED)), QKV)(Q, K, V, scale, dO)
    for value, leaf in zip(got, leaves):
        want = leaf.grad.numpy()
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_attention_gradient_allocates_no_score_sized_temporary():
    """At (1, 1, 4096, 128) the launcher's temporaries and the chain's per-thread block buffers
    (for every thread) take less than a quarter of the 4096 x 4096 score matrix, from the first
    call (default options: no generic kernel, whose temporaries would be whole)."""
    shape = (1, 1, 4096, 128)
    args = [np.zeros(shape, np.float32)] * 3 + [0.1, np.zeros(shape, np.float32)]
    threads = 2
    backward = tcpy.grad(tcpy.define(demo.ATTENTION, options=tcpy.Options(num_threads=threads)), QKV)
    entry = backward._launch_entry(tuple(args))
    temporaries = sum(int(np.prod(spec[0])) * np.dtype(spec[1]).itemsize for spec in entry.temp_specs)
    (chain,) = chains_of(backward, *args)
    blocks = sum(elements * type_.bits // 8 for _, elements, type_ in chain.buffers) * threads
    blocks += sum(elements * type_.bits // 8 for _, elements, type_ in chain.shared)
    score = 4096 * 4096 * 4
    assert temporaries < 4096 * 128 * 4  # (a row's statistics at most: nothing of L x S)
    assert temporaries + blocks <= score // 4


def test_a_product_summing_rows_needs_its_output_zeroed_only_once_per_batch():
    """Two products after the rows, one summing over the blocked rows, the other along them;
    every block adds into the summed one (set to zero at each batch's first block only)."""
    source = """def f(float(B,M,K) X, float(N,K) Y, float(B,M,P) Z) -> (O, G) {
        T(b, m, n) +=! X(b, m, k) * Y(n, k)
        R(b, m) max=! T(b, m, n)
        E(b, m, n) = exp(T(b, m, n) - R(b, m))
        O(b, m, p) +=! E(b, m, n) * Y(n, p)
        G(b, n, p) +=! E(b, m, n) * Z(b, m, p)
    }"""
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 96, 32), (32, 32), (3, 96, 32))]
    options = tcpy.Options(target="x86-64-v3", num_threads=2, plan={"rows": 16}, **SPECIALIZED)
    kernel = tcpy.define(source, options=options)
    (chain,) = chains_of(kernel, *args)
    assert chain.rows == 16 and [p.cleared for p in chain.heads + chain.tails] == [False, False, True]
    got = kernel(*args)
    want = tcpy.define(source, backend="reference")(*args)
    for value, expected in zip(got, want):
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-4)
    again = kernel(*args)  # (a second call: the summed output starts from zero again)
    np.testing.assert_array_equal(again[1], got[1])
