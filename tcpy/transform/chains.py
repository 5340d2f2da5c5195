"""How each fused chain runs, decided once (Program -> Program).

:mod:`tcpy.transform.fusion` finds the chains (a contraction, the statements on its rows, a
contraction reading them; or two products back to back) and checks that they are legal.
:func:`plan_chains` then decides how each one runs and stamps the decision on it as a
:class:`tcpy.loopir.ChainPlan`, with its reasons: whether the loop over batches and blocks of
rows is parallel and in how many chunks, where the products' b operand is packed (by each
block's cell, once per batch by each thread, or once per batch by one thread for all), and
each product's plan on a block of rows (and an online chain's on its last, shorter block of
columns and on one whole row). Lowering (:mod:`tcpy.lower_chains`) and the renderer read the
stamp and decide nothing.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from ..loopir import ChainPlan, ChainProduct, FusedGroup, Prepack, Program
from ..options import Options
from ..schedule import PARALLEL_MIN_WORK, volume
from .engines import plan_block
from .recognition import block_contraction

PREPACK_PREFIX = "prepack."  # b of a chain's product, packed once per batch
WHOLE_PREFIX = "whole."  # one whole row of a block buffer (an online chain's rows computed again)


def plan_chains(program: Program, options: Options) -> Program:
    """``program`` with each fused group stamped with whether its shared loops run in parallel,
    and each chain with its :class:`ChainPlan`."""
    groups = []
    for group in program.groups:
        group = dataclasses.replace(group, parallel=_parallel(program, group, options))
        if group.chain is not None:
            group = dataclasses.replace(group, chain=dataclasses.replace(group.chain,
                                                                         plan=_plan(program, group, options)))
        groups.append(group)
    return dataclasses.replace(program, groups=tuple(groups))


def _parallel(program: Program, group: FusedGroup, options: Options) -> bool:
    """Whether a fused group's shared loops run in parallel: there is enough work, and they
    have at least two iterations."""
    ranges = program.statements[group.statements[0]].ranges
    iterations = volume(max(ranges[v][1] - ranges[v][0], 0) for v in group.shared)
    work = sum(volume(program.statements[i].extents().values()) for i in group.statements)
    return options.parallel and options.threads > 1 and work >= PARALLEL_MIN_WORK and iterations >= 2


def _plan(program: Program, group: FusedGroup, options: Options) -> ChainPlan:
    chain = group.chain
    ranges = program.statements[group.statements[0]].ranges
    lo, hi = ranges[chain.block_var]
    blocks = -(-(hi - lo) // chain.rows)
    batches = volume(ranges[v][1] - ranges[v][0] for v in group.shared[:-1])
    threads = options.threads if group.parallel else 1
    # b depends on the batch loops only: packed once per batch when a thread runs several of
    # its blocks in a row (static schedule: consecutive iterations), else by the cell per block;
    # with fewer batches than threads, once for all threads (one copy, not one per thread).
    # An online chain packs b of every block of columns, one after the other.
    shared = group.parallel and batches < threads and blocks >= 2
    reuse = shared or (blocks >= 2 and batches * blocks >= 2 * threads)
    prepack = Prepack.SHARED if shared else Prepack.PER_THREAD if reuse else Prepack.NONE
    chunks = blocks if shared else batches * blocks
    blocked = {tensor: buffer for tensor, buffer, _ in chain.blocked}
    online = chain.online
    columns = online.columns if online else 0
    products, packed = _products(program, group, options, chain.rows, blocked, reuse, columns)
    last_products = whole_products = None
    whole, panels = (), ()
    if online is not None:
        column_lo, column_hi = program.statements[online.maximum].ranges[online.column_var]
        panels = tuple(size for _, size, _ in packed)
        sizes = [size * ((column_hi - column_lo) // columns) for size in panels]
        rest = (column_hi - column_lo) % columns
        if rest:
            last_products, last_packed = _products(program, group, options, chain.rows, blocked, reuse, rest)
            sizes = [size + more for size, (_, more, _) in zip(sizes, last_packed)]
        packed = [(name, size, dtype) for (name, _, dtype), size in zip(packed, sizes)]
        whole = tuple((tensor, f"{WHOLE_PREFIX}{k}", column_hi - column_lo if row > 1 else row)
                      for k, (tensor, _, row) in enumerate(chain.blocked))
        whole_products, _ = _products(program, group, options, 1, {t: b for t, b, _ in whole}, False)
    reasons = (_parallel_reason(group, chunks, threads, shared),
               _prepack_reason(group, prepack, batches, blocks, threads))
    return ChainPlan(chunks, prepack, products, last_products, whole_products, whole, tuple(packed), panels,
                     reasons)


def _products(program: Program, group: FusedGroup, options: Options, rows: int, buffers: Mapping[str, str],
              reuse: bool, columns: int = 0) -> tuple[tuple[ChainProduct, ChainProduct], list]:
    """A chain's two products on a block of ``rows`` rows (and of ``columns`` columns, if > 0),
    the tensors in ``buffers`` in those per-thread buffers; with ``reuse``, b packed once per
    batch (the buffers to hold one block's b come second: name, elements, type)."""
    chain = group.chain
    block_columns = (chain.online.column_var, columns, chain.online.columns) if columns else None
    packed, products = [], []
    for k, index in enumerate((group.statements[0], group.statements[-1])):
        statement = program.statements[index]
        block, bases = block_contraction(statement.engine.contraction, statement.stmt, statement.ranges,
                                         group.shared[:-1], chain.block_var, rows, buffers, program, block_columns)
        if columns and k == 1:
            block = dataclasses.replace(block, init=False)  # sums over the blocks of columns (rows start at 0)
        block_plan = plan_block(block, options, b_packed_once=reuse)
        prepacked = None
        if reuse:
            prepacked = f"{PREPACK_PREFIX}{k}"
            padded_n = -(-block.size("n") // block_plan.nr) * block_plan.nr
            packed.append((prepacked, block.size("k") * padded_n, block.dtype))
        products.append(ChainProduct(index, block, block_plan, bases, prepacked))
    return tuple(products), packed


def _parallel_reason(group: FusedGroup, chunks: int, threads: int, shared: bool) -> str:
    loops = f"blocks of {group.chain.block_var}" if shared else ", ".join(
        group.shared[:-1] + (f"blocks of {group.chain.block_var}",))
    if not group.parallel:
        return f"one thread runs the loops over {loops} (too little work, one iteration, or one thread)"
    return f"parallel over {loops}: {chunks} iterations for {threads} threads"


def _prepack_reason(group: FusedGroup, prepack: Prepack, batches: int, blocks: int, threads: int) -> str:
    products = f"S{group.statements[0]} and S{group.statements[-1]}"
    if prepack is Prepack.SHARED:
        return (f"b of {products} depends on the batch loops only and {batches} batches are fewer than "
                f"{threads} threads: one thread packs it once per batch for all")
    if prepack is Prepack.PER_THREAD:
        return (f"b of {products} depends on the batch loops only: each thread packs it once per batch into "
                f"its own buffer ({batches} x {blocks} blocks for {threads} threads)")
    return f"each block's products pack b themselves ({batches} x {blocks} blocks for {threads} threads)"
