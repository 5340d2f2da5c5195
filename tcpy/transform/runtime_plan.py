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
from typing import Mapping, Optional

import cython
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
        shapes = {name: tuple([max(1, d) for d in shape]) for name, shape in shapes.items()}
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
    sections = contraction_sections(con, plan, nominal, zero)
    return None if sections is None else assemble(sections)


def contraction_sections(con: Contraction, plan: Plan, nominal: Contraction, zero: Optional[str] = None
                         ) -> Optional[list]:
    """:func:`contraction_buffer` as its sections (:func:`_section`), to be assembled
    (:func:`assemble`) alone or into a larger buffer."""
    if len(con.guards) > len(nominal.guards):
        return None  # guards the kernel was not built to test
    swapped = con.a.tensor != nominal.a.tensor
    # the kernel runs exchanged operands only if they have one type: else back to its order
    keep = swapped and con.a.dtype is not con.b.dtype
    a, b, m, n, guarded = ("b", "a", "n", "m", {"a": "b", "b": "a", "": ""}[con.guarded]) if keep else \
        ("a", "b", "m", "n", con.guarded)
    acc = {"a": getattr(con, a), "b": getattr(con, b), "c": con.c}
    batch_size, m_size, n_size, k_size = con.sizes
    sizes_ = {"batch": batch_size, "m": m_size if m == "m" else n_size, "n": n_size if n == "n" else m_size, "k": k_size}
    if zero is not None:
        sizes_[zero] = 0
    dims = {
        "a_batch": _dims(con.batch, a), "a_m": _dims(getattr(con, m), a), "a_k": _dims(con.k, a),
        "b_batch": _dims(con.batch, b), "b_n": _dims(getattr(con, n), b), "b_k": _dims(con.k, b),
        "c_batch": _dims(con.batch, "c"), "c_m": _dims(getattr(con, m), "c"), "c_n": _dims(getattr(con, n), "c"),
    }
    tables = {name: _offsets(role) for name, role in dims.items()}
    own = getattr(con, m if guarded == "a" else n)
    g_batch, g_own, g_k = [], [], []
    for i in range(len(nominal.guards)):  # a guard this shape does not have holds everywhere
        if i < len(con.guards):
            which = f"g{i}"
            g_batch.append(_offsets(_dims(con.batch, which), con.guards[i].const))
            g_own.append(_offsets(_dims(own, which)))
            g_k.append(_offsets(_dims(con.k, which)))
        else:
            g_batch.append(_zeros_like(tables["c_batch"]))
            g_own.append(_zeros_like(tables["a_m"] if guarded == "a" else tables["b_n"]))
            g_k.append(_zeros_like(tables["a_k"]))
    tables.update(g_batch=_joined(g_batch), g_own=_joined(g_own), g_k=_joined(g_k))
    if plan.path == "winograd":  # (the packed loops' copies and stores do not run: no tables for them)
        tables.update(b_runs=_ZERO, c_runs=_ZERO, b_segments=_ZERO)
    else:  # (read from the b_n and c_n tables, as the buffer holds them)
        tables.update(b_runs=("runs", "b_n", plan.nr), c_runs=("runs", "c_n", plan.nr), b_segments=("segments", "b_n"))
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
    sections = [_section(RUNTIME_FIELDS, fields, tables, 0)]
    if plan.path == "winograd":
        at = sections[0][2]
        sections[0][1][_FIELD["winograd"]] = at
        sections.append(_winograd_section(con, plan, len(nominal.guards), at))
    return sections


# A plan buffer's tables are written where the buffer holds them, from these descriptions (no
# array per table and no copies: a new call shape's buffers are built at its first call):
# ("offsets", dims, const): :func:`_offsets`; ("values", ints); ("joined", descriptions): one
# after the other; of the section's offsets table named ``table`` (a role's linear index, N:
# what the packing reads along a B sliver, the stores write along a C row), ("runs", table,
# width): per block of ``width`` indices (the last partial), 1 where the block's offsets are one
# unit-stride run (x, x + 1, ...); ("segments", table): per index, ``length * 4 + step``, the run
# of its offsets from it on with a step of 1 or 2 (``length`` 1, ``step`` 1 where neither
# continues).
_ZERO = ("values", (0,))


def _offsets(dims: tuple[tuple[int, int], ...], const: int = 0) -> tuple:
    """Element offsets (or a guard's values) per linear index of a role of these ``dims``
    (:func:`_dims`: each one affine dimension, outer first), plus ``const``: the offset of each
    dimension's index times its stride, summed."""
    return ("offsets", dims, const)


def _zeros_like(table: tuple) -> tuple:
    """A table of zeros as long as the offsets ``table``."""
    return ("offsets", tuple([(extent, 0) for extent, _ in table[1]]), 0)


def _joined(tables: list) -> tuple:
    """``tables`` one after the other (one 0 when there are none)."""
    return ("joined", tuple(tables)) if tables else _ZERO


@cython.locals(length=cython.Py_ssize_t)
def _length(table: tuple, lengths: Mapping[str, int]) -> int:
    """How many values ``table`` holds (``lengths``: those of the section's tables before it,
    by name)."""
    kind = table[0]
    if kind == "offsets":
        length = 1
        for extent, _ in table[1]:
            length *= extent
        return length
    if kind == "values":
        return len(table[1])
    if kind == "joined":
        length = 0
        for part in table[1]:
            length += _length(part, lengths)
        return length
    if kind == "runs":
        return -(-lengths[table[1]] // table[2])
    return lengths[table[1]]  # segments


@functools.lru_cache(maxsize=None)
def _layout(names: tuple[str, ...]) -> tuple[dict[str, int], dict[str, int]]:
    """Each field's index in a header of ``names``, and each table's (its ``<name>_table`` field), by name."""
    layout = {name: index for index, name in enumerate(names)}
    return layout, {name[:-len("_table")]: index for name, index in layout.items() if name.endswith("_table")}


def _section(names: tuple[str, ...], fields: Mapping[str, int], tables: Mapping[str, tuple], at: int
             ) -> tuple[int, list[int], int, list[tuple]]:
    """A section starting at ``at`` in its buffer: a header of ``names`` holding ``fields`` and
    where each of ``tables`` starts (its ``<name>_table`` field), then the tables. Returns
    ``(at, header, end, placed)``: ``placed`` the tables' descriptions with their starts, a
    runs or segments table's offsets table as its start and length."""
    layout, table_fields = _layout(names)
    header = [0] * len(names)
    for name, value in fields.items():
        if name not in layout:
            raise KeyError(f"field {name!r} is not among the section's")
        header[layout[name]] = value
    start, at = at, at + len(names)
    lengths, starts, placed = {}, {}, []
    for name, table in tables.items():
        header[table_fields[name]] = at
        length = _length(table, lengths)
        if table[0] == "runs" or table[0] == "segments":
            table = (table[0], starts[table[1]], lengths[table[1]], *table[2:])
        lengths[name] = length
        starts[name] = at
        placed.append((at, table))
        at += length
    return start, header, at, placed


def assemble(sections: list, buffer: Optional[np.ndarray] = None, at: int = 0) -> np.ndarray:
    """One plan buffer of these :func:`_section` results, their tables written in place; or
    written into ``buffer`` from ``at`` on (the sections' positions, in their headers too, stay
    relative to ``at``: a larger buffer holding plan buffers)."""
    if buffer is None:
        buffer = np.empty(at + sections[-1][2], np.int64)
    for start, header, _, placed in sections:
        buffer[at + start:at + start + len(header)] = header
        _write_tables(buffer, placed, at)
    return buffer


# (the planner's annotations are not C types, see setup.py: these loops declare theirs)
@cython.ccall
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(out=cython.long[::1], base=cython.Py_ssize_t)
def _write_tables(buffer, placed: list, base) -> None:
    """Write the tables ``placed`` (:func:`_section`) into ``buffer``, from ``base`` on."""
    out = buffer
    for at, table in placed:
        _write(out, base + at, table, base)


@cython.cfunc
@cython.returns(cython.Py_ssize_t)
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(out=cython.long[::1], at=cython.Py_ssize_t, base=cython.Py_ssize_t, i=cython.Py_ssize_t, values=tuple,
               table=tuple)
def _write(out, at, table, base):
    """Write ``table`` from ``out[at]`` on (the section's tables read at ``base`` on); returns
    where it ends."""
    kind = table[0]
    if kind == "offsets":
        return _write_offsets(out, at, table[1], table[2])
    if kind == "values":
        values = table[1]
        for i in range(len(values)):
            out[at + i] = values[i]
        return at + len(values)
    if kind == "joined":
        for part in table[1]:
            at = _write(out, at, part, base)
        return at
    if kind == "runs":
        return _write_runs(out, at, base + table[1], table[2], table[3])
    return _write_segments(out, at, base + table[1], table[2])


@cython.cfunc
@cython.returns(cython.Py_ssize_t)
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(out=cython.long[::1], at=cython.Py_ssize_t, dims=tuple, const=cython.long, length=cython.Py_ssize_t,
               extent=cython.Py_ssize_t, j=cython.Py_ssize_t, e=cython.Py_ssize_t, stride=cython.long, base=cython.long)
def _write_offsets(out, at, dims, const):
    """:func:`_offsets`: each dimension, outer first, expands the table so far in place (each
    value into ``extent`` values ``stride`` apart, from the last down: none is overwritten before
    it is read)."""
    for extent, _ in dims:
        if extent == 0:
            return at
    out[at] = const
    length = 1
    for extent, stride in dims:
        if extent != 1:
            for j in range(length - 1, -1, -1):
                base = out[at + j]
                for e in range(extent - 1, -1, -1):
                    out[at + j * extent + e] = base + e * stride
            length *= extent
    return at + length


@cython.cfunc
@cython.returns(cython.Py_ssize_t)
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(out=cython.long[::1], at=cython.Py_ssize_t, source=cython.Py_ssize_t, n=cython.Py_ssize_t,
               width=cython.Py_ssize_t, block=cython.Py_ssize_t, i=cython.Py_ssize_t, blocks=cython.Py_ssize_t)
def _write_runs(out, at, source, n, width):
    """The runs of the offsets table of ``n`` values at ``source`` (see ``_ZERO``)."""
    blocks = (n + width - 1) // width
    for block in range(blocks):
        out[at + block] = 1
        for i in range(block * width, min((block + 1) * width, n) - 1):
            if out[source + i + 1] - out[source + i] != 1:
                out[at + block] = 0
                break
    return at + blocks


@cython.cfunc
@cython.returns(cython.Py_ssize_t)
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(out=cython.long[::1], at=cython.Py_ssize_t, source=cython.Py_ssize_t, n=cython.Py_ssize_t,
               i=cython.Py_ssize_t, step=cython.long, length=cython.Py_ssize_t, end=cython.Py_ssize_t)
def _write_segments(out, at, source, n):
    """The segments of the offsets table of ``n`` values at ``source`` (see ``_ZERO``): the
    steps first (1 or 2, else 0), then from the last index down each run's length, a run from
    ``i`` ending at the first index after it whose step differs."""
    for i in range(n):
        step = out[source + i + 1] - out[source + i] if i + 1 < n else 0
        out[at + i] = step if step == 1 or step == 2 else 0
    end = n
    for i in range(n - 1, -1, -1):
        step = out[at + i]
        length = min(end - i + 1 if step > 0 else 1, n - i)
        if i == 0 or out[at + i - 1] != step:
            end = i
        out[at + i] = length * 4 + max(step, 1)
    return at + n


def _winograd_section(con: Contraction, plan: Plan, guards: int, at: int) -> tuple:
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
    tables = {"image_batch": _offsets(_dims(con.batch, form.image)),
              "weights_batch": _offsets(_dims(con.batch, form.weights)),
              "c_batch": _offsets(_dims(con.batch, "c")), "image_k": _var_offsets(form.k, "image"),
              "weights_k": _var_offsets(form.k, "weights"), "image_n": _var_offsets(form.n, "image"),
              "c_n": _var_offsets(form.n, "c"), "weights_m": _var_offsets(form.m, "weights"),
              "c_m": _var_offsets(form.m, "c")}
    g_batch, g_k, g_n, g_row, g_col, g_k_min = [], [], [], [], [], []
    for i in range(guards):  # a guard this shape does not have holds everywhere
        if i < len(con.guards):
            g_batch.append(_offsets(_dims(con.batch, f"g{i}"), con.guards[i].const))
            g_k.append(_var_offsets(form.k, "g", i))
            g_n.append(_var_offsets(form.n, "g", i))
            g_row.append(rows.out.g[i])
            g_col.append(cols.out.g[i])
            # its least value over the input channels and a tile's input patch, from a tile's corner
            reach = form.patch - 1
            g_k_min.append(sum(min(0, v.g[i] * (v.extent - 1)) for v in form.k)
                           + min(0, reach * rows.out.g[i]) + min(0, reach * cols.out.g[i]))
        else:
            g_batch.append(_zeros_like(tables["c_batch"]))
            g_k.append(_zeros_like(tables["image_k"]))
            g_n.append(_zeros_like(tables["image_n"]))
            g_row.append(0)
            g_col.append(0)
            g_k_min.append(0)
    fields["guards_k"] = int(any(map(_nonzero, g_k)))
    tables.update(g_batch=_joined(g_batch), g_k=_joined(g_k), g_n=_joined(g_n), g_row=("values", tuple(g_row or [0])),
                  g_col=("values", tuple(g_col or [0])), g_k_min=("values", tuple(g_k_min or [0])))
    return _section(RUNTIME_WINOGRAD_FIELDS, fields, tables, at)


def _dims(groups, which: str) -> tuple[tuple[int, int], ...]:
    """Each group's extent and stride in ``which`` (or guard coefficient), outer first: what a
    role's tables are made from."""
    if which[0] == "g":
        guard = int(which[1:])
        return tuple([(group.extent, group.g[guard]) for group in groups])
    return tuple([(group.extent, getattr(group, which)) for group in groups])


def _var_offsets(variables, which: str, guard: int = 0) -> tuple:
    """:func:`_offsets` in the tensor ``which`` names (a :class:`~tcpy.contraction_ir.Var` field;
    ``g``: guard ``guard``'s coefficients) per linear index of ``variables`` (outer first)."""
    return _offsets(tuple([(var.extent, var.g[guard] if which == "g" else getattr(var, which)) for var in variables]))


def _nonzero(table: tuple) -> bool:
    """Whether the offsets ``table`` holds a value other than 0."""
    _, dims, const = table
    if any(extent == 0 for extent, _ in dims):
        return False
    return const != 0 or any(extent > 1 and stride != 0 for extent, stride in dims)


def _unit_run(dims: tuple[tuple[int, int], ...]) -> bool:
    """Whether the offsets of :func:`_offsets` ``(dims)`` are one unit-stride run (x, x + 1, ...):
    each dimension (but those of one value) steps by the extent of those inside it."""
    step = 1
    for extent, stride in reversed(dims):
        if extent != 1:
            if stride != step:
                return False
            step *= extent
    return True


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
