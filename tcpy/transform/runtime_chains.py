"""Plans of a size-generic kernel's online chains, per call shape.

A generic kernel's chain (attention's scores, softmax and product with V) has its structure
decided at the kernel's nominal sizes and valid at every size (:func:`tcpy.transform.fusion`
checks its legality with the sizes as isl parameters): the statements, the loops over batches
and blocks of rows, the online form, the block buffers (a block of rows and columns, their
sizes fixed from the Target by :mod:`tcpy.transform.chains`). What depends on the sizes is
planned here for each call shape, into one int64 buffer per product (the plan buffer slot of
its statement, after the size block):

``[full, last, rows, panel, pitch]`` then two *variants*, each at the offset the first two give:
a product on a whole block of columns and on the last (shorter) one; where the last block is
the only one, the first offset is the last block's (no whole block runs). The rows the online
form cannot give exactly, computed again as the statements say on one whole row, run the same
variants block after block of the row's columns (:mod:`tcpy.codegen.chains`). A variant
is its operands' bases, ``3 x (1 + loops)`` values (per operand a, b, c: a constant, then its
stride along each loop of the chain: the batch loops, the block's first row, the block's first
column), followed by the run-time engine's plan buffer of that block contraction
(:func:`tcpy.transform.runtime_plan.contraction_buffer`). Each product runs, at a call, the
micro-tile the planner gives its N on a block among the two its routines hold (its plan's and
its ``small_tile``, :func:`tcpy.transform.engines.call_tile`: attention's key rows of 256 take
6x64, not 8x48 whose last sliver would be a third full). ``pitch`` is the elements between the rows of
the block buffers at this call: the call's key row rounded up to whole columns of the first
product's micro-tile, at most the plan's columns; ``rows`` the call's rows per block: what the
block buffers hold at that pitch (a short key row, more rows: each packed b serves more of
them), fewer when the blocks would not occupy every thread, then evened out over as many
blocks; ``panel`` the elements of the product's b on a whole block of columns (on the only
block where there is one), packed (each thread packs b of every block of columns once per
batch, ``panel`` elements apart).
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Mapping, Optional

import numpy as np

from ..contraction_ir import Contraction
from ..lang import ast
from ..loopir import ChainProduct, FusedGroup, Program, Statement
from ..options import Options
from ..schedule import volume
from .engines import call_tile, shape_block
from .recognition import _access, block_contraction, statement_accesses
from . import runtime_plan
from .runtime_plan import contraction_sections

# a product's plan buffer starts with: the offsets of its variants (a whole block of columns, the
# last block), the rows per block, the elements of b's packed panel, the block buffers' row pitch
HEADER = ("full", "last", "rows", "panel", "pitch")
FIELD = {name: index for index, name in enumerate(HEADER)}


def bases_length(group: FusedGroup) -> int:
    """Values of a variant's bases: per operand, a constant and a stride per chain loop."""
    return 3 * (1 + len(group.shared) + 1)


def most_rows(chain_plan) -> int:
    """The most rows per block at any call (at the shortest pitch: a multiple of the narrowest
    of the first product's micro-tiles): the rows that the per-row buffers (running maximum,
    sum, flags) hold."""
    head = chain_plan.products[0].plan
    narrowest = min(head.nr, head.small_tile[1]) if head.small_tile else head.nr
    return chain_plan.rows * chain_plan.columns // narrowest


def _row_bytes(program: Program, blocked, pitch: int) -> int:
    """Bytes of one row of the ``blocked`` buffers whose rows are ``pitch`` elements apart."""
    return sum((pitch if row > 1 else 1) * program.types[tensor].bits // 8 for tensor, _, row in blocked)


@dataclasses.dataclass(frozen=True)
class ProductTemplate:
    """What a chain product's plans share at every call: its statement, its accesses by tensor
    (walked once, not per call) and its plan at the nominal sizes."""

    product: ChainProduct  # the chain plan's product on a block of columns
    statement: Statement
    accesses: Mapping[str, ast.Access]


@dataclasses.dataclass(frozen=True)
class ChainTemplate:
    """The size-independent part of a chain's per-call planning (:func:`chain_template`),
    built once per kernel: :func:`chain_buffers` computes only what the call's sizes change."""

    program: Program
    group: FusedGroup
    origins: tuple[int, ...]  # the members' def statements
    loops: tuple[str, ...]  # the chain loops the bases move along
    blocks: Mapping[str, str]  # tensor -> its block buffer
    capacity: int  # the block buffers' bytes (the plan's rows at its columns)
    products: tuple[ProductTemplate, ...]


def chain_template(program: Program, group: FusedGroup) -> ChainTemplate:
    """The parts of ``group``'s chain plans that no call size changes."""
    chain, chain_plan = group.chain, group.chain.plan
    products = []
    for product in chain_plan.products:
        statement = program.statements[product.stmt]
        products.append(ProductTemplate(product, statement, statement_accesses(statement.stmt)))
    return ChainTemplate(
        program, group, tuple([program.statements[i].origin for i in group.statements]),
        group.shared[:-1] + (chain.block_var, chain.online.column_var),
        {tensor: buffer for tensor, buffer, _ in chain_plan.blocked},
        chain_plan.rows * _row_bytes(program, chain_plan.blocked, chain_plan.columns), tuple(products))


def chain_buffers(template: ChainTemplate, ranges, shapes, sizes: Mapping[str, int],
                  options: Options, threads: int) -> Optional[dict[int, np.ndarray]]:
    """The plan buffers of a chain's products (statement index -> buffer), ``template`` its
    :func:`chain_template`, at a call's ``ranges`` (per def statement), ``shapes`` and ``sizes``
    for ``threads`` threads; None when at these sizes the chain cannot run generically (an
    empty range, or a product that is no block contraction there): the call then needs a
    kernel specialised to it."""
    program, group = template.program, template.group
    chain, chain_plan = group.chain, group.chain.plan
    online = chain.online
    empty = {v for origin in template.origins for v, (lo, hi) in ranges[origin].items() if hi <= lo}
    if empty:
        # planned with one value of each empty variable; its extent is 0 in the products' plan
        # buffers (no keys, no head dimension: empty sums, whose cells write zeros) or its
        # loops do not run (no rows, no batches)
        ranges = {o: {v: (lo, max(hi, lo + 1)) for v, (lo, hi) in ranges[o].items()} for o in template.origins}
        shapes = {name: tuple([max(1, d) for d in shape]) for name, shape in shapes.items()}
    first = ranges[template.origins[0]]
    extent = first[chain.block_var][1] - first[chain.block_var][0]
    lo, hi = ranges[program.statements[online.maximum].origin][online.column_var]
    columns = chain_plan.columns
    calls, tiles = [], []
    for part in template.products:
        own = ranges[part.statement.origin]
        con = _at_sizes(part.statement.engine.contraction, part.accesses, own, shapes, sizes)
        if con is None:
            return None
        calls.append(con)
        # N at this call (the roles' extents are the nominal ones), on a block: along the key
        # row, one block of columns at most
        extents = {v: own[v][1] - own[v][0] for v in part.statement.engine.contraction.role_vars("n")}
        if online.column_var in extents:
            extents[online.column_var] = min(extents[online.column_var], columns)
        n = volume(extents.values())
        tiles.append(call_tile(options.target, con.dtype.bits // 8, n, part.product.plan))
    # the block buffers' row pitch: whole micro-tile columns of the first product's tile at this call
    step = tiles[0][1]
    pitch = min(columns, max(step, -(-(hi - lo) // step) * step))
    mr = math.lcm(*(mr for mr, _ in tiles))
    # the rows that the block buffers' capacity (the plan's rows at its columns) holds at this pitch
    fit = template.capacity // _row_bytes(program, chain_plan.blocked, pitch)
    rows = fit // mr * mr or fit
    rows = min(rows, -(-extent // mr) * mr)
    outer = volume(first[v][1] - first[v][0] for v in group.shared[:-1])
    team = threads if group.parallel else 1
    while rows > mr and outer * -(-extent // rows) < team:
        rows -= mr  # fewer rows per block so that every thread has one
    blocks = -(-extent // rows)
    rows = min(rows, -(-extent // (blocks * mr)) * mr)  # as many blocks, of even sizes (not 246 rows and 10)
    rest = (hi - lo) % columns or columns
    one_block = hi - lo < columns  # (the last block is the only one: no whole block runs)
    in_program = SimpleNamespace(shapes=shapes, sizes=sizes)
    buffers = {}
    for part, con, tile in zip(template.products, calls, tiles):
        own = ranges[part.statement.origin]
        variants, panel = [], 0
        for count in (columns, rest):
            if count == columns and one_block or count == rest == columns and variants:
                variants.append(None)  # (no whole block, or the columns divide the range: no shorter one)
                continue
            found = block_contraction(con, part.statement.stmt, own, group.shared[:-1], chain.block_var, rows,
                                      template.blocks, in_program, (online.column_var, count, pitch), part.accesses)
            if found is None:
                return None
            block, bases = found
            if count == (rest if one_block else columns):
                panel = block.size("k") * -(-block.size("n") // tile[1]) * tile[1]
            sections = _block_sections(block, tile, part.product.contraction, options.target)
            if sections is None:
                return None
            if empty:
                for role in ("n", "k"):
                    if empty & set(block.role_vars(role)):
                        sections[0][1][runtime_plan.field(role)] = 0
            values = []
            for base in bases:
                strides = dict(base.strides)
                values.append(base.offset - sum(s * own[v][0] for v, s in strides.items()))
                values.extend(strides.get(v, 0) for v in template.loops)
            variants.append((values, sections))
        # [header, then per variant its bases and its block contraction's plan buffer], in one array
        at = [len(HEADER)]
        full, last = variants
        at.append(at[0] + (len(full[0]) + full[1][-1][2] if full is not None else 0))
        if last is None:
            at[1] = at[0]
        header = [*at, rows, panel, pitch]
        buffer = np.empty(len(header) + sum(len(v[0]) + v[1][-1][2] for v in variants if v is not None), np.int64)
        buffer[:len(header)] = header
        end = len(header)
        for variant in variants:
            if variant is not None:
                values, sections = variant
                buffer[end:end + len(values)] = values
                runtime_plan.assemble(sections, buffer, end + len(values))
                end += len(values) + sections[-1][2]
        buffers[part.product.stmt] = buffer
    return buffers


def _block_sections(block: Contraction, tile: tuple[int, int], nominal: Contraction, target) -> Optional[list]:
    """The run-time engine's plan buffer of ``block`` (planned with the micro-tile ``tile`` on
    ``target``), as its sections (:func:`tcpy.transform.runtime_plan.contraction_sections`; not
    kept across call shapes: a block's extents are the call's rows and columns per block, whose
    pairs seldom repeat)."""
    return contraction_sections(block, shape_block(block, target, tile), nominal)


def _at_sizes(nominal: Contraction, accesses, ranges, shapes, sizes) -> Optional[Contraction]:
    """``nominal`` (a chain product as recognised at the kernel's nominal sizes, ``accesses``
    its statement's) with its operands' offsets and strides at a call's sizes: the roles stay
    the nominal ones (a variable of extent 1 at these sizes keeps its role, with one value)."""
    operands = {}
    for which in "abc":
        acc = getattr(nominal, which)
        found = _access(acc.tensor, accesses[acc.tensor].indices, acc.dtype, ranges, sizes, shapes)
        if found is None:
            return None
        operands[which] = found
    return dataclasses.replace(nominal, **operands)


def describe(buffer: np.ndarray, group: FusedGroup, stmt: int) -> str:
    """What the chain product ``stmt`` of ``group`` runs with its plan ``buffer`` (at a call's
    shape): the rows per block, and on a whole block of columns its run-time engine plan."""
    chain, chain_plan = group.chain, group.chain.plan
    product = next(p for p in chain_plan.products if p.stmt == stmt)
    block = buffer[int(buffer[0]) + bases_length(group):]
    return (f"in the chain, on blocks of {int(buffer[FIELD['rows']])} rows of {chain.block_var} and "
            f"{chain_plan.columns} columns of {chain.online.column_var} (the block buffers' rows "
            f"{int(buffer[FIELD['pitch']])} apart: at most {chain_plan.rows} rows of {chain_plan.columns}), b packed once per "
            f"batch for every block of columns, A's rows read in place where they run along K: "
            f"{runtime_plan.describe(block, product.plan)}")
