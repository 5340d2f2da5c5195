"""tcpy kernels on Dask arrays: the chunking plan comes from range inference.

``tcpy.dask.apply(kernel, *arrays)`` runs a kernel on chunked arrays and returns Dask arrays.
Range inference already knows which input elements each output element reads, so the plan is
derived, not configured:

* Tensor axes are grouped into *dimensions*: axes linked by an output index variable of some
  statement (``Y(n, d) = X(n, d)`` links ``X.0`` and ``Y.0``) or by a reduction variable they
  are indexed by alone (``A(m, k) * B(k, n)`` links ``A.1`` and ``B.0``).
* A dimension whose statements each write along it (every read index ``s*h + d*kh + c``,
  affine in the statement's one output variable ``h``) is split into output blocks. Each block
  reads the input region its access maps give (strides, dilation, window offsets), sliced
  from the neighbouring chunks: *blockwise* when that region is the aligned chunk, a *halo*
  otherwise. The kernel runs on the slices; its local output is trimmed to the block.
* A dimension only read, by one reduction variable alone (GEMM's ``k``), is *reduced across
  chunks*: the kernel gives one partial result per chunk, and Dask combines them in a tree
  with the statement's operator, in the type the reduction accumulates in (float32 for half).
* Anything else must be whole and is rechunked to one chunk, with a :class:`~tcpy.TCWarning`
  (or a :class:`~tcpy.TCArgumentError` with ``rechunk=False``) naming the dimension.

A split is only used after it is proven exact with isl, block by block: the statement's
ranges, every access index and every ternary condition, evaluated at the block's local sizes
with its local origin, must equal the whole-array ones on the elements the block needs. So
results equal the kernel run on the whole arrays (up to the order of a reduction's sums).

Tasks carry the def's source and options, never a compiled library: each worker process
builds (or finds in its disk cache) the kernel itself, and runs it on ``cores // (tasks that
run at once on its machine)`` threads.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Optional

import dask
import dask.array as da
import islpy as isl
import numpy as np

from . import binding
from .api import Explanation, Kernel, define
from .errors import TCArgumentError, TCPreconditionError, TCWarning
from .lang import ast
from .lang.types import accumulator_type
from .options import Options
from .reference import ReferenceKernel
from .ranges.affine import NotAffine
from .ranges.convert import Converter
from .target import Target

__all__ = ["apply", "plan", "explain", "Plan", "DimensionPlan"]

# How partial results of a reduction split across chunks combine.
_COMBINE = {"+": "sum", "*": "prod", "max": "max", "min": "min"}


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class DimensionPlan:
    """How one dimension of a def runs on chunked arrays.

    ``kind`` is ``"blockwise"``, ``"halo"``, ``"reduced"`` (partials combined with
    ``operator``), ``"rechunked"`` (it had to be one chunk) or ``"whole"`` (it was one chunk).
    ``axes`` are the input axes in it, as ``(tensor, axis)``; ``halo`` the input elements
    read before and after an aligned block, per input axis; ``blocks`` the number of blocks.
    """

    name: str
    axes: tuple
    kind: str
    blocks: int = 1
    halo: tuple = ()
    operator: Optional[str] = None
    reason: str = ""

    @property
    def depth(self) -> int:
        """The largest halo depth on any side of any of its input axes."""
        return max((d for pair in self.halo for d in pair[1:]), default=0)

    def describe(self) -> str:
        """One line of :func:`explain`."""
        where = ", ".join(f"{t}.{a}" for t, a in self.axes) or "no input axis"
        if self.kind == "blockwise":
            what = f"blockwise in {self.blocks} blocks"
        elif self.kind == "halo":
            sides = "; ".join(f"{t}.{a}: {before} before, {after} after" for (t, a), before, after in self.halo)
            what = f"halo of depth {self.depth} in {self.blocks} blocks ({sides})"
        elif self.kind == "reduced":
            what = f"reduced across {self.blocks} chunks with {self.operator}"
        elif self.kind == "rechunked":
            what = f"rechunked to one chunk: {self.reason}"
        else:
            what = "one chunk"
        return f"{self.name} ({where}): {what}"


@dataclass(frozen=True)
class Plan:
    """The plan of one call: a :class:`DimensionPlan` per dimension, and the output chunks."""

    kernel: str
    dimensions: tuple
    output_chunks: dict

    def dimension(self, name: str) -> DimensionPlan:
        """The plan of the dimension called ``name`` (a size variable, or ``tensor.axis``)."""
        for dim in self.dimensions:
            if dim.name == name:
                return dim
        raise KeyError(f"no dimension {name!r}; the plan has {', '.join(d.name for d in self.dimensions)}")

    def __str__(self) -> str:
        lines = [f"def '{self.kernel}' on chunked arrays:"]
        lines += [f"  {dim.describe()}" for dim in self.dimensions]
        lines += [f"  output {name}: chunks {chunks}" for name, chunks in self.output_chunks.items()]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- public API


def apply(kernel, *arrays, rechunk: bool = True, options: Optional[Options] = None):
    """Run ``kernel`` on Dask (or NumPy) arrays; returns a Dask array per output (a tuple for several).

    ``kernel`` comes from :func:`tcpy.define` (compiled, or ``backend="reference"``); rank-0
    parameters take Python numbers. The plan (see :func:`explain`) splits every dimension it can prove exact; a dimension
    that must be whole but is chunked is rechunked with a :class:`~tcpy.TCWarning`, or raises
    :class:`~tcpy.TCArgumentError` when ``rechunk=False``. ``options`` replaces the kernel's
    options in the tasks (its ``num_threads``, when set, overrides the per-task thread count).
    """
    call = _Call(kernel, arrays, options)
    call.plan_dimensions(rechunk)
    return call.build()


def plan(kernel, *arrays) -> Plan:
    """The plan :func:`apply` would use for these arrays (no warning, no error for a rechunk)."""
    call = _Call(kernel, arrays, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TCWarning)
        call.plan_dimensions(True)
    return call.plan()


def explain(kernel, *arrays) -> Explanation:
    """Per dimension: blockwise, halo of depth d, reduced across chunks, or rechunked; as text."""
    return Explanation(str(plan(kernel, *arrays)) + "\n")


# ----------------------------------------------------------------------------- analysis


class _SizedConverter(Converter):
    """Index expressions at concrete sizes, with some index variables moved to a local origin:
    ``var(v)`` is ``v - shift[v]``, so an expression of the block's local kernel is written in
    whole-array coordinates and can be compared with the whole-array one."""

    def __init__(self, dims, sizes, shapes, shift=None):
        super().__init__((), dims, {})
        self.sizes, self.shapes, self.shift = sizes, shapes, shift or {}

    def size(self, name):
        return self.const(self.sizes[name])

    def extent(self, node):
        if node.tensor in self.shapes:
            return self.const(self.shapes[node.tensor][node.dim])
        return super().extent(node)

    def var(self, name):
        pa = super().var(name)
        shift = self.shift.get(name, 0)
        return pa.sub(self.const(shift)) if shift else pa

    def box(self, ranges) -> isl.Set:
        """The set ``lo <= v < hi`` for ``ranges = {v: (lo, hi)}`` (unshifted variables)."""
        box = self.universe()
        for name, (lo, hi) in ranges.items():
            v = Converter.var(self, name)
            box = box.intersect(self.const(lo).le_set(v)).intersect(v.lt_set(self.const(hi)))
        return box


def _value_nodes(e: ast.Expr):
    """The nodes of ``e`` used as values: outside tensor indices and ternary conditions."""
    if isinstance(e, ast.Access):
        return
    yield e
    children = (e.then, e.other) if isinstance(e, ast.Ternary) else e.children()
    for child in children:
        yield from _value_nodes(child)


def _value_vars(e: ast.Expr) -> frozenset:
    """Index variables ``e`` uses as values."""
    return frozenset(n.name for n in _value_nodes(e) if isinstance(n, ast.IndexVar))


def _reads(stmt: ast.Stmt):
    """Every access a statement makes (right side, conditions, ``exists`` clauses)."""
    exprs = [stmt.rhs] + [c.expr for c in stmt.where if isinstance(c, ast.Exists)]
    return [n for e in exprs for n in e.walk() if isinstance(n, ast.Access) and n.indices]


def _conditions(stmt: ast.Stmt):
    return [n.cond for n in stmt.rhs.walk() if isinstance(n, ast.Ternary)]


class _Groups:
    """Union-find over tensor axes ``(tensor, axis)``."""

    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


@dataclass
class _Dim:
    """A dimension while it is planned."""

    axes: list                      # every (tensor, axis) in it, inputs first
    name: str = ""
    kind: str = "whole"
    reason: str = ""
    scale: dict = dataclasses.field(default_factory=dict)    # tensor axis -> elements per output element
    var: dict = dataclasses.field(default_factory=dict)      # statement index -> its variable along the dim
    blocks: list = dataclasses.field(default_factory=list)   # [(o0, o1)] output blocks or reduced chunks
    halo: tuple = ()
    operator: Optional[str] = None


class _Unsupported(Exception):
    """This dimension cannot be split: the message says why."""


class _Call:
    """One ``apply``: the arguments, the dimensions and their plan, then the Dask graph."""

    def __init__(self, kernel, arrays, options: Optional[Options]):
        if not isinstance(kernel, (Kernel, ReferenceKernel)):
            raise TCArgumentError(f"tcpy.dask.apply needs a kernel from tcpy.define, got {type(kernel).__name__}")
        self.kernel = kernel
        self.options = options or getattr(kernel, "options", None) or Options()
        self.def_ = kernel.def_
        self.types = {t.name: t.scalar for t in self.def_.tensors}
        params = self.def_.params
        if len(arrays) != len(params):
            raise TCArgumentError(f"def '{self.def_.name}' takes {len(params)} arguments "
                                  f"({', '.join(p.name for p in params)}), got {len(arrays)}")
        self.args = {}
        for param, arg in zip(params, arrays):
            if isinstance(arg, np.ndarray) and arg.ndim > 0:
                arg = da.from_array(arg, chunks=arg.shape)
            if isinstance(arg, da.Array) and any(math.isnan(c) for cs in arg.chunks for c in cs):
                raise TCArgumentError(f"argument {param.name} of def '{self.def_.name}' has unknown chunk "
                                      "sizes; call compute_chunk_sizes() on it first")
            self.args[param.name] = arg
        # shapes and dtypes checked as the kernel checks them, on zero-strided stand-ins
        stand_ins = [np.broadcast_to(np.zeros((), a.dtype), a.shape) if isinstance(a, da.Array) else a
                     for a in self.args.values()]
        _, self.sizes = binding.bind_arguments(self.def_, stand_ins)
        self.bound = kernel.ranges.bind(self.sizes)
        self.shapes = {name: tuple(a.shape) for name, a in self.args.items() if isinstance(a, da.Array)}
        self.shapes.update(self.bound.shapes)
        self.stmts = [st.stmt for st in kernel.ranges.statements]
        self.outputs = [r.name for r in self.def_.returns]
        self.dims = self._dimensions()
        self._affs: dict = {}     # (statement, dimension) -> reads along it
        self._regions: dict = {}  # (dimension, block) -> regions the block needs
        self._local: dict = {}    # shapes of a block's inputs -> (sizes, bound ranges) or why not

    # -- dimensions

    def _dimensions(self) -> list:
        groups = _Groups()
        for name, shape in self.shapes.items():
            for axis in range(len(shape)):
                groups.find((name, axis))
        for stmt in self.stmts:
            axes_of = {e.name: [(stmt.target, p)] for p, e in enumerate(stmt.lhs)}
            for access in _reads(stmt):
                for axis, index in enumerate(access.indices):
                    # an output variable links every axis it indexes (not through data: B(C(i)))
                    for v in _value_vars(index) & set(stmt.output_vars):
                        axes_of[v].append((access.tensor, axis))
                    # a reduction variable links the axes it indexes alone (GEMM's k)
                    if isinstance(index, ast.IndexVar) and index.name in stmt.reduction_vars:
                        axes_of.setdefault(index.name, []).append((access.tensor, axis))
            for axes in axes_of.values():
                for other in axes[1:]:
                    groups.union(axes[0], other)
        members: dict = {}
        for axis in groups.parent:
            members.setdefault(groups.find(axis), []).append(axis)
        inputs = [p.name for p in self.def_.params]
        order = {name: i for i, name in enumerate(inputs + self.outputs + [t.name for t in self.def_.temporaries])}
        dims = []
        for axes in members.values():
            axes.sort(key=lambda ta: (order.get(ta[0], len(order)), ta[1]))
            dims.append(_Dim(axes, name=self._dim_name(axes[0])))
        dims.sort(key=lambda d: (order.get(d.axes[0][0], len(order)), d.axes[0][1]))
        return dims

    def _dim_name(self, axis) -> str:
        tensor, pos = axis
        for p in self.def_.params + self.def_.returns:
            if p.name == tensor and p.type is not None and isinstance(p.type.dims[pos], ast.Name):
                return p.type.dims[pos].name
        return f"{tensor}.{pos}"

    def input_axes(self, dim: _Dim):
        return [(t, a) for t, a in dim.axes if isinstance(self.args.get(t), da.Array)]

    def chunk_count(self, dim: _Dim) -> int:
        return max((len(self.args[t].chunks[a]) for t, a in self.input_axes(dim)), default=1)

    # -- planning

    def plan_dimensions(self, rechunk: bool):
        self.rechunk = rechunk
        for dim in self.dims:
            if self.chunk_count(dim) <= 1:
                continue
            try:
                self._split(dim)
            except _Unsupported as why:
                self._rechunk(dim, str(why), 4)
        self._verify()

    def _split(self, dim: _Dim):
        touching = [i for i, stmt in enumerate(self.stmts) if self._touches(stmt, dim)]
        members = set(dim.axes)
        written = [i for i in touching if any((self.stmts[i].target, p) in members
                                              for p in range(len(self.stmts[i].lhs)))]
        if written and written == touching:
            self._split_spatial(dim, touching)
        elif not written and len(touching) == 1:
            self._split_reduction(dim, touching[0])
        elif not touching:
            raise _Unsupported("no statement reads along it")
        elif written:
            reducer = next(self.stmts[i] for i in touching if i not in written)
            raise _Unsupported(f"{reducer.target} reduces it and {self.stmts[written[0]].target} is written along it")
        else:
            raise _Unsupported(f"{len(touching)} statements reduce it "
                               f"({', '.join(self.stmts[i].target for i in touching)})")

    def _touches(self, stmt, dim) -> bool:
        members = set(dim.axes)
        return (any((stmt.target, p) in members for p in range(len(stmt.lhs)))
                or any((a.tensor, p) in members for a in _reads(stmt) for p in range(len(a.indices))))

    def _index_affs(self, index: int, dim: _Dim):
        """(tensor, axis, coefficients by variable, constant) of each read along ``dim``."""
        key = (index, id(dim))
        if key not in self._affs:
            self._affs[key] = self._read_affs(index, dim)
        return self._affs[key]

    def _read_affs(self, index: int, dim: _Dim):
        stmt = self.stmts[index]
        conv = _SizedConverter(stmt.index_vars, self.sizes, self.shapes)
        reads = []
        for access in _reads(stmt):
            for axis, expr in enumerate(access.indices):
                if (access.tensor, axis) not in set(dim.axes):
                    continue
                try:
                    pieces = conv.affine(expr).get_pieces()
                except NotAffine:
                    raise _Unsupported(f"{access} indexes it by data or a non-affine expression") from None
                aff = pieces[0][1] if len(pieces) == 1 else None
                if aff is None or aff.dim(isl.dim_type.div) or not aff.get_constant_val().is_int():
                    raise _Unsupported(f"{access} indexes it by a piecewise or divided expression")
                coeffs = {v: aff.get_coefficient_val(isl.dim_type.in_, pos).to_python()
                          for pos, v in enumerate(stmt.index_vars)}
                reads.append((access.tensor, axis, {v: c for v, c in coeffs.items() if c},
                              aff.get_constant_val().to_python()))
        return reads

    def _split_spatial(self, dim: _Dim, touching):
        members = set(dim.axes)
        for i in touching:
            stmt = self.stmts[i]
            along = [stmt.lhs[p].name for p in range(len(stmt.lhs)) if (stmt.target, p) in members]
            if len(along) != 1:
                raise _Unsupported(f"{stmt.target} has {len(along)} axes in it")
            dim.var[i] = along[0]
        out_axes = [(t, a) for t, a in dim.axes if t in self.outputs]
        extents = {self.shapes[t][a] for t, a in out_axes}
        if len(extents) != 1:
            raise _Unsupported("the outputs along it have different extents" if extents else "no output has it")
        # elements of each tensor axis per output element, from the reads' coefficients
        dim.scale = {axis: 1 for axis in out_axes}
        for i in reversed(touching):
            stmt, v = self.stmts[i], dim.var[i]
            lhs_axis = next((stmt.target, p) for p in range(len(stmt.lhs)) if (stmt.target, p) in members)
            if lhs_axis not in dim.scale:
                continue  # a temporary nothing later reads
            for tensor, axis, coeffs, _ in self._index_affs(i, dim):
                step = coeffs.get(v, 0)
                if step < 1:
                    raise _Unsupported(f"{tensor} is read along it with step {step} of '{v}'")
                scale = step * dim.scale[lhs_axis]
                if dim.scale.setdefault((tensor, axis), scale) != scale:
                    raise _Unsupported(f"{tensor} is read along it with two different strides")
        (extent,) = extents
        ref = max(self.input_axes(dim), key=lambda ta: len(self.args[ta[0]].chunks[ta[1]]))
        if ref not in dim.scale:
            raise _Unsupported(f"{ref[0]} is chunked along it but not read")
        bounds = np.cumsum((0,) + self.args[ref[0]].chunks[ref[1]])
        edges = sorted({min(extent, -(-int(b) // dim.scale[ref])) for b in bounds} | {0, extent})
        dim.blocks = [(a, b) for a, b in zip(edges, edges[1:]) if b > a] or [(0, extent)]
        dim.halo = self._halo(dim)
        plain = all(before == 0 and after == 0 for _, before, after in dim.halo) and all(
            s == 1 for s in dim.scale.values())
        dim.kind = "blockwise" if plain else "halo"

    def _halo(self, dim: _Dim) -> tuple:
        """Per input axis: elements read before and after the aligned block, from the access
        maps composed through the statements, for a block far from the array's edges."""
        far = 1 << 40
        regions = self._needed_regions(dim, (far, far + 1), clip=False)
        return tuple((axis, max(0, dim.scale[axis] * far - regions[axis][0]),
                      max(0, regions[axis][1] - dim.scale[axis] * (far + 1)))
                     for axis in self.input_axes(dim) if axis in regions)

    def _split_reduction(self, dim: _Dim, index: int):
        stmt = self.stmts[index]
        reads = self._index_affs(index, dim)
        if len(self.stmts) != 1:
            raise _Unsupported(f"{stmt.target} reduces it and the def has further statements")
        if stmt.reduction not in _COMBINE or not (stmt.init or stmt.reduction == "+"):
            raise _Unsupported(f"'{stmt.op}' partial results cannot be combined across chunks")
        ks = {next(iter(coeffs)) for _, _, coeffs, const in reads
              if len(coeffs) == 1 and list(coeffs.values()) == [1] and const == 0}
        if len(ks) != 1 or ks & set(stmt.output_vars):
            raise _Unsupported("it is not indexed by one reduction variable alone")
        (k,) = ks
        for access in _reads(stmt):
            for axis, expr in enumerate(access.indices):
                if (access.tensor, axis) not in set(dim.axes) and any(
                        isinstance(n, ast.IndexVar) and n.name == k for n in expr.walk()):
                    raise _Unsupported(f"'{k}' also indexes {access} outside it")
        dim.var[index] = k
        ref = max(self.input_axes(dim), key=lambda ta: len(self.args[ta[0]].chunks[ta[1]]))
        bounds = np.cumsum((0,) + self.args[ref[0]].chunks[ref[1]])
        dim.blocks = [(int(a), int(b)) for a, b in zip(bounds, bounds[1:]) if b > a]
        dim.kind, dim.operator = "reduced", stmt.reduction

    # -- cells: one kernel run each

    def cells(self):
        """Every combination of the split dimensions' blocks, as {dim index: block}."""
        split = [(d, dim) for d, dim in enumerate(self.dims) if dim.blocks]
        cells = [{}]
        for d, dim in split:
            cells = [{**cell, d: block} for cell in cells for block in dim.blocks]
        return cells

    def cell_slices(self, cell):
        """The input slices of one cell, and each tensor axis's local origin."""
        origin: dict = {}
        needed: dict = {}
        for d, block in cell.items():
            dim = self.dims[d]
            if dim.kind == "reduced":
                for axis in self.input_axes(dim):
                    origin[axis] = block[0]
                    needed[axis] = block
                continue
            regions = self._needed(dim, block)
            ref = block[0]
            for axis, (lo, _) in regions.items():
                ref = min(ref, max(lo, 0) // dim.scale[axis])
            for axis in dim.axes:
                if axis in dim.scale:
                    origin[axis] = ref * dim.scale[axis]
            for axis in self.input_axes(dim):
                if axis not in dim.scale:
                    continue  # read by nothing the block needs
                size = self.shapes[axis[0]][axis[1]]
                lo, hi = regions.get(axis, (origin[axis], size))
                needed[axis] = (origin[axis], max(origin[axis], min(size, hi)))
        # inputs sharing a size variable get slices of one length, as the kernel requires
        lengths: dict = {}
        for (tensor, axis), (lo, hi) in needed.items():
            key = self._dim_name((tensor, axis))
            lengths[key] = max(lengths.get(key, 0), hi - lo)
        slices = {}
        for tensor, arg in self.args.items():
            if not isinstance(arg, da.Array):
                continue
            index = []
            for axis, size in enumerate(arg.shape):
                if (tensor, axis) in needed:
                    lo = needed[(tensor, axis)][0]
                    hi = min(size, lo + lengths[self._dim_name((tensor, axis))])
                    index.append(slice(lo, hi))
                else:
                    index.append(slice(0, size))
            slices[tensor] = tuple(index)
        return slices, origin

    def _needed(self, dim: _Dim, block) -> dict:
        """The region of each tensor axis of ``dim`` the output block needs (a hull, whole-array coords)."""
        key = (id(dim), block)
        if key not in self._regions:
            self._regions[key] = self._needed_regions(dim, block)
        return self._regions[key]

    def _needed_regions(self, dim: _Dim, block, clip: bool = True) -> dict:
        needed = {axis: block for axis in dim.axes if axis[0] in self.outputs}
        for i in sorted(dim.var, reverse=True):
            stmt, v = self.stmts[i], dim.var[i]
            lhs_axis = next((stmt.target, p) for p in range(len(stmt.lhs)) if (stmt.target, p) in set(dim.axes))
            if lhs_axis not in needed:
                continue
            ranges = self.bound.statements[i]
            lo_v, hi_v = needed[lhs_axis]
            if clip:  # else: a block far inside the arrays, for the halo's depth
                lo_v, hi_v = max(ranges[v][0], lo_v), min(ranges[v][1], hi_v)
            if lo_v >= hi_v or any(a >= b for a, b in ranges.values()):
                continue
            for tensor, axis, coeffs, const in self._index_affs(i, dim):
                lo = hi = const
                for w, c in coeffs.items():
                    a, b = (lo_v, hi_v) if w == v else ranges[w]
                    lo, hi = lo + min(c * a, c * (b - 1)), hi + max(c * a, c * (b - 1))
                hi += 1
                if clip:
                    lo, hi = max(lo, 0), min(hi, self.shapes[tensor][axis])
                if lo < hi:
                    old = needed.get((tensor, axis))
                    needed[(tensor, axis)] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))
        return needed

    # -- proof that each cell computes what the whole arrays would

    def _rechunk(self, dim: _Dim, why: str, stacklevel: int):
        dim.kind, dim.reason, dim.blocks = "rechunked", why, []
        axes = ", ".join(f"axis {a} of {t}" for t, a in self.input_axes(dim))
        message = f"def '{self.def_.name}': dimension {dim.name} ({axes}) must be one chunk: {why}"
        if not self.rechunk:
            raise TCArgumentError(f"{message}; got {self.chunk_count(dim)} chunks (rechunk it, or pass "
                                  "rechunk=True)")
        warnings.warn(f"{message}; rechunked its {self.chunk_count(dim)} chunks to one", TCWarning,
                      stacklevel=stacklevel)

    def _verify(self):
        """Prove every split cell exact with isl; a dimension that fails is rechunked."""
        for dim in self.dims:
            for block in list(dim.blocks):
                problem = self._check_cell({self.dims.index(dim): block})
                if problem is not None:
                    self._rechunk(dim, problem, 5)
                    break
        for cell in self.cells():
            if len(cell) > 1:
                problem = self._check_cell(cell)
                if problem is not None:
                    self._rechunk(self.dims[next(iter(cell))], problem, 5)
                    return self._verify()

    def _check_cell(self, cell) -> Optional[str]:
        slices, origin = self.cell_slices(cell)
        local_shapes = {t: tuple(s.stop - s.start for s in idx) for t, idx in slices.items()}
        key = tuple(sorted(local_shapes.items()))
        if key not in self._local:  # blocks of one shape share their ranges
            stand_ins = [np.broadcast_to(np.zeros((), a.dtype), local_shapes[n]) if isinstance(a, da.Array) else a
                         for n, a in self.args.items()]
            try:
                _, local_sizes = binding.bind_arguments(self.def_, stand_ins)
                self._local[key] = local_sizes, self.kernel.ranges.bind(local_sizes)
            except TCPreconditionError as err:
                self._local[key] = f"a block would violate a size precondition ({err})"
            except TCArgumentError as err:
                self._local[key] = f"its blocks do not bind the sizes consistently ({err})"
        if isinstance(self._local[key], str):
            return self._local[key]
        local_sizes, local = self._local[key]
        local_shapes.update(local.shapes)
        needed = {d: self._needed(self.dims[d], block) for d, block in cell.items()
                  if self.dims[d].kind != "reduced"}
        for i, stmt in enumerate(self.stmts):
            shift, keep = {}, {}
            for d, block in cell.items():
                dim = self.dims[d]
                if i not in dim.var:
                    continue
                v = dim.var[i]
                if dim.kind == "reduced":
                    shift[v], keep[v] = block[0], block
                    continue
                lhs_axis = next((stmt.target, p) for p in range(len(stmt.lhs)) if (stmt.target, p) in set(dim.axes))
                shift[v], keep[v] = origin.get(lhs_axis, 0), needed[d].get(lhs_axis, (0, 0))
            problem = self._check_statement(i, shift, keep, origin, local, local_sizes, local_shapes)
            if problem is not None:
                return problem
        return None

    def _check_statement(self, i, shift, keep, origin, local, local_sizes, local_shapes) -> Optional[str]:
        stmt = self.stmts[i]
        whole = self.bound.statements[i]
        part = local.statements[i]
        box = {}
        for v, (lo, hi) in whole.items():
            lo_l, hi_l = part[v][0] + shift.get(v, 0), part[v][1] + shift.get(v, 0)
            if v in keep:
                k0, k1 = keep[v]
                want = (max(lo, k0), min(hi, k1))
                if want[0] >= want[1]:
                    return None  # this cell needs nothing of this statement
                # a reduction block must sum exactly its values; an output block may compute more
                got = (lo_l, hi_l) if v in stmt.reduction_vars else (max(lo_l, k0), min(hi_l, k1))
                if got != want:
                    return f"'{v}' of {stmt.target} ranges over {lo_l}:{hi_l} in a block, which needs {want[0]}:{want[1]}"
                box[v] = want
            elif (lo_l, hi_l) != (lo, hi):
                return f"the range of '{v}' in {stmt.target} depends on its block"
            else:
                box[v] = (lo, hi)
        if any(a >= b for a, b in box.values()):
            return None
        moved = {v for v, s in shift.items() if s}
        if moved & (_value_vars(stmt.rhs)):
            return f"{stmt.target} uses an index as a value ({', '.join(sorted(moved & _value_vars(stmt.rhs)))})"
        for node in _value_nodes(stmt.rhs):
            if (isinstance(node, ast.SizeVar) and local_sizes[node.name] != self.sizes[node.name]
                    or isinstance(node, ast.DimRef)
                    and local_shapes[node.tensor][node.dim] != self.shapes[node.tensor][node.dim]):
                return f"{stmt.target} uses a size as a value ({node})"
        gconv = _SizedConverter(stmt.index_vars, self.sizes, self.shapes)
        lconv = _SizedConverter(stmt.index_vars, local_sizes, local_shapes, shift)
        domain = gconv.box(box)
        for access in _reads(stmt):
            for axis, expr in enumerate(access.indices):
                try:
                    g = gconv.affine(expr)
                    l = lconv.affine(expr).add(lconv.const(origin.get((access.tensor, axis), 0)))
                except NotAffine:
                    if (access.tensor, axis) in origin or moved & _value_vars(expr):
                        return f"{access} is indexed by data or a non-affine expression"
                    continue
                if not g.ne_set(l).intersect(domain).is_empty():
                    return f"{access} reads other elements in a block than in the whole array"
        for cond in _conditions(stmt):
            try:
                g, l = gconv.condition(cond), lconv.condition(cond)
            except NotAffine:
                if moved & _value_vars(cond):
                    return f"the condition {cond} depends on where a block starts"
                continue
            if not g.intersect(domain).is_equal(l.intersect(domain)):
                return f"the condition {cond} depends on where a block starts"
        return None

    # -- the Dask graph

    def plan(self) -> Plan:
        dims = []
        for dim in self.dims:
            if not self.input_axes(dim):
                continue  # no input has it: nothing to chunk
            blocks = len(dim.blocks) or 1
            dims.append(DimensionPlan(dim.name, tuple(self.input_axes(dim)), dim.kind, blocks, dim.halo,
                                      dim.operator, dim.reason))
        return Plan(self.def_.name, tuple(dims), {name: self.output_chunks(name) for name in self.outputs})

    def output_chunks(self, name) -> tuple:
        chunks = []
        for axis, size in enumerate(self.shapes[name]):
            dim = next(d for d in self.dims if (name, axis) in d.axes)
            if dim.blocks and dim.kind != "reduced":
                chunks.append(tuple(b - a for a, b in dim.blocks))
            else:
                chunks.append((size,))
        return tuple(chunks)

    def build(self):
        """The outputs as Dask arrays: one ``blockwise`` when every block reads its own aligned
        chunks, else one task per cell on slices that include the halos."""
        task = _BlockTask.for_kernel(self.kernel, self.options, len(self.cells()), self._partial_def())
        index = self._blockwise_index()
        return self._build_blockwise(task, index) if index is not None else self._build_cells(task)

    def _partial_def(self) -> ast.Def:
        """The def the tasks run: a reduction split across chunks into a half output gives its
        partial results in float32, the type it accumulates in (see ``_partial_dtype``)."""
        if not any(dim.kind == "reduced" for dim in self.dims):
            return self.def_
        (stmt,) = self.def_.stmts
        if self._partial_dtype(stmt.target) is None:
            return self.def_
        wide = accumulator_type(self.types[stmt.target])
        returns = tuple(dataclasses.replace(r, type=dataclasses.replace(r.type, scalar=wide)) if r.type else r
                        for r in self.def_.returns)
        stmts = (dataclasses.replace(stmt, rhs=ast.Cast(wide, stmt.rhs)),)
        return dataclasses.replace(self.def_, returns=returns, stmts=stmts)

    def _partial_dtype(self, name: str) -> Optional[np.dtype]:
        """The dtype of an output's partial results when it is not the output's own (half)."""
        if not any(dim.kind == "reduced" for dim in self.dims):
            return None
        wide = accumulator_type(self.types[name])
        return binding.numpy_dtype(wide) if wide != self.types[name] else None

    def _blockwise_index(self) -> Optional[dict]:
        """Each array's blockwise index (a dimension number per axis), if the plan allows one."""
        if len(self.outputs) != 1:
            return None
        index = {name: tuple(self._dim_of((name, axis)) for axis in range(len(shape)))
                 for name, shape in self.shapes.items() if name in self.args or name in self.outputs}
        for name, dims in index.items():
            if len(set(dims)) != len(dims):
                return None  # one dimension on two axes of an array: blockwise would take a diagonal
        (out,) = self.outputs
        for d, dim in enumerate(self.dims):
            if dim.kind == "halo" or len({self.shapes[t][a] for t, a in self.input_axes(dim)}) > 1:
                return None  # blocks read beyond their chunk, or its inputs differ in extent
            if dim.kind == "blockwise" and any(self.shapes[t][a] != self.shapes[out][index[out].index(d)]
                                               for t, a in self.input_axes(dim)):
                return None  # the output covers part of the input: blocks would not line up
        return index

    def _dim_of(self, axis) -> int:
        return next(d for d, dim in enumerate(self.dims) if axis in dim.axes)

    def _build_blockwise(self, task, index):
        (out,) = self.outputs
        reduced = [d for d, dim in enumerate(self.dims) if dim.kind == "reduced"]
        args, lengths = [], []
        for name, arg in self.args.items():
            if not isinstance(arg, da.Array):
                args += [arg, None]
                continue
            chunks = tuple(tuple(b - a for a, b in self.dims[d].blocks) if self.dims[d].blocks else -1
                           for d in index[name])
            args += [arg.rechunk(chunks), index[name]]
        positions = [n for n, a in enumerate(self.args.values())]
        adjust, new_axes = {d: 1 for d in reduced}, {}
        for axis, d in enumerate(index[out]):
            inputs = [(p, index[name].index(d)) for p, name in zip(positions, self.args)
                      if isinstance(self.args[name], da.Array) and d in index[name]]
            extent = self.shapes[out][axis]
            if self.dims[d].kind == "blockwise":
                lengths.append(inputs[0])  # as long as the aligned input block
            else:
                lengths.append(extent)
                (adjust if inputs else new_axes)[d] = extent
        function = _AlignedBlock(task, tuple(lengths), len(reduced))
        final = binding.numpy_dtype(self.types[out])
        dtype = self._partial_dtype(out) or final
        partials = da.blockwise(function, index[out] + tuple(reduced), *args, dtype=dtype, concatenate=True,
                                token=f"tcpy-{self.def_.name}",
                                adjust_chunks=adjust, new_axes=new_axes,
                                meta=np.empty((0,) * (len(index[out]) + len(reduced)), dtype))
        if not reduced:
            return partials
        axes = tuple(range(len(index[out]), len(index[out]) + len(reduced)))
        return self._combine_axes(partials, axes, dtype).astype(final, copy=False)

    def _build_cells(self, task):
        finals = {name: binding.numpy_dtype(self.types[name]) for name in self.outputs}
        dtypes = {name: self._partial_dtype(name) or finals[name] for name in self.outputs}
        partials: dict = {}  # (output, block position) -> [dask arrays to combine]
        for cell in self.cells():
            slices, origin = self.cell_slices(cell)
            pieces = []
            for name, arg in self.args.items():
                if isinstance(arg, da.Array):
                    piece = arg[slices[name]]
                    piece = piece.rechunk(piece.shape).to_delayed(optimize_graph=False).ravel()[0]
                    pieces.append(piece)
                else:
                    pieces.append(arg)
            trims = {}
            for name in self.outputs:
                index, position = [], []
                for axis, size in enumerate(self.shapes[name]):
                    d = next(d for d, dim in enumerate(self.dims) if (name, axis) in dim.axes)
                    if d in cell and self.dims[d].kind != "reduced":
                        lo, hi = cell[d]
                        start = lo - origin[(name, axis)]
                        index.append(slice(start, start + hi - lo))
                        position.append(self.dims[d].blocks.index(cell[d]))
                    else:
                        index.append(slice(0, size))
                        position.append(0)
                trims[name] = (tuple(index), tuple(position))
            cuts = tuple(trims[n][0] for n in self.outputs)
            task_key = f"tcpy-{self.def_.name}-{dask.base.tokenize(task, cuts, *pieces)}"
            result = dask.delayed(task, pure=True)(cuts, *pieces, dask_key_name=task_key)
            for k, name in enumerate(self.outputs):
                index, position = trims[name]
                shape = tuple(s.stop - s.start for s in index)
                array = da.from_delayed(result[k], shape, dtype=dtypes[name])
                key = (name, position)
                if key in partials and not self._reduced(cell):
                    continue  # an output without this dimension: every block computes it alike
                partials.setdefault(key, []).append(array)
        results = []
        for name in self.outputs:
            positions = sorted(p for n, p in partials if n == name)
            blocks = {}
            for p in positions:
                parts = partials[(name, p)]
                block = parts[0] if len(parts) == 1 else self._combine(parts, dtypes[name])
                blocks[p] = block.astype(finals[name], copy=False)
            results.append(_nest(blocks, len(self.shapes[name])) if self.shapes[name] else blocks[()])
        return results[0] if len(results) == 1 else tuple(results)

    def _reduced(self, cell) -> bool:
        return any(self.dims[d].kind == "reduced" for d in cell)

    def _combine(self, parts, dtype):
        return self._combine_axes(da.stack(parts), 0, dtype)

    def _combine_axes(self, partials, axes, dtype):
        """Partial results combined over ``axes`` with the reduction's operator, in a tree, in ``dtype``."""
        operator = next(dim.operator for dim in self.dims if dim.kind == "reduced")
        how = _COMBINE[operator]
        if how in ("sum", "prod"):
            return getattr(partials, how)(axis=axes, dtype=dtype, split_every=2)
        return getattr(partials, how)(axis=axes, split_every=2)


def _nest(blocks: dict, rank: int):
    """Blocks keyed by grid position as one Dask array."""
    def nested(prefix):
        if len(prefix) == rank:
            return blocks[prefix]
        count = 1 + max(p[len(prefix)] for p in blocks if p[:len(prefix)] == prefix)
        return [nested(prefix + (j,)) for j in range(count)]
    return da.block(nested(()))


# ----------------------------------------------------------------------------- tasks


_KERNELS: dict = {}  # per process: (source, name, options or backend) -> kernel


@dataclass(frozen=True)
class _BlockTask:
    """Runs the def on one cell's pieces; pickles as source text and options, never a library."""

    source: str
    name: str
    backend: str
    options: dict           # Options fields; target None: the machine the task runs on
    concurrency: int        # tasks a machine runs at once without distributed
    host_threads: tuple     # ((host, worker threads on it), ...) of a distributed cluster

    @classmethod
    def for_kernel(cls, kernel, options: Options, cells: int, def_: ast.Def) -> "_BlockTask":
        fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(Options)}
        if fields["target"] == Target.host():
            fields["target"] = None
        fields["tile_sizes"] = tuple(sorted(fields["tile_sizes"].items()))
        pool = dask.config.get("num_workers", None) or os.cpu_count() or 1
        backend = getattr(kernel, "backend", "compiled")
        return cls(str(def_), def_.name, backend, tuple(sorted(fields.items())), min(pool, cells),
                   _cluster_threads())

    def threads(self) -> int:
        """Threads for one kernel run: the machine's cores shared by the tasks running at once."""
        cores = len(os.sched_getaffinity(0))
        try:  # a worker process has imported distributed; importing it elsewhere takes a second
            worker = sys.modules["distributed"].get_worker()
        except (KeyError, ValueError):
            return max(1, cores // self.concurrency)
        from distributed.comm import get_address_host
        running = dict(self.host_threads).get(get_address_host(worker.address), worker.state.nthreads)
        return max(1, cores // running)

    def kernel(self):
        if self.backend == "reference":
            key = (self.source, self.name, self.backend)
            if key not in _KERNELS:
                _KERNELS[key] = define(self.source, self.name, backend="reference")
            return _KERNELS[key]
        fields = dict(self.options)
        fields["tile_sizes"] = dict(fields["tile_sizes"])
        if not fields["num_threads"]:
            fields["num_threads"] = self.threads()
        key = (self.source, self.name, tuple(sorted((k, repr(v)) for k, v in fields.items())))
        kernel = _KERNELS.get(key)
        if kernel is None:
            kernel = _KERNELS[key] = define(self.source, self.name, options=Options(**fields))
        return kernel

    def __call__(self, trims, *pieces):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TCWarning)  # the whole-array call has already warned
            outputs = self.kernel()(*pieces)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        return tuple(np.require(out[index], requirements="C") for out, index in zip(outputs, trims))


@dataclass(frozen=True)
class _AlignedBlock:
    """A blockwise task: the kernel on aligned blocks, its output cut to the block's extent
    (``lengths``: per output axis an extent, or the input (argument, axis) it is as long as),
    with a unit axis per dimension reduced across chunks."""

    task: _BlockTask
    lengths: tuple
    reduced: int

    def __call__(self, *blocks):
        index = tuple(slice(0, blocks[n[0]].shape[n[1]] if isinstance(n, tuple) else n) for n in self.lengths)
        (out,) = self.task((index,), *blocks)
        return out.reshape(out.shape + (1,) * self.reduced)


def _cluster_threads() -> tuple:
    """Worker threads per host of the current distributed client, if there is one."""
    try:  # a client needs distributed imported; importing it to find none takes a second
        workers = sys.modules["distributed"].default_client().scheduler_info()["workers"]
    except (KeyError, ValueError):
        return ()
    counts: dict = {}
    for info in workers.values():
        counts[info["host"]] = counts.get(info["host"], 0) + info["nthreads"]
    return tuple(sorted(counts.items()))
