"""How a fused chain runs is decided once, by the chain pass (tcpy.transform.chains), after
fusion has found the chain: its row block, its parallel loop, where its products' b is packed
(by each block's cell, by each thread once per batch, or once per batch by one thread for all)
and its products' plans. explain() and loop_ir(after=...) show the decisions and why; every
placement of the packed operands gives the reference's results."""
import numpy as np
import pytest

import tcpy
from tcpy import demo
from tcpy.loopir import BlockChain, Prepack

from test_chain import PLANNED, tiny_caches

pytestmark = pytest.mark.skipif(not PLANNED.can_run_here(), reason="the plans are the x86-64-v3 preset's")


def attention(threads: int):
    return tcpy.define(demo.ATTENTION, options=tcpy.Options(target=tiny_caches(PLANNED), num_threads=threads))


def attention_args(b: int, h: int, length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, length, 16)).astype(np.float32) for _ in range(3))
    return q, k, v, np.float32(0.25)


def test_fusion_finds_the_chain_and_the_chain_pass_decides_how_it_runs():
    kernel = attention(2)
    shapes = ((1, 2, 40, 16),) * 3 + (np.float32(0.25),)
    fused = kernel.loop_ir(*shapes, after="fusion")
    assert "fused S0-S5 over b, h, l" in fused and "Sc -> block.0[rows, 40]" in fused
    assert "why: row block" not in fused and "why: parallel" not in fused
    planned = kernel.loop_ir(*shapes, after="chains")
    assert "why: row block 6 rows of l (a multiple of the micro-tiles' 6)" in planned
    assert "Sc -> block.0[6, 40] (960 bytes)" in planned
    assert "why: parallel over b, h, blocks of l: 14 iterations for 2 threads" in planned
    assert "each thread packs it into its own buffer when its batch changes (2 batches of 7 blocks" in planned
    (chain,) = [node for nest in kernel.specialize(*shapes).ir.nests for node in nest.body
                if isinstance(node, BlockChain)]
    assert (chain.rows, chain.parallel, chain.chunks, chain.prepack) == (6, True, 14, Prepack.PER_THREAD)
    assert "why: parallel over b, h, blocks of l" in str(kernel.explain(*shapes))


@pytest.mark.parametrize("b, h, length, threads, prepack, why", [
    (1, 1, 97, 4, Prepack.SHARED, "fewer batches than threads (1 batches of 6 blocks of rows, 4 threads): "
                                  "one thread packs it once per batch for all"),
    (2, 2, 61, 2, Prepack.PER_THREAD, "each thread packs it into its own buffer when its batch changes"),
    (1, 2, 8, 2, Prepack.NONE, "each block's products pack b themselves (2 batches of 1 blocks of rows"),
])
def test_each_placement_of_the_packed_operands_matches_the_reference(b, h, length, threads, prepack, why):
    kernel = attention(threads)
    args = attention_args(b, h, length)
    (chain,) = [node for nest in kernel.specialize(*args).ir.nests for node in nest.body
                if isinstance(node, BlockChain)]
    assert chain.prepack is prepack
    assert why in str(kernel.explain(*args))
    got, want = kernel(*args), tcpy.define(demo.ATTENTION, backend="reference")(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_a_serial_chain_says_why():
    kernel = attention(2)
    text = str(kernel.explain(*attention_args(1, 2, 8)))
    assert "one thread runs the loops over b, h, blocks of l (" in text and "too little work for threads" in text
    one = attention(1)
    assert "one thread runs the loops over b, h, blocks of l (one thread)" in str(one.explain(*attention_args(1, 2, 8)))
