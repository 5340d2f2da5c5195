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
  Their sizes come from a footprint model of the target's caches (:func:`cache_tiles`).
* **Register tile.** In those nests a block of ``R x V`` outputs (``R`` rows of a second output
  variable, ``V`` contiguous elements of the innermost one) stays in registers across the
  reduction loops, so each loaded input vector feeds ``R`` fused multiply-adds. The row
  variable is the output variable whose accesses share the fewest loads with the inner one
  (``m`` in matmul, the output channel in a convolution).
* **Parallel.** The leading output loops (tile loops, then untiled outer loops) are collapsed
  into one ``omp parallel for`` when the nest has enough work. When that gives fewer than
  ``CHUNKS_PER_THREAD`` chunks per thread, output tiles shrink (down to one register block)
  until it does or the output runs out. Reduction loops are not parallel, except in a register
  reduction whose outputs are too few for the threads: it is split into parts that run in
  parallel, combined in order afterwards.
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
from .lang.visit import accesses, index_vars
from .options import Options
from .target import Target

# Loops with fewer iterations than this in total run serially: OpenMP start-up costs ~1-5 us.
PARALLEL_MIN_WORK = 1 << 15
# Parallel loops aim at this many chunks per thread, so static scheduling stays balanced.
CHUNKS_PER_THREAD = 4
# A split reduction gives each part at least this many iterations per output element.
MIN_PART_WORK = 4096
# ... and its partial results (parts x outputs) take at most this many bytes.
MAX_PARTIALS_BYTES = 16 << 20
# Register tile shapes tried, as (rows, vectors per row); each needs rows * vectors
# accumulators, one register per vector of a row of the streamed operand, and a broadcast.
REGISTER_TILE_SHAPES = ((6, 2), (8, 1), (4, 2), (4, 1))


class Level(enum.Enum):
    """What a schedule dimension iterates over."""

    TILE = "tile"  # cache tiles of a variable
    BLOCK = "block"  # register tiles of a variable
    POINT = "point"  # the variable itself (a split variable's quotient: see ``phases``)
    PHASE = "phase"  # a split variable's residue: one value per piece, no loop


@dataclass(frozen=True, slots=True)
class StmtSchedule:
    """How one statement's compute nest is laid out.

    ``order`` is the point-loop order (outermost first); ``tiles`` the tiled variables in
    tile-loop order with their sizes; ``parallel_dims`` how many leading schedule dimensions
    may run in parallel (0: serial); ``register_reduction`` whether reduction variables are
    innermost and accumulate in a register. Decided once per statement by
    :mod:`tcpy.transform.engines` (stamped as :attr:`tcpy.loopir.Statement.loops`).
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
    chunks: int = 0  # iterations of the collapsed parallel loops
    threads: int = 1  # threads the parallel loops were planned for
    # (variable, part size, parts): the reduction runs in parts, one per parallel iteration,
    # into partial results combined in order afterwards
    split: Optional[tuple[str, int, int]] = None
    reasons: tuple[str, ...] = ()  # why: order, accumulation, tiles, parallel loops
    # (variable, stride): the statement runs in pieces, one per residue of each variable
    # modulo its stride, its loop over the quotient (see tcpy.transform.phases)
    phases: tuple[tuple[str, int], ...] = ()

    def dims(self) -> tuple[tuple[str, Level], ...]:
        """Schedule dimensions as (variable, level), outermost first."""
        tiles = tuple((v, Level.TILE) for v, _ in self.tiles)
        if self.phases:
            split = dict(self.phases)
            return tuple(dim for v in self.order
                         for dim in (((v, Level.POINT), (v, Level.PHASE)) if v in split else ((v, Level.POINT),)))
        if self.register_tile is None:
            return tiles + tuple((v, Level.POINT) for v in self.order)
        row, _, col, _ = self.register_tile
        output_tiles = tuple((v, level) for v, level in tiles if v not in self.reductions)
        reduction_tiles = tuple((v, level) for v, level in tiles if v in self.reductions)
        outer = tuple((v, Level.POINT) for v in self.order if v not in (row, col) and v not in self.reductions)
        reductions = tuple((v, Level.POINT) for v in self.order if v in self.reductions)
        # outer output loops before the reduction tiles, so they can join the parallel loops
        return (output_tiles + outer + reduction_tiles + ((row, Level.BLOCK), (col, Level.BLOCK)) + reductions
                + ((row, Level.POINT), (col, Level.POINT)))

    def dim_exprs(self, names: Mapping[str, str], residues: Optional[Mapping[str, int]] = None) -> tuple[str, ...]:
        """isl schedule expressions of :meth:`dims`, with variables called by ``names`` (a split
        variable's name standing for its quotient in the piece of these ``residues``)."""
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
            elif level is Level.PHASE:
                out.append(str(residues[v]))
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
            parts.append(f"parallel over {', '.join(loops[: self.parallel_dims])} "
                         f"({self.chunks} chunks for {self.threads} threads)")
        if self.phases:
            parts.append("split by phase " + ", ".join(f"{v} mod {s}" for v, s in self.phases)
                         + " (one piece per residue, its selects resolved)")
        if self.split:
            var, size, count = self.split
            parts.append(f"reduction over {var} split in {count} parts of {size}, combined in order")
        if self.register_reduction:
            parts.append("reduction in a register")
        if self.simd:
            parts.append("simd inner loop")
        return "; ".join(parts)


def _stride_profile(stmt: ast.Stmt, shapes: Mapping[str, tuple[int, ...]]):
    """(strided, contiguous) access counts per index variable."""
    strided = {v: 0 for v in stmt.index_vars}
    contiguous = {v: 0 for v in stmt.index_vars}
    for acc, _ in accesses(stmt):
        shape = shapes.get(acc.tensor, ())
        for pos, index in enumerate(acc.indices):
            inner = shape[pos + 1:] if len(shape) == len(acc.indices) else ()
            is_innermost = pos == len(acc.indices) - 1 or all(d == 1 for d in inner)
            for v in index_vars(index):
                if v in strided:
                    (contiguous if is_innermost else strided)[v] += 1
    return strided, contiguous


def choose_schedule(
    stmt: ast.Stmt,
    extents: Mapping[str, int],
    shapes: Mapping[str, tuple[int, ...]],
    target_type,
    options: Options,
    generic: bool = False,
) -> StmtSchedule:
    """Pick the loop order, tiles, parallel and SIMD loops of one (let-inlined) statement.

    ``generic``: for a size-generic kernel (:mod:`tcpy.generic`), whose ``extents`` are only
    nominal: its parallel loops are planned whatever the work (a call's own work decides at run
    time whether they run in parallel), and its reductions are never split (the number of parts
    would depend on the sizes)."""
    strided, contiguous = _stride_profile(stmt, shapes)
    reduction = set(stmt.reduction_vars)

    def heuristic_key(v):  # ascending = outermost first
        return (-strided[v], contiguous[v], extents.get(v, 1), v in reduction)

    order = sorted(stmt.index_vars, key=heuristic_key)
    reasons = []
    if options.loop_order:
        listed = [v for v in options.loop_order if v in order]
        order = listed + [v for v in order if v not in listed]
        reasons.append(f"loop order {', '.join(listed)} first, as Options.loop_order asks")
    elif order:
        reasons.append("loops from the most strided variable (outermost) to the most contiguous (innermost)")

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
        reasons.append("reduction innermost, in a register: " + (
            "a 16-bit type accumulates in float32" if target_type.bits == 16
            else "the innermost loop is a reduction variable"))

    register_tile = None
    if has_reduction and not register and options.register_tile and len(order) >= 2:
        register_tile = _register_tile(stmt, order, extents, target_type, options.target)
        if register_tile:
            reasons.append(f"register tile {register_tile[0]}:{register_tile[1]} x {register_tile[2]}:"
                           f"{register_tile[3]}: the shape that fits the vector registers and leaves the fewest "
                           "outputs to partial blocks")

    tiles: list[tuple[str, int]] = []
    blocks: dict[str, int] = {}
    if has_reduction and not register:
        inner = order[-1] if order else None
        element_bytes = max(1, target_type.bits // 8)
        if register_tile:
            blocks = {register_tile[0]: register_tile[1], register_tile[2]: register_tile[3]}
            model = cache_tiles(options.target, element_bytes, register_tile[1], register_tile[3])
        else:
            model = cache_tiles(options.target, element_bytes, 1, options.target.lanes(element_bytes))
        for group in ("output", "reduction"):
            for v in order:
                if (v in reduction) != (group == "reduction"):
                    continue
                size = options.tile_sizes.get(v)
                if size is None:
                    size = model["inner" if v == inner else group]
                if v in blocks and size:  # whole register blocks per tile
                    size = max(blocks[v], size // blocks[v] * blocks[v])
                if size and extents.get(v, 1) > size:
                    tiles.append((v, size))
        if tiles:
            reasons.append("cache tiles from a footprint model of the target's L1 and L2 (BLIS's)"
                           + (", sizes set by Options.tile_sizes kept" if options.tile_sizes else ""))
    else:
        for v in order:
            if register and v in reduction:
                continue  # a register accumulator spans the whole reduction: never tile it
            size = options.tile_sizes.get(v)
            if size and extents.get(v, 1) > size:
                tiles.append((v, size))
        if tiles:
            reasons.append("tiles as Options.tile_sizes asks")

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
    work = volume(extents.get(v, 1) for v in order)
    if not (options.parallel and options.threads > 1 and (generic or work >= PARALLEL_MIN_WORK)):
        serial = ("parallel=False (or a fused group's shared loops around it are the parallel ones)"
                  if not options.parallel else "one thread" if options.threads <= 1
                  else f"{work} iterations, below {PARALLEL_MIN_WORK}")
        return dataclasses.replace(sched, reasons=(*reasons, f"serial: {serial}"))
    sched = _plan_parallel(sched, extents, blocks, options, target_type, generic)
    if generic and sched.parallel_dims:
        reasons.append(f"leading output loops parallel when a call has at least {PARALLEL_MIN_WORK} iterations "
                       "(size-generic: decided at run time)")
    elif sched.split:
        reasons.append("reduction split in parts run in parallel: its outputs give too few chunks for the threads")
    elif sched.parallel_dims:
        reasons.append(f"leading output loops parallel, aiming at {CHUNKS_PER_THREAD} chunks per thread")
    else:
        reasons.append("serial: fewer than 2 chunks of outputs")
    return dataclasses.replace(sched, reasons=tuple(reasons))


def phase_schedule(sched: StmtSchedule, stmt: ast.Stmt, phases: tuple[tuple[str, int], ...],
                   extents: Mapping[str, int], options: Options, generic: bool = False) -> StmtSchedule:
    """``sched`` of the element-wise ``stmt`` (whose left-hand indices are its variables) run
    in pieces by phase (:mod:`tcpy.transform.phases`): loops in the order of the target's
    dimensions (the pieces read phases laid out as it), each split variable's quotient loop
    followed by its residue, so the pieces of the innermost one store neighbouring elements in
    one loop body; the leading loops before the first residue parallel, as many as give
    enough chunks (``generic``: all of them, whatever the nominal work, as
    :func:`choose_schedule`)."""
    strides = dict(phases)
    order = tuple(index.name for index in stmt.lhs)
    quotients = {v: -(-extents.get(v, 1) // strides[v]) if v in strides else extents.get(v, 1) for v in order}
    reasons = ("loops in the order of the target's dimensions, each split variable's residue after its quotient",)
    sched = dataclasses.replace(sched, order=order, reductions=(), tiles=(), register_tile=None,
                                register_reduction=False, parallel_dims=0, chunks=0, threads=1, split=None,
                                phases=phases, simd=options.vectorize, reasons=reasons)
    work = volume(extents.get(v, 1) for v in order)
    if not (options.parallel and options.threads > 1 and (generic or work >= PARALLEL_MIN_WORK)):
        return dataclasses.replace(sched, reasons=(*reasons, "serial: one thread or little work"))
    count, chunks = _parallel_prefix(sched, quotients, None if generic else 2 * CHUNKS_PER_THREAD * options.threads)
    if chunks < 2 and not (generic and count):
        return dataclasses.replace(sched, reasons=(*reasons, "serial: fewer than 2 chunks before the first residue"))
    return dataclasses.replace(sched, parallel_dims=count, chunks=chunks, threads=options.threads,
                               reasons=(*reasons, "leading loops before the first residue parallel"))


def _parallel_prefix(sched: StmtSchedule, extents: Mapping[str, int],
                     enough: int | None = None) -> tuple[int, int]:
    """(number of leading schedule dimensions that can run as one collapsed parallel loop,
    their iterations). Output tile loops and untiled output point loops qualify; the collapse
    stops at a reduction, a register block (its bounds depend on the tile loop), a tiled
    variable's point loop, before the innermost (SIMD) loop, and once it has ``enough``
    iterations: loops left out of the collapse keep their own counters, which the compiler
    optimises as in a serial nest (a collapsed loop recomputes them from the claimed chunk's
    iteration, which cost a parity merge of strided gradient phases twice its serial time)."""
    dims = sched.dims()
    tiles = dict(sched.tiles)
    count, chunks = 0, 1
    # the innermost loop is the last dimension that is a loop (a phase's residue is not)
    innermost = max((at for at, (_, level) in enumerate(dims) if level is not Level.PHASE), default=0)
    for v, level in dims[: max(1, innermost)]:
        if enough is not None and chunks >= enough:
            break
        if (v in sched.reductions or level in (Level.BLOCK, Level.PHASE)
                or (level is Level.POINT and v in tiles)):
            break
        extent = max(extents.get(v, 1), 0)
        chunks *= -(-extent // tiles[v]) if level is Level.TILE else extent
        count += 1
    return count, chunks


def _split_reduction(sched: StmtSchedule, extents: Mapping[str, int], target_type,
                     threads: int) -> Optional[StmtSchedule]:
    """A register-accumulated reduction whose outputs give fewer parallel chunks than its
    reduction could: the outermost reduction variable is cut into parts that run in parallel,
    each into its own partial results, combined afterwards in part order (so the result depends
    on the schedule, never on the run or the thread count at run time). None when the outputs
    give enough parallelism, the parts would be too small, or the partials too big."""
    if not sched.register_reduction or not sched.reductions:
        return None
    _, chunks = _parallel_prefix(sched, extents)
    outputs = volume(extents.get(v, 1) for v in sched.order if v not in sched.reductions)
    per_output = volume(extents.get(v, 1) for v in sched.reductions)
    var = sched.reductions[0]
    parts = min(CHUNKS_PER_THREAD * threads, per_output // MIN_PART_WORK, extents.get(var, 1))
    element_bytes = max(4, target_type.bits // 8)
    if parts < 2 or parts <= chunks or parts * outputs * element_bytes > MAX_PARTIALS_BYTES:
        return None
    size = -(-extents[var] // parts)
    parts = -(-extents[var] // size)
    return dataclasses.replace(sched, tiles=((var, size),) + sched.tiles, parallel_dims=1, chunks=parts,
                               threads=threads, split=(var, size, parts))


def volume(values) -> int:
    """The product of extents, an empty (negative) extent counting as 0."""
    out = 1
    for v in values:
        out *= max(v, 0)
    return out


def _plan_parallel(sched: StmtSchedule, extents: Mapping[str, int], blocks: Mapping[str, int],
                   options: Options, target_type, generic: bool = False) -> StmtSchedule:
    """Collapse the leading output loops; shrink output tiles (never below a register block, nor
    those the user set), or tile a register-blocked output variable that has no tile yet, until
    there are ``CHUNKS_PER_THREAD`` chunks per thread or the output runs out. ``generic``: no
    split reduction, and parallel loops even when the nominal ``extents`` give few chunks."""
    threads = options.threads
    wanted = CHUNKS_PER_THREAD * threads
    split = None if generic else _split_reduction(sched, extents, target_type, threads)
    if split is not None:
        return split
    while True:
        # collapse up to twice the wanted chunks: claimed dynamically, they still balance
        count, chunks = _parallel_prefix(sched, extents, None if generic else 2 * wanted)
        if chunks >= wanted:
            break
        tiled = dict(sched.tiles)
        parallel_tiles = {v for v, level in sched.dims()[:count] if level is Level.TILE}
        # (current tile size, variable): tiles in the parallel loops, then blocked variables
        # whose block loops cannot join the collapse without a tile loop of their own
        candidates = [(size, v) for v, size in sched.tiles
                      if v in parallel_tiles and size // 2 >= blocks.get(v, 1)] + [
            (extents.get(v, 1), v) for v in blocks
            if v not in tiled and v not in sched.reductions and extents.get(v, 1) > blocks[v]]
        candidates = [(size, v) for size, v in candidates if v not in options.tile_sizes]
        if not candidates or (sched.tiles and not parallel_tiles and count == 0):
            # last resort: output loops before the reductions (legal when accumulating in memory)
            hoisted = tuple(v for v in sched.order if v not in sched.reductions) + sched.reductions
            if sched.register_reduction or hoisted == sched.order:
                break
            sched = dataclasses.replace(sched, order=hoisted)
            continue
        size, var = max(candidates)
        block = blocks.get(var, 1)
        smaller = max(block, size // 2 // block * block)
        if var in tiled:
            new_tiles = tuple((v, smaller if v == var else s) for v, s in sched.tiles)
        else:  # output tiles come first, in loop order
            order = [v for v in sched.order if v in tiled or v == var]
            new_tiles = tuple((v, smaller if v == var else tiled[v]) for v in order)
            new_tiles = tuple(t for t in new_tiles if t[0] not in sched.reductions) + tuple(
                t for t in sched.tiles if t[0] in sched.reductions)
        sched = dataclasses.replace(sched, tiles=new_tiles)
    if chunks < 2 and not (generic and count):
        return sched
    return dataclasses.replace(sched, parallel_dims=count, chunks=chunks, threads=threads)


def cache_tiles(target: Target, element_bytes: int, rows: int, cols: int) -> dict[str, int]:
    """Cache tile sizes of a GEMM-like nest with ``rows x cols`` register blocks, from a
    footprint model of ``target``'s caches (the analytical model of BLIS, Low et al. 2016):

    * ``reduction`` (kc): one register block's slice of the row operand (``rows x kc``) and of
      the streamed operand (``kc x cols``) stay in L1 across the block, in 3/4 of it (the rest
      is for the output block and conflicts): ``kc * (rows + cols) * e <= 3/4 L1``.
    * ``inner`` (nc): the streamed operand's ``kc x nc`` block is reused by every row block
      of a tile, from half of L2: ``kc * nc * e <= L2 / 2``.
    * ``output`` (mc): the row operand's ``mc x kc`` block is reused by every column block,
      from a quarter of L2: ``mc * kc * e <= L2 / 4``.

    Each is rounded down to whole register blocks (kc to a multiple of 16).
    """
    kc = max(16, target.l1d * 3 // 4 // (element_bytes * (rows + cols)) // 16 * 16)
    nc = max(cols, target.l2 // 2 // (element_bytes * kc) // cols * cols)
    mc = max(rows, target.l2 // 4 // (element_bytes * kc) // rows * rows)
    return {"reduction": kc, "inner": nc, "output": mc}


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
    reads = [a for a, _ in accesses(stmt) if any(col in index_vars(i) for i in a.indices)]

    def shared_loads(v):  # accesses that contain both the column variable and v
        return sum(any(v in index_vars(i) for i in a.indices) for a in reads)

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
