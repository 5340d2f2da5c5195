"""How each statement runs, decided once (Program -> Program).

:func:`decide_engines` recognises every statement the contraction engine can take and plans it
(:func:`tcpy.transform.recognition.recognize`, :func:`tcpy.transform.contraction.plan`), gives
every other statement its loop schedules (:func:`tcpy.schedule.choose_schedule`), and stamps
the decision on the statement (:attr:`tcpy.loopir.Statement.engine`: an
:class:`~tcpy.loopir.Engine`, or else :attr:`~tcpy.loopir.Statement.loops`). Every later pass,
the lowering and the renderer read the stamp instead of deciding again, so a statement is an
engine statement in all of them or in none, with one schedule. A pass that rewrites a
statement re-stamps it with :func:`restamp` (or, when only its loops change, such as the
statements under a fused group's shared loops, :func:`stamp_loops`).

This module is the only caller of the planner and of the loop scheduler outside their own
modules (a test checks it): a chain's products on a block are planned through :func:`plan_block`
(which :mod:`tcpy.transform.chains` calls).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..lang import ast
from ..loopir import Engine, Loops, Program, Statement
from ..options import Options
from ..target import Target
from ..contraction_ir import WINOGRAD_TILES, Contraction, Plan
from ..schedule import StmtSchedule, choose_schedule
from .contraction import direct_ok, micro_tile, plan, register_tiles, winograd_over_gemm
from .recognition import recognize, split_result_scale
from .winograd import winograd_form


def decide_engines(program: Program, options: Options) -> Program:
    """``program`` with each statement stamped with the engine that runs it (None: loops). A
    product scaled by factors that read no reduction variable, which the engine does not take
    whole, becomes the product through the engine and the scaling of its result
    (:func:`tcpy.transform.recognition.split_result_scale`; the epilogue pass puts the scaling
    into the engine's store): two statements of the same origin."""
    statements = []
    generic = program.generic is not None  # (its sizes are nominal: see tcpy.generic)
    for statement in program.statements:
        stamped = restamp(statement, program, options, generic)
        split = split_result_scale(statement.stmt) if stamped.engine is None else None
        engine = engine_of(split[0], statement.ranges, program, options) if split else None
        if engine is None:
            statements.append(stamped)
            continue
        product, scaling = split
        ranges = {v: statement.ranges[v] for v in scaling.output_vars}
        statements += [dataclasses.replace(statement, stmt=product, engine=engine, loops=None),
                       stamp_loops(Statement(scaling, ranges, statement.origin, scales_sum_over=product.reduction_vars),
                                   program.shapes, program.types, options, generic)]
    return dataclasses.replace(program, statements=tuple(statements))


def restamp(statement: Statement, program: Program, options: Options, generic: bool = False) -> Statement:
    """``statement`` with its engine (or else its loops) decided again (after a pass rewrote it);
    ``generic``: loops of a size-generic kernel (see :func:`tcpy.schedule.choose_schedule`)."""
    engine = engine_of(statement.stmt, statement.ranges, program, options)
    if engine is not None:
        return dataclasses.replace(statement, engine=engine, loops=None)
    return stamp_loops(dataclasses.replace(statement, engine=None), program.shapes, program.types, options, generic)


def runtime_gap(program: Program) -> Optional[str]:
    """Why calls should not run on ``program``'s size-generic kernel (a program planned for
    one), or None: a statement the planner gives the direct path (M = 1 with a window's short
    K: a depthwise convolution), which the run-time engine does not hold; on its packed path
    each micro-tile would fill one of its rows (tens of times slower than a specialised kernel,
    more than a compile costs: under ``Options(specialize="auto")`` calls are specialised)."""
    for statement in program.statements:
        if statement.engine is not None and direct_ok(statement.engine.contraction):
            return (f"statement {statement.origin + 1} takes the direct path (M = 1 and a short K, as in a "
                    "depthwise convolution), which the run-time engine does not hold")
    return None


def stamp_loops(statement: Statement, shapes, types, options: Options, generic: bool = False) -> Statement:
    """``statement`` (a loop statement) with its loop schedules decided again, for tensors of
    these ``shapes`` and ``types`` (a pass weighing a rewrite stamps the statement it would
    make); ``generic``: for a size-generic kernel."""
    stmt = statement.stmt
    outputs = None
    if stmt.reduction is not None and stmt.reduction_vars:
        # the nests over the outputs (identity, combine) are scheduled as a copy of the output
        init = ast.Stmt(stmt.target, stmt.lhs, None, False, ast.Access(stmt.target, stmt.lhs),
                        output_vars=stmt.output_vars)
        outputs = _schedule(init, statement.extents(), shapes, types, options, generic)
    compute = _schedule(stmt, statement.extents(), shapes, types, options, generic)
    return dataclasses.replace(statement, loops=Loops(compute, outputs))


def _schedule(stmt: ast.Stmt, extents, shapes, types, options: Options, generic: bool) -> StmtSchedule:
    """The loop schedule of ``stmt`` over these ``extents``, reading tensors of these ``shapes``
    and ``types``."""
    return choose_schedule(stmt, extents, shapes, types[stmt.target], options, generic)


def engine_of(stmt: ast.Stmt, ranges, program: Program, options: Options) -> Optional[Engine]:
    """The engine for ``stmt`` when it takes this statement, else None: ``options`` keep the
    engine on (``contraction``, ``vectorize``) and give no tile sizes or loop order for its
    variables, and :func:`recognize` accepts it. ``parallel=False`` plans one thread.
    ``program`` gives shapes, types and sizes."""
    if not options.contraction or not options.vectorize:
        return None
    if set(options.tile_sizes) & set(stmt.index_vars) or set(options.loop_order) & set(stmt.index_vars):
        return None  # the user asked for a loop schedule of this statement (or autotuning tries one)
    shapes = program.shapes
    if program.generic is not None:
        # an empty range or tensor at the nominal sizes: the kernel serves other sizes too (as
        # tcpy.transform.runtime_plan recognises such a call)
        ranges = {v: (lo, max(hi, lo + 1)) for v, (lo, hi) in ranges.items()}
        shapes = {name: tuple([max(1, d) for d in shape]) for name, shape in shapes.items()}
    con = recognize(stmt, ranges, shapes, program.types, program.sizes, keep_guards=program.generic is not None)
    if con is None:
        return None
    overrides = {k: v for k, v in options.plan.items() if k != "rows"}  # (rows: a chain's, see chains)
    if program.generic is not None:
        # the run-time engine (tcpy.codegen.contraction.runtime): the packed path's loops with a
        # micro-tile for every N; its blocks and grid are planned per call (shape_engine). A 3x3
        # convolution also gets the winograd path's loops, F(2x2, 3x3) and F(4x4, 3x3) for each
        # micro-tile the planner may give them (the widest for the call's tiles, or a narrower
        # one that gives more threads a sliver), taken by the calls whose sizes the cost model
        # runs as Winograd: the plan holds its form and those tiles.
        element_bytes = con.dtype.bits // 8
        lanes = options.target.lanes(element_bytes)
        mr, vectors = micro_tile(options.target, element_bytes)
        overrides = {"path": "packed", "mr": mr, "nr": vectors * lanes}
        form = winograd_form(con) if options.winograd else None
        tiles = tuple(sorted([(size, rows, nv) for size in WINOGRAD_TILES
                              for nv, rows in register_tiles(options.target).items()])) if form else ()
        nominal = plan(con, options.target, options.threads if options.parallel else 1, overrides=overrides,
                       pack_b_in_kernel=False)
        second = second_tile(options.target, element_bytes, (mr, vectors * lanes))  # (the small and stream paths')
        return Engine(con, dataclasses.replace(nominal, winograd=form, winograd_tiles=tiles, small_tile=second))
    return Engine(con, plan(con, options.target, options.threads if options.parallel else 1,
                            winograd=options.winograd, overrides=overrides))


def second_tile(target: Target, element_bytes: int, tile: tuple[int, int]) -> Optional[tuple[int, int]]:
    """The micro-tile ``(MR, NR)`` a size-generic kernel's routine holds besides ``tile`` (its
    plan's), for the call shapes whose N the planner tiles with it: of the planner's widest tile
    and its tile for an N of one 4-vector tile (8x48 and 6x64 with 32 wide registers), the one
    that is not ``tile``; None when they are one tile (or ``tile`` is neither)."""
    lanes = target.lanes(element_bytes)
    tiles = {(mr, vectors * lanes) for mr, vectors in (micro_tile(target, element_bytes),
                                                         micro_tile(target, element_bytes, 4 * lanes))}
    others = tiles - {tile}
    return others.pop() if len(others) == 1 and len(tiles) == 2 else None


def call_tile(target: Target, element_bytes: int, n: int, tile: Plan) -> tuple[int, int]:
    """The micro-tile ``(MR, NR)`` of a size-generic kernel's routine planned with ``tile`` for a
    call whose N is ``n``: the planner's for that N (:func:`micro_tile`) if the routine holds it
    (its plan's tile, or its ``small_tile``), else the plan's."""
    mr, vectors = micro_tile(target, element_bytes, max(n, 1))
    chosen = (mr, vectors * target.lanes(element_bytes))
    return chosen if chosen == tile.small_tile else (tile.mr, tile.nr)


def shape_engine(stmt: ast.Stmt, ranges, shapes, types, sizes, options: Options, kernel: Engine,
                 threads: int, paths: tuple[str, ...]) -> Optional[tuple[Contraction, Plan]]:
    """A size-generic kernel's contraction at one call's ``ranges``, ``shapes``, ``types`` and
    ``sizes`` (:mod:`tcpy.transform.runtime_plan`): recognised, and planned for ``threads``
    threads: on the winograd path when the kernel holds it (its plan's ``winograd`` form and
    tiles), the call's form has the same image and as many guards at most, and the cost model
    prefers it to the implicit GEMM; else with the micro-tile of the ``kernel``'s plan on the cost
    model's path among ``paths`` (the run-time engine's that the kernel holds; the packed path
    when it picks another) with no split K (the run-time engine's loops). None when at these
    sizes it is no contraction."""
    con = recognize(stmt, ranges, shapes, types, sizes)
    if con is None:
        return None
    threads = threads if options.parallel else 1
    tile, form = kernel.plan, kernel.plan.winograd
    if form is not None:
        sizes = tuple(sorted({size for size, _, _ in tile.winograd_tiles}))
        chosen = winograd_over_gemm(con, options.target, threads, sizes)
        image = getattr(kernel.contraction, form.image).tensor
        if (chosen is not None and getattr(con, chosen.winograd.image).tensor == image
                and len(con.guards) <= len(kernel.contraction.guards)
                and (chosen.winograd.tile, chosen.mr, chosen.nr_vectors) in tile.winograd_tiles):
            return con, chosen
    overrides = {"mr": tile.mr, "nr": tile.nr}
    # (explain=False: a call shape's plan is never shown, its reasons need not be formatted)
    shaped = plan(con, options.target, threads, overrides=overrides, pack_b_in_kernel=False, explain=False)
    if shaped.path not in paths:
        overrides["path"] = "packed"
        shaped = plan(con, options.target, threads, overrides=overrides, pack_b_in_kernel=False, explain=False)
    if shaped.path in ("small", "stream") and tile.small_tile is not None:
        # the planner's own micro-tile for this N, if it is the kernel's second one
        mr, nr = call_tile(options.target, con.dtype.bits // 8, con.size("n"), tile)
        if (mr, nr) == tile.small_tile:
            overrides.update(path=shaped.path, mr=mr, nr=nr)
            shaped = plan(con, options.target, threads, overrides=overrides, pack_b_in_kernel=False, explain=False)
    if shaped.grid[3] > 1:
        overrides["path"] = shaped.path
        shaped = plan(con, options.target, threads, overrides={**overrides, "grid": shaped.grid[:3] + (1,)},
                      pack_b_in_kernel=False, explain=False)
    return con, shaped


def shape_block(block: Contraction, target: Target, tile: tuple[int, int]) -> Plan:
    """A size-generic kernel's chain product on one block at a call's shape
    (:mod:`tcpy.transform.runtime_chains`): planned for one thread of ``target`` on the packed
    path with the micro-tile ``tile`` (MR, NR: one of the kernel's routines')."""
    return plan(block, target, 1, overrides={"path": "packed", "mr": tile[0], "nr": tile[1]}, pack_b_in_kernel=False,
                explain=False)


def plan_block(block: Contraction, options: Options, b_packed_once: bool, generic: bool = False) -> Plan:
    """The plan of a chain's product on one block of rows (one thread: the chain's loop over
    blocks is the parallel one); ``Options.plan``'s micro-tile applies (the row block is a
    multiple of its rows), its blocks and grid do not. ``generic``: a size-generic kernel's,
    on the packed path (the run-time engine's loops, :mod:`tcpy.transform.runtime_chains`),
    its routines also rendered with the :func:`second_tile` (unless ``Options.plan`` sets the
    micro-tile), which the calls whose N the planner tiles with it take."""
    overrides = {k: v for k, v in options.plan.items() if k in ("mr", "nr")}
    if generic:
        overrides["path"] = "packed"
    planned = plan(block, options.target, 1, b_packed_once=b_packed_once, overrides=overrides,
                   pack_b_in_kernel=not generic)
    if generic and not {"mr", "nr"} & set(overrides):
        second = second_tile(options.target, block.dtype.bits // 8, (planned.mr, planned.nr))
        planned = dataclasses.replace(planned, small_tile=second)
    return planned
