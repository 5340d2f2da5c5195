"""How each statement runs, decided once (Program -> Program).

:func:`decide_engines` recognises every statement the contraction engine can take and plans it
(:func:`tcpy.transform.recognition.recognize`, :func:`tcpy.transform.contraction.plan`), and
stamps the decision on the statement (:attr:`tcpy.loopir.Statement.engine`: an
:class:`~tcpy.loopir.Engine`, or None for a loop nest). Every later pass and the lowering read
the stamp instead of deciding again, so a statement is an engine statement in all of them or in
none. A pass that rewrites a statement's accesses re-stamps it with :func:`restamp`.

This module is the only caller of the planner outside the engine's own modules (a test checks
it): the chain's blocks are planned here too (:func:`plan_block`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..lang import ast
from ..loopir import Engine, Program, Statement
from ..options import Options
from ..contraction_ir import Contraction, Plan
from .contraction import plan
from .recognition import recognize


def decide_engines(program: Program, options: Options) -> Program:
    """``program`` with each statement stamped with the engine that runs it (None: loops)."""
    return dataclasses.replace(program, statements=tuple(restamp(s, program, options)
                                                         for s in program.statements))


def restamp(statement: Statement, program: Program, options: Options) -> Statement:
    """``statement`` with its engine decided again (after a pass rewrote it)."""
    return dataclasses.replace(statement, engine=engine_of(statement.stmt, statement.ranges, program, options))


def engine_of(stmt: ast.Stmt, ranges, program: Program, options: Options) -> Optional[Engine]:
    """The engine for ``stmt`` when it takes this statement, else None: ``options`` keep the
    engine on (``contraction``, ``vectorize``) and give no tile sizes or loop order for its
    variables, and :func:`recognize` accepts it. ``parallel=False`` plans one thread.
    ``program`` gives shapes, types and sizes."""
    if not options.contraction or not options.vectorize:
        return None
    if set(options.tile_sizes) & set(stmt.index_vars) or set(options.loop_order) & set(stmt.index_vars):
        return None  # the user asked for a loop schedule of this statement (or autotuning tries one)
    con = recognize(stmt, ranges, program.shapes, program.types, program.sizes)
    if con is None:
        return None
    overrides = {k: v for k, v in options.plan.items() if k != "rows"}  # (rows: a chain's, see fusion)
    return Engine(con, plan(con, options.target, options.threads if options.parallel else 1,
                            winograd=options.winograd, overrides=overrides))


def plan_block(block: Contraction, options: Options, b_packed_once: bool) -> Plan:
    """The plan of a chain's product on one block of rows (one thread: the chain's loop over
    blocks is the parallel one); ``Options.plan``'s micro-tile applies (the row block is a
    multiple of its rows), its blocks and grid do not."""
    overrides = {k: v for k, v in options.plan.items() if k in ("mr", "nr")}
    return plan(block, options.target, 1, b_packed_once=b_packed_once, overrides=overrides)
