"""Size-generic kernels: one compiled kernel for every shape of a def's signature.

A generic kernel's program is planned at nominal sizes (the first call's: the passes make
their decisions from them), but its loops come from isl domains whose bounds are functions of
the size variables, left as isl parameters, and its strides from shapes in those parameters.
isl's AST build then writes the loop bounds, partial tiles and guards for every size, so no
decision taken at the nominal sizes can drop a loop or a guard another size needs. The kernel
reads the sizes at run time from a *size block*: one int64 buffer after its temporaries, the
def's size variables in order (:func:`size_block`).

What runs generically today: statements that run as loop nests (element-wise statements,
reductions), fused groups of them (legal by a dependence test with the sizes as isl
parameters, :meth:`GenericSizes.access`; their per-iteration buffers sized at run time),
register tiles (whole blocks on the fast path, isl's partial blocks on the plain one; their
operands read in place, not through panel copies), without split reductions
(:func:`tcpy.schedule.choose_schedule` with ``generic``) and snapshots; and the
contractions the engine takes (GEMM, batched GEMM, convolutions as implicit GEMM, attention's
products), on the run-time engine (:mod:`tcpy.codegen.contraction.runtime`): one routine for
every size, whose extents, offset tables, cache blocks and thread grid come per call shape from
a plan buffer after the size block (:mod:`tcpy.transform.runtime_plan`; a 3x3 convolution's
routine also holds the winograd path, :mod:`tcpy.codegen.contraction.runtime_winograd`, which
the call shapes the cost model runs as F(2x2, 3x3) take); and online chains
(attention: its products and softmax over blocks of rows and of columns, whose buffers are sized
from the blocks; rows per block, products' extents and bases per call shape,
:mod:`tcpy.transform.runtime_chains`). :func:`unsupported` says why a planned program is not
generic; such a def gets a kernel specialised for each shape.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional

import islpy as isl
import numpy as np

from .lang import ast
from .loopir import BinOp, Const, IExpr, Program, Var, from_isl
from .ranges import DefRanges
from .ranges.affine import affine_form
from .ranges.isl_helpers import CTX, PARAM, SET, lift_params

#: C name of a size variable inside a generic kernel (TC names never start with ``tcpy_``).
SIZE_PREFIX = "tcpy_size_"


@dataclass(frozen=True)
class GenericSizes:
    """The sizes of a generic program as run-time values.

    ``names``: the def's size variables, in size-block order; ``ranges``: per def statement,
    ``{var: (lo, hi)}`` as isl functions of the sizes (parameters named by :func:`size_c_name`;
    undefined where the range is empty); ``shapes``: every tensor's dimensions as loop-IR
    expressions of the sizes; ``work``: per def statement, its iterations (the product of its
    ranges' extents), which decide at run time whether its parallel loops run in parallel;
    ``extents``: the dimensions of the tensors range inference sized, as isl functions of the
    sizes.
    """

    names: tuple[str, ...]
    ranges: tuple[Mapping[str, tuple[isl.PwAff, isl.PwAff]], ...]
    shapes: Mapping[str, tuple[IExpr, ...]]
    work: tuple[IExpr, ...] = ()
    extents: Mapping[str, tuple[isl.PwAff, ...]] = field(default_factory=dict)
    counts: tuple[str, ...] = ()  # parameters after the sizes (see :meth:`counted`)

    def params(self) -> list[str]:
        """The isl parameters: the sizes' C names, then :attr:`counts`."""
        return [size_c_name(n) for n in self.names] + list(self.counts)

    def context(self) -> isl.Set:
        """The sizes a call may have: every size >= 0."""
        space = isl.Space.create_from_names(CTX, set=[], params=self.params()).params()
        context = isl.Set.universe(space)
        for pos in range(len(self.names) + len(self.counts)):
            context = context.lower_bound_val(PARAM, pos, isl.Val.zero(CTX))
        return context

    def domain(self, name: str, origin: int, vars_: tuple[str, ...], isl_names: Mapping[str, str],
               fixed: Mapping[str, str] = MappingProxyType({})) -> isl.Set:
        """``{ name[vars] : lo(sizes) <= var < hi(sizes) }`` of statement ``origin``'s ranges;
        ``fixed`` variables equal the parameters named there (the loops of a fused group around
        the nest)."""
        space = isl.Space.create_from_names(CTX, set=[isl_names[v] for v in vars_], params=self.params())
        domain = isl.Set.universe(space).intersect_params(self.context())
        ls = isl.LocalSpace.from_space(space)
        for pos, var in enumerate(vars_):
            lo, hi = self.ranges[origin][var]
            x = isl.PwAff.from_aff(isl.Aff.var_on_domain(ls, SET, pos))
            lo, hi = lift_params(lo, len(vars_)), lift_params(hi, len(vars_))
            domain = domain.intersect(lo.le_set(x)).intersect(x.lt_set(hi))
        domain = domain.set_tuple_name(name)
        if fixed:  # (isl aligns the parameters of the two sets)
            equal = " and ".join(f"{isl_names[v]} = {param}" for v, param in fixed.items() if v in isl_names)
            point = f"{name}[{', '.join(isl_names[v] for v in vars_)}]"
            domain = domain.intersect(isl.Set(f"[{', '.join(fixed.values())}] -> {{ {point} : {equal or 'true'} }}"))
        return domain.coalesce()

    def group_context(self, origin: int, shared: tuple[str, ...], params: Mapping[str, str]) -> isl.Set:
        """The sizes and the values of a fused group's loops (over ``shared``, statement
        ``origin``'s ranges, as the parameters ``params`` name them) inside the group."""
        names = {v: f"x{k}" for k, v in enumerate(shared)}
        loops = self.domain("G", origin, shared, names)
        n = loops.dim(PARAM)
        loops = loops.move_dims(PARAM, n, SET, 0, len(shared))
        for k, v in enumerate(shared):
            loops = loops.set_dim_name(PARAM, n + k, params[v])
        return loops.params().coalesce()

    def bounds(self, origin: int, var: str) -> tuple[IExpr, IExpr]:
        """``var``'s range in statement ``origin`` as C expressions of the sizes (an empty one
        from 0 to 0)."""
        build = isl.AstBuild.from_context(self.context())
        return tuple(from_isl(build.expr_from_pw_aff(_zero_elsewhere(pa, at_least=False).gist_params(self.context())))
                     for pa in self.ranges[origin][var])

    def same_range(self, origin: int, other: int, var: str) -> bool:
        """Whether ``var`` has the same range in statements ``origin`` and ``other`` at every size."""
        return all(a.is_equal(b) for a, b in zip(self.ranges[origin][var], self.ranges[other][var]))

    def covers(self, origin: int, vars_: tuple[str, ...], tensor: str) -> bool:
        """Whether statement ``origin``'s ranges of ``vars_`` (a left side of plain variables)
        span every dimension of ``tensor`` at every size."""
        extents = self.extents.get(tensor)
        if extents is None or len(extents) != len(vars_):
            return False
        context = self.context()
        for var, extent in zip(vars_, extents):
            lo, hi = (_zero_elsewhere(pa, at_least=False) for pa in self.ranges[origin][var])
            extent = _zero_elsewhere(extent, at_least=False)
            zero = lo.sub(lo)
            if not (lo.ne_set(zero).intersect(context).is_empty() and extent.gt_set(hi).intersect(context).is_empty()):
                return False
        return True

    def access(self, access: ast.Access, loops: tuple[str, ...], origin: int, label: str) -> Optional[isl.Map]:
        """``{ label[loops] -> T[element] }``: the elements ``access`` touches over statement
        ``origin``'s ranges, with the sizes as parameters (exact at every size); None when an
        index is not quasi-affine in the index variables alone."""
        if any(isinstance(node, (ast.SizeVar, ast.DimRef)) for e in access.indices for node in e.walk()):
            return None
        forms = [affine_form(e, {}, {}) for e in access.indices]
        if any(form is None for form in forms):
            return None
        names = {v: f"x{k}" for k, v in enumerate(loops)}
        relation = isl.Map(f"{{ {label}[{', '.join(names[v] for v in loops)}] -> "
                           f"T[{', '.join(form.isl(names) for form in forms)}] }}")
        return relation.intersect_domain(self.domain(label, origin, loops, names))

    def counted(self, origins: tuple[int, ...], var: str, count: str) -> "GenericSizes":
        """These sizes with ``var`` running from 0 to the parameter ``count`` in the statements
        ``origins`` (an online chain's block of columns: ``count``, a C variable, is its columns)."""
        counted = dataclasses.replace(self, counts=self.counts + (count,))
        space = counted.context().get_space()
        hi = isl.PwAff.var_on_domain(isl.LocalSpace.from_space(space), PARAM, len(self.names) + len(self.counts))
        ranges = tuple({v: (hi.sub(hi), hi) if v == var and origin in origins else
                        tuple(pa.align_params(space) for pa in bounds) for v, bounds in ranges.items()}
                       for origin, ranges in enumerate(self.ranges))
        return dataclasses.replace(counted, ranges=ranges)

    def nonempty(self, origin: int, vars_: tuple[str, ...]) -> IExpr:
        """The condition (on the sizes) that every range of ``vars_`` of statement ``origin`` is
        non-empty."""
        params = isl.Set.universe(self.context().get_space()).intersect(self.context())
        for var in vars_:
            lo, hi = self.ranges[origin][var]
            params = params.intersect(lo.lt_set(hi))
        build = isl.AstBuild.from_context(self.context())
        return from_isl(build.expr_from_set(params.gist_params(self.context()).coalesce()))


def size_c_name(name: str) -> str:
    """The C (and isl parameter) name of size variable ``name`` in a generic kernel."""
    return SIZE_PREFIX + name


def generic_sizes(def_: ast.Def, def_ranges: DefRanges) -> GenericSizes:
    """The run-time form of ``def_``'s ranges and shapes (``def_ranges`` from range inference)."""
    names = tuple(def_ranges.size_vars)
    # isl ids as spaces made from names have them (an isl.Id made in Python is another id)
    space = isl.Space.create_from_names(CTX, set=[], params=[size_c_name(n) for n in names])
    renamed = {n: space.get_dim_id(PARAM, pos) for pos, n in enumerate(names)}

    def rename(pa: isl.PwAff) -> isl.PwAff:
        for pos in range(pa.dim(PARAM)):
            pa = pa.set_dim_id(PARAM, pos, renamed[pa.get_dim_name(PARAM, pos)])
        return pa

    ranges = tuple({var: (rename(vr.lo_isl), rename(vr.hi_isl)) for var, vr in st.ranges.items()}
                   for st in def_ranges.statements)
    context = GenericSizes(names, ranges, {}).context()
    build = isl.AstBuild.from_context(context)

    def expr(pa: isl.PwAff) -> IExpr:
        # undefined (an empty range) reads as 0, as when ranges are bound to sizes
        return from_isl(build.expr_from_pw_aff(_zero_elsewhere(pa).gist_params(context)))

    shapes: dict[str, tuple[IExpr, ...]] = {}
    for param in def_.params:
        shapes[param.name] = tuple(ast_dim(d) for d in param.type.dims)
    for name, dims in def_ranges.shapes_isl.items():
        shapes[name] = tuple(expr(rename(d)) for d in dims)
    work = []
    for statement_ranges in ranges:
        extents = [expr(hi.sub(lo)) for lo, hi in statement_ranges.values()] or [Const(1)]
        product = extents[0]
        for extent in extents[1:]:
            product = BinOp("*", product, extent)
        work.append(product)
    extents = {name: tuple(rename(d) for d in dims) for name, dims in def_ranges.shapes_isl.items()}
    return GenericSizes(names, ranges, shapes, tuple(work), extents)


def ast_dim(dim) -> IExpr:
    """A parameter's declared dimension (a size variable or a number) as a loop-IR expression."""
    return Const(dim.value) if isinstance(dim, ast.IntLit) else Var(size_c_name(dim.name))


def _zero_elsewhere(pa: isl.PwAff, at_least: bool = True) -> isl.PwAff:
    """``pa`` where defined (at least 0 unless not ``at_least``), 0 elsewhere."""
    zero = isl.PwAff.zero_on_domain(isl.LocalSpace.from_space(pa.get_domain_space()))
    if not at_least:
        return pa.union_add(zero.intersect_domain(pa.domain().complement())).coalesce()
    return pa.union_max(zero).coalesce()


def size_block(names: tuple[str, ...], sizes: Mapping[str, int]) -> np.ndarray:
    """The int64 buffer a generic kernel reads its sizes from."""
    return np.array([sizes[n] for n in names] or [0], dtype=np.int64)


def engine_statements(program: Program) -> tuple[int, ...]:
    """The statements of ``program`` the contraction engine runs, in order: in a generic
    kernel, each reads its plan buffer from the buffer after the size block and the plan
    buffers of those before it (:mod:`tcpy.codegen.contraction.runtime`)."""
    return tuple(index for index, statement in enumerate(program.statements) if statement.engine is not None)


def unsupported(program: Program) -> Optional[str]:
    """Why ``program`` (after the passes before lowering) cannot run generically, or None when
    it can."""
    for statement in program.statements:
        if statement.origin < 0:
            return "a statement reads what it writes, through a copy planned at fixed sizes"
    return None
