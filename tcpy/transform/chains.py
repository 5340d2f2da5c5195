"""How each fused group and chain runs, decided once (Program -> Program).

:mod:`tcpy.transform.fusion` finds the groups and chains (a contraction, the statements on its
rows, a contraction reading them; or two products back to back), checks that they are legal
and which forms their rows allow (a deferred quotient, online softmax). :func:`plan_chains`
then decides how each one runs and stamps the decision on it, with its reasons: whether a
group's shared loops run in parallel (:attr:`tcpy.loopir.FusedGroup.parallel`), and a chain's
:class:`tcpy.loopir.ChainPlan`: rows per block (their buffers fit half of L2), whether its
columns run in blocks too (online softmax, when a block of whole rows would not fit) and how
many, the loops of the statements on a block of columns, the parallel loop's chunks, where
the products' b operand is packed (by each block's cell, once per batch by each thread, or
once per batch by one thread for all), and each product's plan on a block (and an online
chain's on its last, shorter block of columns and on one whole row). Lowering
(:mod:`tcpy.lower_chains`) and the renderer read the stamp and decide nothing.

Fusion asks :func:`rereads_pay` (which weighs the row block this pass would choose) whether
two products back to back are worth chaining: that is whether a chain exists at all, so it is
decided with the grouping, by this module's rule.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from ..errors import TCOptionError
from ..lang.visit import inline_lets
from ..loopir import Chain, ChainPlan, ChainProduct, FusedGroup, Prepack, Program
from ..options import Options
from ..schedule import PARALLEL_MIN_WORK, volume
from .engines import plan_block, stamp_loops
from .recognition import block_contraction

# Micro-tiles of rows per block of an online chain (fewer columns per block, more rows): 16 x 6
# rows of blocks of 336 columns ran 10-15% faster than 30 rows of 1024 (the block buffers'
# rows 4 KiB apart share their L1 sets) and as fast as 126 rows of 256 (attention 1x1x16384x64).
KEY_BLOCK_TILES = 16
# ... and in a size-generic kernel's chain, whose blocks of columns have that size at every size:
# 4 micro-tiles of rows of 2016 columns ran faster than 16 of 480 (attention 1x8x2048x64 by 7%,
# 4x12x256x64 by 30%: its b packed once per batch serves more blocks of rows), and than 2 or 1.
GENERIC_KEY_BLOCK_TILES = 4
PREPACK_PREFIX = "prepack."  # b of a chain's product, packed once per batch
WHOLE_PREFIX = "whole."  # one whole row of a block buffer (an online chain's rows computed again)


def plan_chains(program: Program, options: Options) -> Program:
    """``program`` with each fused group stamped with whether its shared loops run in parallel,
    and each chain with its :class:`ChainPlan`."""
    groups = []
    for group in program.groups:
        parallel, why = _parallel(program, group, options)
        group = dataclasses.replace(group, parallel=parallel)
        if group.chain is not None:
            group = dataclasses.replace(group, chain=dataclasses.replace(group.chain,
                                                                         plan=_plan(program, group, why, options)))
        groups.append(group)
    return dataclasses.replace(program, groups=tuple(groups))


def _parallel(program: Program, group: FusedGroup, options: Options) -> tuple[bool, str]:
    """Whether a fused group's shared loops run in parallel (there is enough work, and they
    have at least two iterations), and if not why not."""
    ranges = program.statements[group.statements[0]].ranges
    # (a chain summing its blocks of rows runs a batch's blocks in one thread)
    loops = group.shared[:-1] if group.chain is not None and group.chain.accumulating else group.shared
    iterations = volume(max(ranges[v][1] - ranges[v][0], 0) for v in loops)
    work = sum(volume(program.statements[i].extents().values()) for i in group.statements)
    if not options.parallel or options.threads < 2:
        return False, "one thread"
    if program.generic is not None:
        return True, ""  # (a call's own work decides at run time: see tcpy.generic)
    if work < PARALLEL_MIN_WORK:
        return False, f"{work} points in all, fewer than {PARALLEL_MIN_WORK}: too little work for threads"
    if iterations < 2:
        return False, "one iteration" if loops == group.shared else "one batch (its blocks of rows are summed in order)"
    return True, ""


def _plan(program: Program, group: FusedGroup, serial: str, options: Options) -> ChainPlan:
    """The plan of ``group``'s chain (``serial``: why its loops do not run in parallel)."""
    chain = group.chain
    ranges = program.statements[group.statements[0]].ranges
    mr = math.lcm(*(program.statements[i].engine.plan.mr for i in group.products))
    if program.generic is not None:
        return _generic_plan(program, group, mr, options)
    rows, reasons = row_block(program, chain.blocked, ranges, group.shared, mr, options, bool(chain.accumulating))
    blocked, columns = chain.blocked, 0
    whole_bytes = rows * _row_bytes(program, blocked)
    if chain.online is not None and whole_bytes > options.target.l2 // 2:
        head, last = group.statements[0], group.statements[-1]  # (an online chain has one product each side)
        columns = _key_block(program, chain, program.statements[head].engine.plan.nr, mr, options)
        blocked = tuple((tensor, buffer, columns if row > 1 else row) for tensor, buffer, row in blocked)
        rows, reasons = row_block(program, blocked, ranges, group.shared, mr, options)
        reasons += (_online_reason(program, chain, columns, whole_bytes, last),)
    lo, hi = ranges[chain.block_var]
    blocks = -(-(hi - lo) // rows)
    batches = volume(ranges[v][1] - ranges[v][0] for v in group.shared[:-1])
    threads = options.threads if group.parallel else 1
    # b depends on the batch loops only: packed once per batch when a thread runs several of
    # its blocks in a row (static schedule: consecutive iterations), else by the cell per block;
    # with fewer batches than threads, once for all threads (one copy, not one per thread).
    # An online chain packs b of every block of columns, one after the other. A chain summing
    # its blocks runs a batch's blocks in one thread, in order.
    shared = group.parallel and batches < threads and blocks >= 2 and not chain.accumulating
    reuse = shared or (blocks >= 2 and (bool(chain.accumulating) or batches * blocks >= 2 * threads))
    prepack = Prepack.SHARED if shared else Prepack.PER_THREAD if reuse else Prepack.NONE
    chunks = blocks if shared else batches if chain.accumulating else batches * blocks
    buffers = {tensor: buffer for tensor, buffer, _ in blocked}
    products, packed = _products(program, group, options, rows, buffers, reuse, columns, columns)
    last_products = whole_products = None
    whole, panels, block_loops, last_block_loops = (), (), (), ()
    if columns:
        online = chain.online
        column_lo, column_hi = program.statements[online.maximum].ranges[online.column_var]
        panels = tuple(size for _, size, _ in packed)
        sizes = [size * ((column_hi - column_lo) // columns) for size in panels]
        rest = (column_hi - column_lo) % columns
        block_loops = _block_loops(program, online, columns, options)
        if rest:
            last_products, last_packed = _products(program, group, options, rows, buffers, reuse, rest, columns)
            sizes = [size + more for size, (_, more, _) in zip(sizes, last_packed)]
            last_block_loops = _block_loops(program, online, rest, options)
        packed = [(name, size, dtype) for (name, _, dtype), size in zip(packed, sizes)]
        whole = tuple((tensor, f"{WHOLE_PREFIX}{k}", column_hi - column_lo if row > 1 else row)
                      for k, (tensor, _, row) in enumerate(blocked))
        whole_products, _ = _products(program, group, options, 1, {t: b for t, b, _ in whole}, False)
    reasons += (_parallel_reason(group, chunks, threads, shared, serial),
                _prepack_reason(group, prepack, batches, blocks, threads))
    return ChainPlan(rows, columns, blocked, chunks, prepack, products, last_products, whole_products, whole,
                     tuple(packed), panels, block_loops, last_block_loops, reasons)


def _generic_plan(program: Program, group: FusedGroup, mr: int, options: Options) -> ChainPlan:
    """The plan of a size-generic kernel's chain (an online one, :func:`tcpy.transform.fusion`):
    its columns always run in blocks, of a size fixed from the Target as its rows' most, so
    that its block buffers hold a block of rows and columns whatever the sizes; the rows per
    block, each product's extents, cache blocks and operands' bases are planned per call shape
    (:mod:`tcpy.transform.runtime_chains`); b is packed by each block's products."""
    chain = group.chain
    online = chain.online
    head = program.statements[group.statements[0]]
    columns = _key_block(program, chain, head.engine.plan.nr, mr, options, generic=True)
    blocked = tuple((tensor, buffer, columns if row > 1 else row) for tensor, buffer, row in chain.blocked)
    row_bytes = _row_bytes(program, blocked)
    rows = max(mr, options.target.l2 // 2 // row_bytes // mr * mr)
    buffers = {tensor: buffer for tensor, buffer, _ in blocked}
    products, _ = _products(program, group, options, rows, buffers, False, columns, columns)
    tiles = math.lcm(*(p.plan.mr for p in products))  # (the block products' micro-tiles: whole ones)
    if rows % tiles and rows > tiles:
        # (also: 32 rows of 2016 columns put the buffers 63 x 4 KiB apart, each row of one on the
        # L1 sets of the other's, and ran 1.5x slower at 911 keys than 24)
        rows = rows // tiles * tiles
        products, _ = _products(program, group, options, rows, buffers, False, columns, columns)
    column_lo, column_hi = program.statements[online.maximum].ranges[online.column_var]
    whole = tuple((tensor, f"{WHOLE_PREFIX}{k}", column_hi - column_lo if row > 1 else row)
                  for k, (tensor, _, row) in enumerate(chain.blocked))
    whole_products, _ = _products(program, group, options, 1, {t: b for t, b, _ in whole}, False)
    names = ", ".join(tensor for tensor, _, _ in blocked)
    reasons = (f"row block at most {rows} rows of {chain.block_var}: the block buffers of {names} ({rows} x "
               f"{row_bytes} bytes = {rows * row_bytes // 1024} KiB) fit half of L2 ({options.target.l2 // 1024} "
               "KiB); each call's shape takes as many rows as they hold at its key row's length, in whole "
               "micro-tiles, fewer when its blocks would not occupy every thread",
               f"online softmax at every size (a size-generic kernel): {online.column_var} runs in blocks of "
               f"{columns}, the last one shorter; the rows' running maximum and sum rescale the output rows",
               "each block's products pack b themselves; their extents, cache blocks and operands' bases are "
               "planned per call shape (the run-time engine's micro-kernel)")
    block_loops = _block_loops(program, online, columns, options)
    return ChainPlan(rows, columns, blocked, 0, Prepack.NONE, products, None, whole_products, whole,
                     block_loops=block_loops, reasons=reasons)


def _row_bytes(program: Program, blocked) -> int:
    return sum(row * program.types[tensor].bits // 8 for tensor, _, row in blocked)


def row_block(program: Program, blocked, ranges, shared, mr: int, options: Options,
              dividing: bool = False) -> tuple[int, tuple[str, ...]]:
    """Rows per block of a chain whose ``blocked`` tensors have rows of the elements given
    there, and why: the block buffers fit half of L2 (the other half holds the operands'
    slivers), a multiple of ``mr`` (the products' micro-tile rows), and enough blocks for
    every thread (with ``dividing``, a chain summing its blocks: a divisor of the rows, whose
    batches are the threads' work); ``Options.plan['rows']`` instead, if given."""
    target = options.target
    block_var = shared[-1]
    row_bytes = _row_bytes(program, blocked)
    extent = ranges[block_var][1] - ranges[block_var][0]
    if dividing:  # whole micro-tiles where the rows allow: multiples of what mr and they share
        mr = math.gcd(mr, extent) or mr
    rows = max(mr, target.l2 // 2 // row_bytes // mr * mr)
    rows = min(rows, -(-extent // mr) * mr)
    outer = volume(ranges[v][1] - ranges[v][0] for v in shared[:-1])
    threads = options.threads if options.parallel else 1
    while rows > mr and (extent % rows if dividing else outer * -(-extent // rows) < threads):
        rows -= mr  # fewer rows per block so that every thread has one (or that they divide the rows)
    names = ", ".join(tensor for tensor, _, _ in blocked)
    if "rows" in options.plan:
        rows = options.plan["rows"]
        if dividing and (not isinstance(rows, int) or rows < 1 or extent % rows):
            raise TCOptionError(f"Options.plan['rows'] must divide the {extent} rows of {block_var} (a product "
                                f"sums the chain's blocks), got {rows!r}")
        if not dividing and rows % mr:
            raise TCOptionError(f"Options.plan['rows'] must be a multiple of the chain's micro-tile rows ({mr}), "
                                f"got {rows!r}")
        return rows, (f"row block {rows} rows of {block_var}: set by Options.plan",)
    reasons = [f"row block {rows} rows of {block_var} (a multiple of the micro-tiles' {mr}): the block buffers "
               f"of {names} ({rows} x {row_bytes} bytes = {rows * row_bytes // 1024} KiB) fit half of L2 "
               f"({target.l2 // 1024} KiB)"]
    if rows * row_bytes > target.l2 // 2:
        reasons.append(f"one block's rows ({rows * row_bytes // 1024} KiB) exceed half of L2: they stream "
                       "through L3 (the rows are not a softmax whose columns could run in blocks too)")
    if dividing:
        reasons.append(f"{rows} rows divide the {extent} rows of {block_var}: a product sums the blocks")
    elif outer * -(-extent // rows) < threads:
        reasons.append(f"{outer * -(-extent // rows)} blocks for {threads} threads")
    return rows, tuple(reasons)


def rereads_pay(program: Program, engines, blocked, ranges, shared, mr: int, options: Options) -> bool:
    """Whether a pair of products (``engines``) chained on blocks of rows (the row block this
    pass would choose for their ``blocked`` rows) may read both products' b again for each
    block: yes when they fit half of a core's share of L3; else only if those reads move less
    than writing and reading the rows whole would. An MLP's weights (``X W1`` then ``W2``) are
    large and its rows short: apart, each product streams them once."""
    b_bytes = sum(e.contraction.size("n") * e.contraction.size("k") * e.contraction.dtype.bits // 8 for e in engines)
    if b_bytes <= options.target.l3_per_core // 2:
        return True
    rows, _ = row_block(program, blocked, ranges, shared, mr, options)
    extent = ranges[shared[-1]][1] - ranges[shared[-1]][0]
    return -(-extent // rows) * b_bytes <= 2 * extent * _row_bytes(program, blocked)


def _key_block(program: Program, chain: Chain, nr: int, mr: int, options: Options, generic: bool = False) -> int:
    """Columns per block of the online form: a multiple of the first product's micro-tile
    columns such that ``KEY_BLOCK_TILES`` micro-tiles of rows of scores and exponentials fit
    half of L2 (each block of the products' b then serves that many rows before the next); no
    more than the columns there are. A ``generic`` kernel's (``GENERIC_KEY_BLOCK_TILES``) serve
    every number of columns."""
    online = chain.online
    score = program.statements[online.maximum].stmt.rhs.tensor
    bytes_ = program.types[score].bits // 8
    lo, hi = program.statements[online.maximum].ranges[online.column_var]
    tiles = GENERIC_KEY_BLOCK_TILES if generic else KEY_BLOCK_TILES
    columns = max(nr, options.target.l2 // 2 // (tiles * mr * 2 * bytes_) // nr * nr)
    return columns if generic else min(columns, -(-(hi - lo) // nr) * nr)


def _block_loops(program: Program, online, columns: int, options: Options) -> tuple:
    """The loops of an online chain's maximum, exponential and total statements on a block of
    ``columns`` columns (under the chain's parallel loop: one thread each)."""
    inner = dataclasses.replace(options, parallel=False)
    return tuple(stamp_loops(dataclasses.replace(program.statements[i], ranges={
        **program.statements[i].ranges, online.column_var: (0, columns)}), program.shapes, program.types,
        inner, program.generic is not None).loops for i in (online.maximum, online.exponential, online.total))


def _online_reason(program: Program, chain: Chain, columns: int, whole: int, tail: int) -> str:
    online = chain.online

    def written(index: int):  # (as the def says: fusion renamed the row temporaries)
        return inline_lets(program.def_.stmts[program.statements[index].origin])

    mx = written(online.maximum).target
    exponential = written(online.exponential)
    return (f"online softmax: a block of whole rows ({whole // 1024} KiB) would not fit half of L2, so "
            f"{online.column_var} runs in blocks of {columns} too: a running maximum {mx} and sum "
            f"{chain.deferred.divisor} per row; when the maximum grows, the sum and S{tail}'s partial rows are "
            f"multiplied by {exponential.rhs} at the old maximum (S{online.exponential}'s own expression); "
            f"rows whose maximum or sum is not finite, whose sum is below 1 or whose result is not finite are "
            f"computed again whole")


def _products(program: Program, group: FusedGroup, options: Options, rows: int, buffers: Mapping[str, str],
              reuse: bool, columns: int = 0, width: int = 0) -> tuple[tuple[ChainProduct, ...], list]:
    """A chain's products on a block of ``rows`` rows (and of ``columns`` columns, if > 0,
    of the ``width`` a block buffer's row holds), the tensors in ``buffers`` in those
    per-thread buffers; with ``reuse``, b packed once per batch when it depends on the batch
    loops only (the buffers to hold one block's b come second: name, elements, type). A
    product summing over the blocks adds each block's terms to its output."""
    chain = group.chain
    block_columns = (chain.online.column_var, columns, width) if columns else None
    packed, products = [], []
    for k, index in enumerate(group.products):
        statement = program.statements[index]
        block, bases = block_contraction(statement.engine.contraction, statement.stmt, statement.ranges,
                                         group.shared[:-1], chain.block_var, rows, buffers, program, block_columns)
        summed = index in chain.accumulating
        if (columns and index == group.statements[-1]) or summed:
            block = dataclasses.replace(block, init=False)  # sums over the blocks of columns or rows
        own_b = summed or bases[1].tensor in buffers  # (b moves with the blocks)
        block_plan = plan_block(block, options, reuse and not own_b, program.generic is not None)
        prepacked = None
        if reuse and not own_b:
            prepacked = f"{PREPACK_PREFIX}{k}"
            padded_n = -(-block.size("n") // block_plan.nr) * block_plan.nr
            packed.append((prepacked, block.size("k") * padded_n, block.dtype))
        products.append(ChainProduct(index, block, block_plan, bases, prepacked, cleared=summed))
    return tuple(products), packed


def _parallel_reason(group: FusedGroup, chunks: int, threads: int, shared: bool, serial: str) -> str:
    blocks = () if group.chain.accumulating else (f"blocks of {group.chain.block_var}",)
    loops = f"blocks of {group.chain.block_var}" if shared else ", ".join(group.shared[:-1] + blocks)
    if not group.parallel:
        return f"one thread runs the loops over {loops} ({serial})"
    return f"parallel over {loops}: {chunks} iterations for {threads} threads"


def _prepack_reason(group: FusedGroup, prepack: Prepack, batches: int, blocks: int, threads: int) -> str:
    products = f"S{group.statements[0]} and S{group.statements[-1]}"
    counts = f"{batches} batches of {blocks} blocks of rows, {threads} threads"
    if prepack is Prepack.SHARED:
        return (f"b of {products} depends on the batch loops only, and there are fewer batches than threads "
                f"({counts}): one thread packs it once per batch for all")
    if prepack is Prepack.PER_THREAD:
        return (f"b of {products} depends on the batch loops only: each thread packs it into its own buffer when "
                f"its batch changes ({counts})")
    return (f"each block's products pack b themselves ({counts}: b packed once per batch would serve too few "
            f"blocks)")
