"""Plans of a size-generic kernel's contractions, per call shape: the plan buffer
(:data:`tcpy.contraction_ir.RUNTIME_FIELDS`) that the run-time engine
(:mod:`tcpy.codegen.contraction.runtime`) reads.

A generic kernel's contraction is recognised at the kernel's nominal sizes only to fix what
does not depend on sizes: its operands, their types, its scale and whether it overwrites, and
its guards (:func:`tcpy.transform.engines.engine_of`). At each new call shape it is recognised
and planned again (:func:`tcpy.transform.engines.shape_engine`: the packed path with the
kernel's micro-tile), and the roles' offset tables are computed from that shape's
:class:`~tcpy.contraction_ir.Contraction`, so nothing recognition decided at other sizes
(variables of extent 1 left out, variables merged into one dimension, the operands' order) is
assumed.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from ..contraction_ir import RUNTIME_FIELDS, Contraction, Plan
from ..loopir import Statement
from ..options import Options
from .engines import shape_engine

_FIELD = {name: index for index, name in enumerate(RUNTIME_FIELDS)}


def plan_buffer(statement: Statement, ranges: Mapping[str, tuple[int, int]], shapes, types,
                sizes: Mapping[str, int], options: Options, threads: int) -> Optional[np.ndarray]:
    """The plan buffer of ``statement`` (a generic kernel's engine statement) at a call's
    ``ranges``, ``shapes``, ``types`` and ``sizes`` for ``threads`` threads, or None when at
    these sizes it is no contraction the kernel's routine runs (the call then needs a kernel
    specialised to its shape)."""
    nominal = statement.engine.contraction
    # an empty range: recognised with one value (and tensors of no elements with one, whose
    # strides are not 0), then run with no work, or with empty sums (no operand is read)
    empty = {v for v, (lo, hi) in ranges.items() if hi <= lo}
    if empty:
        ranges = {v: (lo, lo + 1) if v in empty else (lo, hi) for v, (lo, hi) in ranges.items()}
        shapes = {name: tuple(max(1, d) for d in shape) for name, shape in shapes.items()}
    found = shape_engine(statement.stmt, ranges, shapes, types, sizes, options, statement.engine.plan, threads)
    if found is None:
        return None
    con, plan = found
    zero = None
    if empty & set(statement.stmt.output_vars):
        zero = "batch"
    elif empty:
        zero = "k"
    return contraction_buffer(con, plan, nominal, zero)


def contraction_buffer(con: Contraction, plan: Plan, nominal: Contraction, zero: Optional[str] = None
                       ) -> Optional[np.ndarray]:
    """The plan buffer of ``con`` planned with ``plan`` at a call's shape, for the routine
    rendered from ``nominal`` (its contraction at the kernel's nominal sizes); ``zero``: the
    extent ("batch" or "k") that is 0 at this shape (recognised with 1). None when the routine
    cannot run it."""
    if len(con.guards) > len(nominal.guards):
        return None  # guards the kernel was not built to test
    swapped = con.a.tensor != nominal.a.tensor
    # the kernel runs exchanged operands only if they have one type: else back to its order
    keep = swapped and con.a.dtype is not con.b.dtype
    a, b, m, n, guarded = ("b", "a", "n", "m", {"a": "b", "b": "a", "": ""}[con.guarded]) if keep else \
        ("a", "b", "m", "n", con.guarded)
    acc = {"a": getattr(con, a), "b": getattr(con, b), "c": con.c}
    sizes_ = {"batch": con.size("batch"), "m": con.size(m), "n": con.size(n), "k": con.size("k")}
    if zero is not None:
        sizes_[zero] = 0
    tables = {
        "a_batch": _offsets(con.batch, a), "a_m": _offsets(getattr(con, m), a), "a_k": _offsets(con.k, a),
        "b_batch": _offsets(con.batch, b), "b_n": _offsets(getattr(con, n), b), "b_k": _offsets(con.k, b),
        "c_batch": _offsets(con.batch, "c"), "c_m": _offsets(getattr(con, m), "c"),
        "c_n": _offsets(getattr(con, n), "c"),
    }
    own = getattr(con, m if guarded == "a" else n)
    g_batch, g_own, g_k = [], [], []
    for i in range(len(nominal.guards)):  # a guard this shape does not have holds everywhere
        if i < len(con.guards):
            which = f"g{i}"
            g_batch.append(con.guards[i].const + _offsets(con.batch, which))
            g_own.append(_offsets(own, which))
            g_k.append(_offsets(con.k, which))
        else:
            g_batch.append(np.zeros_like(tables["c_batch"]))
            g_own.append(np.zeros_like(tables["a_m"] if guarded == "a" else tables["b_n"]))
            g_k.append(np.zeros_like(tables["a_k"]))
    tables.update(g_batch=_joined(g_batch), g_own=_joined(g_own), g_k=_joined(g_k),
                  b_runs=_runs(tables["b_n"], plan.nr), c_runs=_runs(tables["c_n"], plan.nr))
    tb, tm, tn, _ = plan.grid
    if keep:
        tm, tn = tn, tm
    other = acc["b" if guarded == "a" else "a"]
    fields = {**sizes_, "kc": plan.kc, "mc": plan.mc, "nc": plan.nc, "grid_batch": tb, "grid_m": tm, "grid_n": tn,
              "swapped": int(swapped and not keep), "a_base": acc["a"].offset, "b_base": acc["b"].offset,
              "c_base": acc["c"].offset, "a_k_unit": int(_runs(tables["a_k"], len(tables["a_k"]))[0]),
              "guarded": {"": 0, "a": 1, "b": 2}[guarded if con.guards else ""],
              "other_elements": other.elements}
    header = np.zeros(len(RUNTIME_FIELDS), np.int64)
    for name, value in fields.items():
        header[_FIELD[name]] = value
    parts, at = [header], len(header)
    for name, table in tables.items():
        header[_FIELD[name + "_table"]] = at
        parts.append(table)
        at += len(table)
    return np.concatenate(parts)


def _offsets(groups, which: str) -> np.ndarray:
    """Element offsets (or a guard's values) in ``which`` per linear index of the role of these
    groups (outer first: each group is one affine dimension)."""
    offsets = np.zeros(1, np.int64)
    for group in groups:
        along = group.stride(which) * np.arange(group.extent, dtype=np.int64)
        offsets = (offsets[:, None] + along[None, :]).ravel()
    return offsets


def _joined(tables) -> np.ndarray:
    return np.concatenate(tables) if tables else np.zeros(1, np.int64)


def _runs(offsets: np.ndarray, width: int) -> np.ndarray:
    """Per block of ``width`` linear indices (the last one partial), 1 where the block's offsets
    are one unit-stride run (x, x + 1, ...)."""
    blocks = -(-len(offsets) // width)
    padded = np.full(blocks * width, -1, np.int64)  # (a partial block's end: steps of 1 too)
    padded[:len(offsets)] = offsets
    rows = padded.reshape(blocks, width)
    steps = np.diff(rows, axis=1)
    valid = np.arange(1, width) < (len(offsets) - np.arange(blocks) * width)[:, None]
    return np.all((steps == 1) | ~valid, axis=1).astype(np.int64)


def describe(buffer: np.ndarray, tile: Plan) -> str:
    """What the run-time engine runs with the plan ``buffer`` (``tile``: the kernel's plan at its
    nominal sizes, whose micro-tile it has)."""
    field = {name: int(buffer[index]) for name, index in _FIELD.items()}
    return (f"run-time engine (packed path, one routine for every size): micro-tile {tile.mr}x{tile.nr}; at these "
            f"sizes batch {field['batch']} x M {field['m']} x N {field['n']} x K {field['k']}, blocks kc "
            f"{field['kc']}, mc {field['mc']}, nc {field['nc']}; thread grid batch {field['grid_batch']} x M "
            f"{field['grid_m']} x N {field['grid_n']} x K 1"
            + ("; operands exchanged (the output is contiguous along the first)" if field["swapped"] else ""))
