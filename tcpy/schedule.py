"""The default schedule: loop order, cache tiles, parallel and SIMD loops, per statement.

The heuristics are deliberately simple and explainable:

* **Order.** A variable is *strided* in an access when it indexes a non-innermost dimension, and
  *contiguous* when it indexes the innermost one. Loops are ordered from most strided (outermost)
  to most contiguous (innermost), longer loops innermost on ties, so for
  matmul ``C(m,n) +=! A(m,k) * B(k,n)`` the order is ``m, k, n``: the inner loop walks rows of
  ``B`` and ``C``.
* **Accumulation.** When the innermost loop would be a reduction variable, all reduction
  variables move innermost and the reduction runs in a register (``acc``) that is stored once
  per output element; otherwise the reduction accumulates in the output's memory after an
  initialisation nest. ``half`` targets always use a register accumulator in float32.
* **Tiles.** Only nests that reduce in memory (GEMM-like) are tiled: the register-resident
  patterns gain nothing from it. Tile loops come first (output variables, then reductions).
* **Register tile.** In those nests a block of ``R x V`` outputs (``R`` rows of a second output
  variable, ``V`` contiguous elements of the innermost one) stays in registers across the
  reduction loops, so each loaded input vector feeds ``R`` fused multiply-adds. The row
  variable is the output variable whose accesses share the fewest loads with the inner one
  (``m`` in matmul, the output channel in a convolution).
* **Parallel.** The leading output loops (tile loops, or untiled outer loops) are collapsed into
  one ``omp parallel for`` when the nest has enough work; reduction loops are never parallel.
* **SIMD.** The innermost loop gets ``omp simd`` (with a ``reduction`` clause for ``+``/``*``
  register accumulators).

:class:`Options` lets a user override every choice.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Mapping, Optional

from .lang import ast
from .options import Options
from .target import Target

# Loops with fewer iterations than this in total run serially: OpenMP start-up costs ~1-5 us.
PARALLEL_MIN_WORK = 1 << 15
DEFAULT_TILES = {"inner": 256, "output": 96, "reduction": 256}
# Register tile shapes tried, as (rows, vectors per row); each needs rows * vectors
# accumulators, one register per vector of a row of the streamed operand, and a broadcast.
REGISTER_TILE_SHAPES = ((6, 2), (8, 1), (4, 2), (4, 1))


class Level(enum.Enum):
    """What a schedule dimension iterates over."""

    TILE = "tile"  # cache tiles of a variable
    BLOCK = "block"  # register tiles of a variable
    POINT = "point"  # the variable itself


@dataclass(frozen=True, slots=True)
class StmtSchedule:
    """How one statement's compute nest is laid out.

    ``order`` is the point-loop order (outermost first); ``tiles`` the tiled variables in
    tile-loop order with their sizes; ``parallel_dims`` how many leading schedule dimensions
    may run in parallel (0: serial); ``register_reduction`` whether reduction variables are
    innermost and accumulate in a register.
    """

    order: tuple[str, ...]
    reductions: tuple[str, ...]
    tiles: tuple[tuple[str, int], ...]
    parallel_dims: int
    simd: bool
    register_reduction: bool
    unroll: int
    # (row variable, rows, column variable, columns) of a register tile, or None
    register_tile: Optional[tuple[str, int, str, int]] = None

    def dims(self) -> tuple[tuple[str, Level], ...]:
        """Schedule dimensions as (variable, level), outermost first."""
        tiles = tuple((v, Level.TILE) for v, _ in self.tiles)
        if self.register_tile is None:
            return tiles + tuple((v, Level.POINT) for v in self.order)
        row, _, col, _ = self.register_tile
        outer = tuple((v, Level.POINT) for v in self.order if v not in (row, col) and v not in self.reductions)
        reductions = tuple((v, Level.POINT) for v in self.order if v in self.reductions)
        return (tiles + outer + ((row, Level.BLOCK), (col, Level.BLOCK)) + reductions
                + ((row, Level.POINT), (col, Level.POINT)))

    def dim_exprs(self, names: Mapping[str, str]) -> tuple[str, ...]:
        """isl schedule expressions of :meth:`dims`, with variables called by ``names``."""
        sizes = dict(self.tiles)
        if self.register_tile is not None:
            row, rows, col, cols = self.register_tile
            sizes_of_blocks = {row: rows, col: cols}
        out = []
        for v, level in self.dims():
            if level is Level.TILE:
                out.append(f"floor({names[v]}/{sizes[v]})")
            elif level is Level.BLOCK:
                out.append(f"floor({names[v]}/{sizes_of_blocks[v]})")
            else:
                out.append(names[v])
        return tuple(out)

    def describe(self) -> str:
        parts = [f"order {', '.join(self.order) or '(scalar)'}"]
        if self.tiles:
            parts.append("tiles " + ", ".join(f"{v}:{t}" for v, t in self.tiles))
        if self.register_tile:
            row, rows, col, cols = self.register_tile
            parts.append(f"register tile {row}:{rows} x {col}:{cols}")
        loops = [f"{v}{'' if level is Level.POINT else '_' + level.value}" for v, level in self.dims()]
        if self.tiles or self.register_tile:
            parts.append("loops " + ", ".join(loops))
        if self.parallel_dims:
            parts.append("parallel over " + ", ".join(loops[: self.parallel_dims]))
        if self.register_reduction:
            parts.append("reduction in a register")
        if self.simd:
            parts.append("simd inner loop")
        return "; ".join(parts)


def _accesses(stmt: ast.Stmt):
    """Every tensor access of a statement, the left-hand side first."""
    yield ast.Access(stmt.target, stmt.lhs)
    exprs = [stmt.rhs] + [w.expr for w in stmt.where if isinstance(w, ast.Exists)]
    for e in exprs:
        for node in e.walk():
            if isinstance(node, ast.Access) and node.indices:
                yield node


def _vars_in(expr: ast.Expr) -> set[str]:
    return {n.name for n in expr.walk() if isinstance(n, ast.IndexVar)}


def _stride_profile(stmt: ast.Stmt, shapes: Mapping[str, tuple[int, ...]]):
    """(strided, contiguous) access counts per index variable."""
    strided = {v: 0 for v in stmt.index_vars}
    contiguous = {v: 0 for v in stmt.index_vars}
    for acc in _accesses(stmt):
        shape = shapes.get(acc.tensor, ())
        for pos, index in enumerate(acc.indices):
            inner = shape[pos + 1:] if len(shape) == len(acc.indices) else ()
            is_innermost = pos == len(acc.indices) - 1 or all(d == 1 for d in inner)
            for v in _vars_in(index):
                if v in strided:
                    (contiguous if is_innermost else strided)[v] += 1
    return strided, contiguous


def choose_schedule(
    stmt: ast.Stmt,
    extents: Mapping[str, int],
    shapes: Mapping[str, tuple[int, ...]],
    target_type,
    options: Options,
) -> StmtSchedule:
    """Pick the loop order, tiles, parallel and SIMD loops of one (let-inlined) statement."""
    strided, contiguous = _stride_profile(stmt, shapes)
    reduction = set(stmt.reduction_vars)

    def heuristic_key(v):  # ascending = outermost first
        return (-strided[v], contiguous[v], extents.get(v, 1), v in reduction)

    order = sorted(stmt.index_vars, key=heuristic_key)
    if options.loop_order:
        listed = [v for v in options.loop_order if v in order]
        order = listed + [v for v in order if v not in listed]

    has_reduction = bool(reduction) and stmt.reduction is not None
    register = False
    if has_reduction and not options.loop_order:
        register = order[-1] in reduction or target_type.bits == 16
    elif has_reduction:
        register = all(v in reduction for v in order[len(order) - len(reduction):])
        if target_type.bits == 16 and not register:
            order = [v for v in order if v not in reduction] + [v for v in order if v in reduction]
            register = True
    if register:
        order = [v for v in order if v not in reduction] + [v for v in order if v in reduction]

    register_tile = None
    if has_reduction and not register and options.register_tile and len(order) >= 2:
        register_tile = _register_tile(stmt, order, extents, target_type, options.target)

    tiles: list[tuple[str, int]] = []
    if has_reduction and not register:
        inner = order[-1] if order else None
        blocks = {register_tile[0]: register_tile[1], register_tile[2]: register_tile[3]} if register_tile else {}
        for group in ("output", "reduction"):
            for v in order:
                if (v in reduction) != (group == "reduction"):
                    continue
                size = options.tile_sizes.get(v)
                if size is None:
                    size = DEFAULT_TILES["inner" if v == inner else group]
                if v in blocks and size:  # whole register blocks per tile
                    size = max(blocks[v], size // blocks[v] * blocks[v])
                if size and extents.get(v, 1) > size:
                    tiles.append((v, size))
    else:
        for v in order:
            if register and v in reduction:
                continue  # a register accumulator spans the whole reduction: never tile it
            size = options.tile_sizes.get(v)
            if size and extents.get(v, 1) > size:
                tiles.append((v, size))

    sched = StmtSchedule(
        order=tuple(order),
        reductions=tuple(v for v in order if v in reduction),
        tiles=tuple(tiles),
        parallel_dims=0,
        simd=options.vectorize and bool(order),
        register_reduction=register,
        unroll=options.unroll,
        register_tile=register_tile,
    )
    work = 1
    for v in order:
        work *= max(extents.get(v, 1), 0)
    parallel_dims = 0
    if options.parallel and options.threads > 1 and work >= PARALLEL_MIN_WORK:
        dims = sched.dims()
        tiled = {v for v, _ in tiles}
        # The innermost loop stays out of the parallel collapse: it is the SIMD loop. Point
        # loops of tiled variables depend on their tile loop, so the collapse stops there.
        for v, level in dims[: max(1, len(dims) - 1)]:
            if v in reduction or level is Level.BLOCK or (level is Level.POINT and (v in tiled or tiles)):
                break
            parallel_dims += 1
            if parallel_dims == 3:
                break
    return dataclasses.replace(sched, parallel_dims=parallel_dims)


def register_tile_shapes(target: Target, element_bytes: int) -> tuple[tuple[int, int], ...]:
    """(rows, columns) register tiles that fit ``target``'s vector registers, best first."""
    lanes = target.lanes(element_bytes)
    return tuple((rows, vectors * lanes) for rows, vectors in REGISTER_TILE_SHAPES
                 if rows * vectors + vectors + 1 <= target.vector_registers)


def _register_tile(stmt, order, extents, target_type, target: Target):
    """(row var, rows, column var, columns) for a memory-accumulating nest, or None.

    Among the shapes that fit in the target's vector registers, the one that leaves the
    smallest share of the outputs to partial blocks (which take the plain path) wins.
    """
    reduction = set(stmt.reduction_vars)
    col = order[-1]
    if col in reduction:
        return None
    candidates = [v for v in order if v not in reduction and v != col]
    if not candidates:
        return None
    reads = [a for a in _accesses(stmt) if any(col in _vars_in(i) for i in a.indices)]

    def shared_loads(v):  # accesses that contain both the column variable and v
        return sum(any(v in _vars_in(i) for i in a.indices) for a in reads)

    row = min(reversed(candidates), key=shared_loads)
    rows_ext, cols_ext = extents.get(row, 0), extents.get(col, 0)
    best, best_covered = None, 0.0
    for rows, cols in register_tile_shapes(target, max(1, target_type.bits // 8)):
        if rows_ext < rows or cols_ext < cols:
            continue
        covered = (rows_ext - rows_ext % rows) * (cols_ext - cols_ext % cols) / (rows_ext * cols_ext)
        if covered > best_covered + 0.05:
            best, best_covered = (row, rows, col, cols), covered
    return best
