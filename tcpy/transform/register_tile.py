"""Register tiles: a block of outputs stays in registers across the reduction loops.

The schedule (:func:`tcpy.schedule.choose_schedule`) places a tiled nest's loops as
``..., row block, column block, reductions..., row, column``, with blocks of ``rows x cols``
outputs sized for the target's register file. This pass finds the first loop inside the
blocks and splits it in two paths (:class:`~tcpy.loopir.RegisterTile`): when the block is
whole, the outputs are loaded once, every reduction step updates the whole block
(:class:`~tcpy.loopir.TileUpdate`, each loaded input vector feeding ``rows`` fused
multiply-adds), and the block is stored once; partial blocks at the edges keep the plain loops.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..lang import ast
from ..lang.visit import map_expr
from ..lang.types import INDEX_TYPE
from ..loopir import (
    PANEL_BLOCK, PANEL_LANE,
    TILE_COL, TILE_COL0, BinOp, Const, KernelIR, Loop, Nest, NestKind, Node, RegisterTile,
    Statement, TileUpdate, Var, first_point, map_nodes, substitute,
)
from ..schedule import Level, StmtSchedule


def register_tiles(ir: KernelIR) -> KernelIR:
    """``ir`` with the register tiles its schedules ask for."""
    nests = tuple(_tiled(nest, ir.program.statements[nest.stmt]) for nest in ir.nests)
    return dataclasses.replace(ir, nests=nests)


def _tiled(nest: Nest, statement: Statement) -> Nest:
    sched = nest.schedule
    # (schedules give register tiles only to reductions that accumulate in memory)
    if nest.kind is not NestKind.COMPUTE or sched is None or sched.register_tile is None:
        return nest
    names = [f"c{i}" for i in range(len(sched.dims()))]  # isl's names of the schedule dimensions
    tiler = _Tiler(statement, sched, names)
    return dataclasses.replace(nest, body=map_nodes(nest.body, tiler.tile))


def _find_loop(node: Node, var: str) -> Optional[Loop]:
    """The loop over ``var`` along the chain of single-loop bodies from ``node``."""
    while isinstance(node, Loop):
        if node.var == var:
            return node
        if len(node.body) != 1:
            return None
        node = node.body[0]
    return None


class _Tiler:
    def __init__(self, statement: Statement, sched: StmtSchedule, names: list[str]):
        self.statement = statement
        self.stmt = statement.stmt
        self.row, self.rows, self.col, self.cols = sched.register_tile
        self.row_dim, self.col_dim = names[-2], names[-1]
        reductions = {name for name, (v, level) in zip(names, sched.dims())
                      if level is Level.POINT and v in self.stmt.reduction_vars}
        self.tile_dims = reductions | {self.row_dim, self.col_dim}

    def tile(self, node: Node) -> Optional[Node]:
        """A register tile for the first loop inside the blocks (None elsewhere: recurse)."""
        if not (isinstance(node, Loop) and node.var in self.tile_dims):
            return None
        row_loop, col_loop = _find_loop(node, self.row_dim), _find_loop(node, self.col_dim)
        if row_loop is None or col_loop is None:  # a degenerate edge block: plain loops
            return node
        last_row = BinOp("+", row_loop.lo, Const(self.rows - 1))
        last_col = BinOp("+", col_loop.lo, Const(self.cols - 1))
        full = BinOp("&&", substitute(row_loop.cond, {self.row_dim: last_row}),
                     substitute(col_loop.cond, {self.col_dim: last_col}))
        others = tuple((v, e) for v, e in first_point(node).point
                       if v in self.stmt.output_vars and v not in (self.row, self.col))
        fast = map_nodes((node,), self._update)
        return RegisterTile(first_point(node).stmt, self.row, self.rows, row_loop.lo, self.col, self.cols,
                            col_loop.lo, full, others, fast, (node,))

    def _update(self, node: Node) -> Optional[Node]:
        """The row loop (and the column loop in it) becomes one update of the whole tile."""
        if not (isinstance(node, Loop) and node.var == self.row_dim):
            return None
        point = first_point(node)
        rest = tuple((v, e) for v, e in point.point if v not in (self.row, self.col))
        rhs, lets = self._rhs()
        return TileUpdate(point.stmt, rest, rhs, lets)

    def _rhs(self):
        """The statement's value, reading the streamed operand from its panel copy if any."""
        panel = self.statement.panel
        if panel is None:
            return self.stmt.rhs, ()
        block, lane = ast.IndexVar(PANEL_BLOCK, type=INDEX_TYPE), ast.IndexVar(PANEL_LANE, type=INDEX_TYPE)

        def to_panel(e):
            if (isinstance(e, ast.Access) and e.tensor == panel.tensor and e.indices
                    and isinstance(e.indices[-1], ast.IndexVar) and e.indices[-1].name == self.col):
                return ast.Access(panel.copy, (block,) + e.indices[:-1] + (lane,), type=e.type)
            return None

        lets = ((block.name, BinOp("div", Var(TILE_COL0), Const(panel.cols))), (lane.name, Var(TILE_COL)))
        return map_expr(self.stmt.rhs, to_panel), lets
