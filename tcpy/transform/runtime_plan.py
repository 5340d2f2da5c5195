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

import dataclasses
import functools
import math
from typing import Mapping, Optional

import numpy as np

from ..contraction_ir import RUNTIME_FIELDS, RUNTIME_PATHS, RUNTIME_WINOGRAD_FIELDS, Contraction, Plan, runtime_paths
from ..loopir import Statement
from ..options import Options
from .engines import shape_engine

_FIELD = {name: index for index, name in enumerate(RUNTIME_FIELDS)}


def field(name: str) -> int:
    """The index of field ``name`` (:data:`tcpy.contraction_ir.RUNTIME_FIELDS`) in a plan buffer."""
    return _FIELD[name]


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
    engine = statement.engine
    if empty:
        ranges = {v: (lo, lo + 1) if v in empty else (lo, hi) for v, (lo, hi) in ranges.items()}
        shapes = {name: tuple(max(1, d) for d in shape) for name, shape in shapes.items()}
        # (no work or empty sums: the packed path's driver has them)
        engine = dataclasses.replace(engine, plan=dataclasses.replace(engine.plan, winograd=None))
    found = shape_engine(statement.stmt, ranges, shapes, types, sizes, options, engine, threads,
                         runtime_paths(nominal))
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
    dims = {
        "a_batch": _dims(con.batch, a), "a_m": _dims(getattr(con, m), a), "a_k": _dims(con.k, a),
        "b_batch": _dims(con.batch, b), "b_n": _dims(getattr(con, n), b), "b_k": _dims(con.k, b),
        "c_batch": _dims(con.batch, "c"), "c_m": _dims(getattr(con, m), "c"), "c_n": _dims(getattr(con, n), "c"),
    }
    tables = {name: _table(role) for name, role in dims.items()}
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
    tables.update(g_batch=_joined(g_batch), g_own=_joined(g_own), g_k=_joined(g_k))
    if plan.path == "winograd":  # (the packed loops' copies and stores do not run: no tables for them)
        tables.update(b_runs=np.zeros(1, np.int64), c_runs=np.zeros(1, np.int64), b_segments=np.zeros(1, np.int64))
    else:
        tables.update(b_runs=_runs(dims["b_n"], plan.nr), c_runs=_runs(dims["c_n"], plan.nr),
                      b_segments=_segments(dims["b_n"]))
    tb, tm, tn, _ = plan.grid
    if keep:
        tm, tn = tn, tm
    other = acc["b" if guarded == "a" else "a"]
    fields = {**sizes_, "kc": plan.kc, "mc": plan.mc, "nc": plan.nc, "grid_batch": tb, "grid_m": tm, "grid_n": tn,
              "swapped": int(swapped and not keep), "a_base": acc["a"].offset, "b_base": acc["b"].offset,
              "c_base": acc["c"].offset, "a_k_unit": int(_unit_run(dims["a_k"])),
              "b_k_unit": int(_unit_run(dims["b_k"])),
              "guarded": {"": 0, "a": 1, "b": 2}[guarded if con.guards else ""],
              "other_elements": other.elements, "b_k_stride": con.linear_stride("k", b) or 0}
    if plan.path in RUNTIME_PATHS:
        fields.update(path=RUNTIME_PATHS.index(plan.path), copy_b=int(plan.copy_b), mr=plan.mr, nr=plan.nr)
    if plan.path in ("small", "stream"):  # (A, and on the small path B, read in place: one linear stride per role)
        fields.update(a_m_stride=con.linear_stride("m", "a"), a_k_stride=con.linear_stride("k", "a"))
    parts = _section(RUNTIME_FIELDS, fields, tables, 0)
    if plan.path == "winograd":
        at = sum(len(part) for part in parts)
        parts[0][_FIELD["winograd"]] = at
        parts += _winograd_section(con, plan, len(nominal.guards), at)
    return np.concatenate(parts)


def _section(names: tuple[str, ...], fields: Mapping[str, int], tables: Mapping[str, np.ndarray],
             at: int) -> list[np.ndarray]:
    """A header of ``names`` holding ``fields`` and where each of ``tables`` starts (its
    ``<name>_table`` field: the section starts at ``at`` in the buffer), then the tables."""
    header = _zero_header(names).copy()  # (its keys in the buffer's order)
    header.update(fields)
    at += len(names)
    for name, table in tables.items():
        header[name + "_table"] = at
        at += len(table)
    if len(header) != len(names):
        raise KeyError(f"fields {sorted(set(header) - set(names))} are not among the section's")
    return [np.fromiter(header.values(), np.int64, len(names)), *tables.values()]


@functools.lru_cache(maxsize=None)
def _zero_header(names: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(names, 0)


def _winograd_section(con: Contraction, plan: Plan, guards: int, at: int) -> list[np.ndarray]:
    """The winograd section (:data:`RUNTIME_WINOGRAD_FIELDS`) of ``con`` on the winograd
    ``plan``, for a kernel that tests ``guards`` guards, starting at ``at`` in the buffer."""
    form = plan.winograd
    image, weights = getattr(con, form.image), getattr(con, form.weights)
    rows, cols = form.rows, form.cols
    fields = {"mr": plan.mr, "vectors": plan.nr_vectors, "tile": form.tile, "batch": con.size("batch"), "m": form.M,
              "k": form.K, "tiles": form.tiles, "row_tiles": form.axis_tiles(rows), "col_tiles": form.axis_tiles(cols),
              "row_extent": rows.out.extent,
              "col_extent": cols.out.extent, "row_window": rows.window, "col_window": cols.window,
              "row_image": rows.out.image, "col_image": cols.out.image, "row_c": rows.out.c, "col_c": cols.out.c,
              "row_weights": rows.tap.weights, "col_weights": cols.tap.weights,
              "kc": plan.kc, "mc": plan.mc, "nc": plan.nc, "image_base": image.offset,
              "weights_base": weights.offset, "c_base": con.c.offset, "image_elements": image.elements}
    tables = {"image_batch": _offsets(con.batch, form.image), "weights_batch": _offsets(con.batch, form.weights),
              "c_batch": _offsets(con.batch, "c"), "image_k": _var_offsets(form.k, "image"),
              "weights_k": _var_offsets(form.k, "weights"), "image_n": _var_offsets(form.n, "image"),
              "c_n": _var_offsets(form.n, "c"), "weights_m": _var_offsets(form.m, "weights"),
              "c_m": _var_offsets(form.m, "c")}
    g_batch, g_k, g_n, g_row, g_col, g_k_min = [], [], [], [], [], []
    for i in range(guards):  # a guard this shape does not have holds everywhere
        if i < len(con.guards):
            g_batch.append(con.guards[i].const + _offsets(con.batch, f"g{i}"))
            g_k.append(_var_offsets(form.k, "g", i))
            g_n.append(_var_offsets(form.n, "g", i))
            g_row.append(rows.out.g[i])
            g_col.append(cols.out.g[i])
            # its least value over the input channels and a tile's input patch, from a tile's corner
            reach = form.patch - 1
            g_k_min.append(sum(min(0, v.g[i] * (v.extent - 1)) for v in form.k)
                           + min(0, reach * rows.out.g[i]) + min(0, reach * cols.out.g[i]))
        else:
            g_batch.append(np.zeros_like(tables["c_batch"]))
            g_k.append(np.zeros_like(tables["image_k"]))
            g_n.append(np.zeros_like(tables["image_n"]))
            g_row.append(0)
            g_col.append(0)
            g_k_min.append(0)
    fields["guards_k"] = int(any(table.any() for table in g_k))
    tables.update(g_batch=_joined(g_batch), g_k=_joined(g_k), g_n=_joined(g_n),
                  g_row=np.array(g_row or [0], np.int64), g_col=np.array(g_col or [0], np.int64),
                  g_k_min=np.array(g_k_min or [0], np.int64))
    return _section(RUNTIME_WINOGRAD_FIELDS, fields, tables, at)


def _dims(groups, which: str) -> tuple[tuple[int, int], ...]:
    """Each group's extent and stride in ``which`` (or guard coefficient), outer first: what a
    role's tables are made from."""
    return tuple((group.extent, group.stride(which)) for group in groups)


@functools.lru_cache(maxsize=512)
def _table(dims: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Element offsets (or a guard's values) per linear index of a role of these ``dims``
    (:func:`_dims`: each one affine dimension); read-only, kept for the variants and call
    shapes that share them (a chain's blocks of the same columns, a dimension of the same
    extent)."""
    offsets = None
    for extent, stride in dims:
        if extent == 1 and offsets is not None:
            continue  # (adds 0 to every offset)
        axis = np.arange(0, extent * stride, stride, dtype=np.int64) if stride else np.zeros(extent, np.int64)
        offsets = axis if offsets is None else (offsets[:, None] + axis).ravel()
    if offsets is None:
        offsets = np.zeros(1, np.int64)
    offsets.flags.writeable = False
    return offsets


def _offsets(groups, which: str) -> np.ndarray:
    """:func:`_table` of these groups in ``which``."""
    return _table(_dims(groups, which))


def _var_offsets(variables, which: str, guard: int = 0) -> np.ndarray:
    """Offsets in the tensor ``which`` names (a :class:`~tcpy.contraction_ir.Var` field; ``g``:
    guard ``guard``'s coefficients) per linear index of ``variables`` (outer first)."""
    return _table(tuple((var.extent, var.g[guard] if which == "g" else getattr(var, which)) for var in variables))


def _joined(tables) -> np.ndarray:
    return np.concatenate(tables) if tables else np.zeros(1, np.int64)


@functools.lru_cache(maxsize=256)
def _segments(dims: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Per linear index of :func:`_table` ``(dims)``, ``length * 4 + step``: the run of its
    offsets from it on with a step of 1 or 2 (``length`` 1, ``step`` 1 where neither continues)."""
    varying = [(extent, stride) for extent, stride in dims if extent != 1]
    if len(varying) <= 1:  # one step throughout: the runs end at the table's end, or are single
        n, step = varying[0] if varying else (1, 1)
        segments = np.arange(n * 4, 0, -4, dtype=np.int64) + step if step in (1, 2) else np.full(n, 5, np.int64)
        segments[-1] = 5  # (the last offset: a run of one)
        segments.flags.writeable = False
        return segments
    offsets = _table(dims)
    n = len(offsets)
    index = np.arange(n)
    step = np.zeros(n, np.int64)  # the step to the next offset, where it is 1 or 2, else 0
    np.subtract(offsets[1:], offsets[:-1], out=step[:-1])
    step[(step != 1) & (step != 2)] = 0
    # a run from i ends at the first index after it whose step to the next is another (n after
    # the last; the arrays filled in place: a new call shape's plan makes several)
    changes = np.empty(n, bool)
    changes[0] = True
    np.not_equal(step[1:], step[:-1], out=changes[1:])
    ends = np.full(n + 1, n)
    ends[:n][changes] = index[changes]
    ends = np.minimum.accumulate(ends[::-1])[::-1]
    length = np.where(step > 0, ends[1:] - index + 1, 1)
    segments = np.minimum(length, n - index) * 4 + np.maximum(step, 1)
    segments.flags.writeable = False
    return segments


def _unit_run(dims: tuple[tuple[int, int], ...]) -> bool:
    """Whether the offsets of :func:`_table` ``(dims)`` are one unit-stride run (x, x + 1, ...):
    each dimension (but those of one value) steps by the extent of those inside it."""
    step = 1
    for extent, stride in reversed(dims):
        if extent != 1:
            if stride != step:
                return False
            step *= extent
    return True


@functools.lru_cache(maxsize=256)
def _runs(dims: tuple[tuple[int, int], ...], width: int) -> np.ndarray:
    """Per block of ``width`` linear indices of :func:`_table` ``(dims)`` (the last block
    partial), 1 where the block's offsets are one unit-stride run (x, x + 1, ...)."""
    if _unit_run(dims):
        runs = np.ones(-(-math.prod(extent for extent, _ in dims) // width), np.int64)
        runs.flags.writeable = False
        return runs
    offsets = _table(dims)
    runs = np.ones(-(-len(offsets) // width), np.int64)
    breaks = (offsets[1:] - offsets[:-1] != 1).nonzero()[0]  # the steps from an index to the next that are not 1
    runs[breaks[breaks % width != width - 1] // width] = 0  # (a step into the next block breaks none)
    runs.flags.writeable = False
    return runs


def describe(buffer: np.ndarray, tile: Plan) -> str:
    """What the run-time engine runs with the plan ``buffer`` (``tile``: the kernel's plan at its
    nominal sizes, which names the winograd form it also holds)."""
    field = {name: int(buffer[index]) for name, index in _FIELD.items()}
    if field["winograd"]:
        at = field["winograd"]
        w = {name: int(buffer[at + index]) for index, name in enumerate(RUNTIME_WINOGRAD_FIELDS)}
        size = w["tile"]
        return (f"run-time engine (winograd path F({size}x{size}, 3x3), one routine per tile size and micro-tile "
                f"for every size; the cost model's choice at these sizes over the implicit GEMM): micro-tile "
                f"{w['mr']}x{w['vectors'] * tile.lanes}; at these sizes batch "
                f"{w['batch']} x {(size + 2) ** 2} products of M {w['m']} x K {w['k']} x {w['tiles']} tiles "
                f"({w['row_tiles']} x {w['col_tiles']} per image), blocks of {w['nc']} tiles, kc {w['kc']}, "
                f"mc {w['mc']}")
    held = (f"; its winograd path not taken at these sizes (the cost model's choice, or no 3x3 window at "
            f"stride 1)" if tile.winograd is not None else "")
    path = RUNTIME_PATHS[field["path"]]
    how = {"packed": "A and B packed",
           "small": "A and B read in place" + (", each B sliver copied" if field["copy_b"] else ""),
           "stream": "A read in place, each K block of B packed"}[path]
    return (f"run-time engine ({path} path: {how}; one routine for every size): micro-tile "
            f"{field['mr']}x{field['nr']}; at these sizes batch {field['batch']} x M {field['m']} x N {field['n']} x "
            f"K {field['k']}, blocks kc {field['kc']}, mc {field['mc']}, nc {field['nc']}; thread grid batch {field['grid_batch']} x M "
            f"{field['grid_m']} x N {field['grid_n']} x K 1"
            + ("; operands exchanged (the output is contiguous along the first)" if field["swapped"] else "")
            + held)
