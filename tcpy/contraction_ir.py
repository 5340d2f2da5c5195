"""The contraction engine's IR: what a recognised contraction computes (:class:`Contraction`,
its roles' :class:`Group` s, :class:`AffineAccess` es and guards) and how it runs
(:class:`Plan`, with its :class:`Path`; a convolution's :class:`WinogradForm`, a weight
gradient's :class:`WinogradTapsForm`).

Frozen values, made by the planner (:mod:`tcpy.transform.contraction`,
:mod:`tcpy.transform.winograd`), stamped on statements by :mod:`tcpy.transform.engines`, and
read by the renderer (:mod:`tcpy.codegen.contraction`), which imports them from here without
importing a planner.
"""
from __future__ import annotations

import enum
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Optional

from .lang.types import ScalarType


class Path(str, enum.Enum):
    """How the engine runs a contraction (:attr:`Plan.path`); compares equal to its name."""

    PACKED = "packed"  # BLIS's loops: both operands packed, the micro-kernel on packed slivers
    SMALL = "small"  # operands read in place (a K block of both fits half of L2)
    STREAM = "stream"  # A read in place, B's K block packed (narrow N)
    DIRECT = "direct"  # M = 1, a short K: each run of outputs sums its taps in registers
    BATCH_LANES = "batch_lanes"  # N = 1: vector lanes over consecutive batch indices
    WINOGRAD = "winograd"  # a 3x3 stride-1 convolution as F(2x2, 3x3) or F(4x4, 3x3)
    # a 3x3 stride-1 convolution's weight gradient (the window's taps are outputs) as F(3x3, 2x2)
    WINOGRAD_TAPS = "winograd_taps"
    # a convolution with the image read in place: output channels in the vector lanes, a run of
    # output pixels along a row in registers (:class:`ConvForm`)
    DIRECT_CONV = "direct_conv"

    __str__ = str.__str__  # (the name in text and f-strings, as a plain string would be)
    __format__ = str.__format__


class Operand(str, enum.Enum):
    """An operand of a contraction: ``a`` or ``b`` (:attr:`Contraction.guarded`,
    :attr:`WinogradForm.image`); compares equal to its letter."""

    A = "a"
    B = "b"

    __str__ = str.__str__
    __format__ = str.__format__


TAPS = 3  # F(2x2, 3x3): a 3-tap window per axis
TILE = 2  # outputs per tile and axis of F(2x2, 3x3) (the default; the weight gradient's)
POINTS = (TILE + TAPS - 1) ** 2  # 16 transformed values (and products) per tile
WINOGRAD_TILES = (2, 4)  # the tile sizes of the winograd path (F(2x2, 3x3), F(4x4, 3x3))
MAX_SLIVERS = 8  # tile slivers per block of the winograd path (its block buffers grow with it)


ROLES = ("batch", "m", "n", "k")
DTYPES = (ScalarType.FLOAT32, ScalarType.FLOAT64)


# ----------------------------------------------------------------------------- data


class cached:
    """A value computed at its first read and kept in the instance's dict, as
    :class:`functools.cached_property`, without its lock (Python 3.11's takes one at each first
    read: a few microseconds, paid by each contraction a new call shape's planning builds)."""

    def __init__(self, func):
        self.func = func
        self.__doc__ = func.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        instance.__dict__[self.name] = value = self.func(instance)
        return value


def direct_init(cls):
    """``cls``, a frozen dataclass, with an ``__init__`` that stores its fields in the
    instance's dict: the one :func:`dataclasses.dataclass` writes for a frozen class calls
    ``object.__setattr__`` once per field, and a size-generic kernel's planner builds some
    fifty such objects at each new call shape (attention: an eighth of its planning time)."""
    params, keywords, body = [], [], ["    d = self.__dict__"]
    namespace = {}
    for f in fields(cls):
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: direct_init takes only fields of __init__")
        if f.default is not MISSING:
            namespace[f"_default_{f.name}"] = f.default
            param = f"{f.name}=_default_{f.name}"
        elif f.default_factory is not MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            param = f"{f.name}=_factory_{f.name}"
            body.append(f"    if {f.name} is _factory_{f.name}: {f.name} = _factory_{f.name}()")
        else:
            param = f.name
        (keywords if f.kw_only else params).append(param)
        body.append(f"    d[{f.name!r}] = {f.name}")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *params, *(["*", *keywords] if keywords else [])])
    exec(f"def __init__({signature}):\n" + "\n".join(body), namespace)
    namespace["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = namespace["__init__"]
    return cls


def frozen_dataclass(cls):
    """``@dataclass(frozen=True)`` with :func:`direct_init`'s ``__init__``: the IR's values."""
    return direct_init(dataclass(frozen=True)(cls))


def _lookup(pairs: tuple[tuple[str, int], ...], var: str) -> int:
    """The value ``var`` has in ``pairs`` (the last, as in a dict of them), else 0: without
    building the dict (planning a call shape asks many times, of a few pairs)."""
    for name, value in reversed(pairs):
        if name == var:
            return value
    return 0


@frozen_dataclass
class AffineAccess:
    """Element ``offset + sum(stride[v] * (v - lo[v]))`` of ``tensor`` (row-major, elements).

    ``offset`` already includes the ranges' lower bounds, so variables count from 0.
    ``dtype`` is the tensor's element type; ``cast`` whether the value is converted to the
    contraction's type when read.
    """

    tensor: str
    dtype: ScalarType
    offset: int
    strides: tuple[tuple[str, int], ...]
    elements: int = 0  # the tensor's element count (0: not known, as for a block's buffer)

    def stride(self, var: str) -> int:
        return _lookup(self.strides, var)

    def describe(self) -> str:
        strides = ", ".join([f"{v}:{s}" for v, s in self.strides if s])
        return f"{self.tensor} (offset {self.offset}; strides {strides or 'none'})"


@frozen_dataclass
class Guard:
    """The inequality ``const + sum(coef[v] * (v - lo[v])) >= 0`` (``const`` includes the
    ranges' lower bounds, so variables count from 0, as in :class:`AffineAccess`)."""

    const: int
    coefs: tuple[tuple[str, int], ...]

    def stride(self, var: str) -> int:  # named like AffineAccess.stride: groups merge on both
        return _lookup(self.coefs, var)

    def describe(self) -> str:
        text = ""
        for v, c in self.coefs:
            term = v if abs(c) == 1 else f"{abs(c)}*{v}"
            text += (" - " if c < 0 else " + ") + term if text else ("-" if c < 0 else "") + term
        if self.const:
            text += f" - {-self.const}" if self.const < 0 else f" + {self.const}"
        return f"{text or 0} >= 0"


@frozen_dataclass
class Group:
    """Index variables of one role merged into one dimension (outermost first): extent is the
    product, and in each tensor the stride is that of the innermost variable; ``g`` holds the
    innermost variable's coefficient in each guard of the contraction."""

    vars: tuple[str, ...]
    extent: int
    a: int  # element stride in operand a (0 if the role does not index it)
    b: int
    c: int
    g: tuple[int, ...] = ()

    def stride(self, which: str) -> int:
        """The stride in ``a``, ``b`` or ``c``, or the coefficient in guard ``g<i>``."""
        return self.g[int(which[1:])] if which.startswith("g") else getattr(self, which)


@frozen_dataclass
class PaddedCopy:
    """A guarded operand whose guards only bound its own indices (``0 <= h + kh - 1 < H``: a
    padded convolution's image) read from a copy of its slice for one batch index with zeros
    around it: where a guard fails the copy holds 0, so ``contraction`` reads it unguarded.

    ``dims`` are the copied dimensions, outer first: (extent, stride in the operand, zeros
    before, zeros after); the slice of batch index ``bi`` starts at ``source_offset`` plus the
    guarded contraction's batch offset of ``bi``."""

    dims: tuple[tuple[int, int, int, int], ...]
    source_offset: int
    contraction: "Contraction"

    @property
    def extents(self) -> list[int]:
        """The copy's extents (each dimension with its zeros)."""
        return [extent + lo + hi for extent, _, lo, hi in self.dims]

    @property
    def pitch(self) -> list[int]:
        """The copy's element strides."""
        return row_major(self.extents)

    @property
    def elements(self) -> int:
        return math.prod(self.extents)


@frozen_dataclass
class Contraction:
    """A recognised contraction ``c (=|+=) alpha * sum_k a * b`` (see the module docstring).

    Roles are tuples of :class:`Group` (empty: that role has size 1). ``alpha`` is the product
    of scalar literals (and -1 per negation); ``alpha_tensors`` the rank-0 tensors multiplying
    it. ``init`` is ``+=!`` (overwrite) as opposed to ``+=`` (accumulate into the target).
    """

    stmt: str
    dtype: ScalarType
    a: AffineAccess
    b: AffineAccess
    c: AffineAccess
    batch: tuple[Group, ...]
    m: tuple[Group, ...]
    n: tuple[Group, ...]
    k: tuple[Group, ...]
    alpha: float
    alpha_tensors: tuple[str, ...]
    init: bool
    guards: tuple[Guard, ...] = ()
    guarded: Operand | str = ""  # a or b: that operand's packing writes zeros where a guard fails ("": none)
    # the guard wraps the guarded operand's read alone, ``(g ? a : 0) * b``: where it fails the
    # term is 0 times the other operand (NaN for inf), not left out as in ``g ? a * b : 0``
    padding_multiplies: bool = False
    padded: Optional[PaddedCopy] = None  # the guarded operand b as a zero-padded copy, when its guards allow
    extents: tuple[tuple[str, int], ...] = ()  # each role variable's extent (empty for a block's contraction)

    def __post_init__(self):
        if self.guarded and not isinstance(self.guarded, Operand):
            object.__setattr__(self, "guarded", Operand(self.guarded))

    def size(self, role: str) -> int:
        return math.prod([g.extent for g in getattr(self, role)])

    @cached
    def sizes(self) -> tuple[int, int, int, int]:
        """(batch, M, N, K) (planning reads them many times)."""
        return tuple([self.size(r) for r in ROLES])

    def linear_stride(self, role: str, which: str) -> Optional[int]:
        """The stride of tensor ``which`` along the role's linear index when its groups compose
        into one (each outer group's stride is the inner one's extent times its stride: a
        convolution's weights along K = c x kh x kw), else None; 0 for an absent role."""
        groups = getattr(self, role)
        if not groups:
            return 0
        for outer, inner in zip(groups, groups[1:]):
            if outer.stride(which) != inner.extent * inner.stride(which):
                return None
        return groups[-1].stride(which)

    def role_vars(self, role: str) -> tuple[str, ...]:
        return self._role_vars[role]

    @cached
    def _role_vars(self) -> dict[str, tuple[str, ...]]:
        # (planning a call shape asks many times)
        return {role: tuple([v for g in getattr(self, role) for v in g.vars]) for role in ROLES}

    def image_operands(self) -> tuple[str, ...]:
        """The operands that may be a convolution's image, in the order to try them: the
        guarded one (a padded read), else b (NCHW), then a (NHWC)."""
        return (self.guarded,) if self.guarded else ("b", "a")

    def image_vars(self, image: str) -> dict[str, "Var"]:
        """Every index variable as a convolution form's :class:`Var`, ``image`` (``"a"`` or
        ``"b"``) the image operand: its extent, its strides in the image, the weights, the
        output and each guard, and its stride in its role's linear index (M or N)."""
        found = self._image_vars.get(image)
        if found is None:  # (the convolution forms each ask, at every call shape of a generic kernel)
            found = self._image_vars[image] = self._vars_with_image(image)
        return found

    @cached
    def _image_vars(self) -> dict[str, dict[str, "Var"]]:
        return {}

    def _vars_with_image(self, image: str) -> dict[str, "Var"]:
        img, wts = getattr(self, image), getattr(self, "b" if image == "a" else "a")
        extents = dict(self.extents)
        line = {}
        for role in ("m", "n"):
            stride = 1
            for v in reversed(self.role_vars(role)):
                line[v] = stride
                stride *= extents[v]
        return {v: Var(v, extent, img.stride(v), wts.stride(v), self.c.stride(v),
                       tuple([g.stride(v) for g in self.guards]), line.get(v, 0)) for v, extent in extents.items()}

    def describe(self) -> str:
        def role(r):
            groups = getattr(self, r)
            if not groups:
                return f"{r.upper() if r != 'batch' else 'batch'} -"
            text = " x ".join(["(" + ",".join(g.vars) + ")" if len(g.vars) > 1 else g.vars[0] for g in groups])
            return f"{r.upper() if r != 'batch' else 'batch'} {text} = {self.size(r)}"
        scale = []
        if self.alpha != 1.0:
            scale.append(repr(self.alpha))
        scale.extend(self.alpha_tensors)
        parts = [", ".join([role(r) for r in ROLES]),
                 f"a = {self.a.describe()}", f"b = {self.b.describe()}", f"c = {self.c.describe()}"]
        if scale:
            parts.append("scaled by " + " * ".join(scale))
        if self.guards:
            other = (self.b if self.guarded == "a" else self.a).tensor
            parts.append(f"guarded read of {getattr(self, self.guarded).tensor}: 0 unless "
                         + " and ".join([g.describe() for g in self.guards])
                         + (f" (there it multiplies {other}, as written)" if self.padding_multiplies
                            else " (there the term adds nothing)"))
        parts.append("overwrites" if self.init else "accumulates into the target")
        return "; ".join(parts)


# ----------------------------------------------------------------------------- recognition


def row_major(extents) -> list[int]:
    """Element strides of a row-major array of these extents."""
    strides = [1] * len(extents)
    for d in range(len(extents) - 2, -1, -1):
        strides[d] = strides[d + 1] * extents[d + 1]
    return strides


@frozen_dataclass
class Plan:
    """How a contraction runs on a Target (see :func:`plan`)."""

    path: Path
    mr: int
    nr: int
    lanes: int
    kc: int
    mc: int
    nc: int
    unroll: int
    grid: tuple[int, int, int, int]  # cells over (batch, M, N, K)
    threads: int
    reasons: tuple[str, ...]
    copy_b: bool = False  # small path: copy every B sliver (not only the partial one)
    a_once: bool = False  # packed path: all of a cell's A packed once, B panels sized for L2
    stream_stores: bool = False  # whole output tiles written once, with non-temporal stores
    # packed path: a whole B sliver is read in place by the first micro-tile of its first A block,
    # which packs it as it goes (B read from memory once, no separate pass over it)
    pack_b_in_kernel: bool = False
    padded_copy: bool = False  # direct path: B read from a zero-padded copy per batch index (PaddedCopy)
    # direct path: whole runs of the inner N group computed `rows` at a time (consecutive values of
    # the next group, sharing B's rows between their taps), in steps of `row_vectors` vectors
    rows: int = 1
    row_vectors: int = 0
    winograd: Optional[WinogradForm] = None  # winograd path: the F(m x m, 3x3) form
    taps: Optional[WinogradTapsForm] = None  # winograd_taps path: the F(3x3, 2x2) form
    conv: Optional[ConvForm] = None  # direct_conv path: the convolution's variables (mr pixels x nr channels)
    # a size-generic kernel's contraction: the tile sizes and micro-tiles (tile, MR, NR vectors)
    # its winograd path is rendered with, one routine each, for the calls the planner runs as
    # F(2x2, 3x3) or F(4x4, 3x3) (``winograd``: the form)
    winograd_tiles: tuple[tuple[int, int, int], ...] = ()
    # a size-generic kernel's second micro-tile (MR, NR) for the small and stream paths, whose
    # kernels read A in place, or for a chain product's block routines: the planner's for an N of
    # whole tiles of it (N = 64, 48-wide tiles), taken by the calls whose N it tiles better
    small_tile: Optional[tuple[int, int]] = None
    # the Target's cache line in bytes: the renderer prefetches B by lines and aligns spilled tiles to one
    cache_line: int = field(kw_only=True)

    def __post_init__(self):
        if not isinstance(self.path, Path):
            object.__setattr__(self, "path", Path(self.path))

    @property
    def nr_vectors(self) -> int:
        return self.nr // self.lanes

    def describe(self) -> str:
        tb, tm, tn, tk = self.grid
        if self.path == "direct":
            text = f"direct path; runs of up to {self.nc} outputs, the {self.kc} taps summed in registers"
            if self.rows > 1:
                text += f"; whole rows {self.rows} at a time in steps of {self.row_vectors} vectors"
        elif self.path == "batch_lanes":
            text = f"batch-lanes path; vectors of {self.lanes} batch indices, the {self.kc} taps summed in registers"
        elif self.path == "direct_conv":
            text = (f"direct-convolution path; {self.conv.describe()}; register tile {self.mr} pixels x "
                    f"{self.nr} output channels ({self.nr_vectors} vectors of {self.lanes})")
        elif self.path == "winograd":
            text = (f"winograd path; {self.winograd.describe()}; micro-tile {self.mr}x{self.nr}; blocks of "
                    f"{self.nc} tiles, kc {self.kc}, mc {self.mc}")
        elif self.path == "winograd_taps":
            text = (f"winograd_taps path; {self.taps.describe()}; micro-tile {self.mr}x{self.nr}; chunks of "
                    f"{self.nc} tiles, kc {self.kc}")
        else:
            text = f"{self.path} path; micro-tile {self.mr}x{self.nr} ({self.nr_vectors} vectors of {self.lanes})"
        if self.path == "packed":
            text += f"; blocks kc {self.kc}, mc {self.mc}, nc {self.nc}"
            if self.a_once:
                text += " (A packed once per cell)"
            if self.pack_b_in_kernel:
                text += "; B packed by the first micro-tile of each sliver"
        if self.stream_stores:
            text += "; non-temporal stores"
        text += f"; thread grid batch {tb} x M {tm} x N {tn} x K {tk}"
        if tk > 1:
            text += " (split K: per-thread partial sums added in a fixed order)"
        return text


@frozen_dataclass
class Var:
    """One index variable: its extent, its strides in the image, the weights and the output,
    its coefficient in each guard, and its stride in its role's linear index (M or N: the
    epilogue's coordinates)."""

    name: str
    extent: int
    image: int
    weights: int
    c: int
    g: tuple[int, ...]
    line: int = 0


@frozen_dataclass
class Axis:
    """An output variable and the window variable added to it in the image (``h + kh``)."""

    out: Var
    tap: Var

    @property
    def tiles(self) -> int:
        return -(-self.out.extent // TILE)

    @property
    def window(self) -> int:
        """Values ``out + tap`` takes: the image positions the axis reads."""
        return self.out.extent + TAPS - 1


@frozen_dataclass
class ImageForm:
    """A convolution's form: which operand is the image (``"a"`` or ``"b"``); the other holds
    the weights."""

    image: Operand

    def __post_init__(self):
        if not isinstance(self.image, Operand):
            object.__setattr__(self, "image", Operand(self.image))

    @property
    def weights(self) -> str:
        return "b" if self.image == "a" else "a"


@frozen_dataclass
class WinogradForm(ImageForm):
    """A contraction as F(tile x tile, 3x3): which operand is the image (``"a"`` or ``"b"``: NHWC
    puts it on a's side), the two window axes, the remaining variables and the tile size (one of
    :data:`WINOGRAD_TILES`)."""

    rows: Axis
    cols: Axis
    m: tuple[Var, ...]  # output channels (the weights' and the output's)
    n: tuple[Var, ...]  # the image's and output's variables besides the axes (images)
    k: tuple[Var, ...]  # the reduction besides the taps (input channels)
    tile: int = TILE  # outputs per tile and axis

    @property
    def M(self) -> int:
        return math.prod([v.extent for v in self.m])

    @property
    def K(self) -> int:
        return math.prod([v.extent for v in self.k])

    @property
    def patch(self) -> int:
        """The input patch's side: tile + taps - 1."""
        return self.tile + TAPS - 1

    @property
    def points(self) -> int:
        """Transformed values (and products) per tile."""
        return self.patch ** 2

    def axis_tiles(self, axis: Axis) -> int:
        """Tiles along ``axis`` (the last one partial when the tile does not divide it)."""
        return -(-axis.out.extent // self.tile)

    @cached
    def tiles(self) -> int:
        """Tiles per batch index (the products' columns; the planner asks many times)."""
        return math.prod([v.extent for v in self.n]) * self.axis_tiles(self.rows) * self.axis_tiles(self.cols)

    def describe(self) -> str:
        return (f"Winograd F({self.tile}x{self.tile}, 3x3) over ({self.rows.out.name} + {self.rows.tap.name}, "
                f"{self.cols.out.name} + {self.cols.tap.name}): {self.points} products of M {self.M} x "
                f"K {self.K} x {self.tiles} tiles")


@frozen_dataclass
class WinogradTapsForm(ImageForm):
    """A contraction as F(3x3, 2x2) (:mod:`tcpy.transform.winograd_taps`): a convolution's weight
    gradient, whose outputs are the window's taps. ``image`` is the image operand; the other
    holds the output gradient (a Var's ``weights`` stride is its stride there). Each axis pairs a
    reduced pixel variable (``out``: ``h``, read by both operands) with an output tap (``tap``:
    ``kh``, the image reads ``h + kh``)."""

    rows: Axis
    cols: Axis
    m: tuple[Var, ...]  # the gradient's channels (the other operand's and the output's)
    n: tuple[Var, ...]  # the image's channels besides the taps (the image's and the output's)
    k: tuple[Var, ...]  # the reduction besides the pixels (images), read by both operands

    @property
    def M(self) -> int:
        return math.prod([v.extent for v in self.m])

    @property
    def N(self) -> int:
        return math.prod([v.extent for v in self.n])

    @property
    def tiles(self) -> int:
        """Tiles over all images: the products' reduction."""
        return math.prod([v.extent for v in self.k]) * self.rows.tiles * self.cols.tiles

    def describe(self) -> str:
        return (f"Winograd F(3x3, 2x2) over ({self.rows.out.name} + {self.rows.tap.name}, "
                f"{self.cols.out.name} + {self.cols.tap.name}), the taps as outputs: {POINTS} products of "
                f"M {self.M} x N {self.N} x {self.tiles} tiles")


@frozen_dataclass
class ConvForm(ImageForm):
    """A contraction as a direct convolution: which operand is the image (``"a"`` or ``"b"``),
    the output pixel variables (``run``: the one a register tile walks along, ``rows``: the
    others, outer first), the output channels (the weights' and the output's) and the taps (the
    reduction: input channels and window)."""

    run: Var
    rows: tuple[Var, ...]
    channels: tuple[Var, ...]
    taps: tuple[Var, ...]

    @property
    def channels_last(self) -> bool:
        """Whether the output channels are one contiguous run in the output (a tile's row of
        channels is stored as it is; otherwise each channel's pixels are gathered from the tile)."""
        return len(self.channels) == 1 and self.channels[0].c == 1

    @property
    def channel_count(self) -> int:
        return math.prod([v.extent for v in self.channels])

    @property
    def row_count(self) -> int:
        return math.prod([v.extent for v in self.rows])

    @property
    def tap_count(self) -> int:
        return math.prod([v.extent for v in self.taps])

    def describe(self) -> str:
        return (f"{self.channel_count} output channels x {self.row_count} rows of {self.run.extent} pixels "
                f"(along {self.run.name}) x {self.tap_count} taps ({', '.join([v.name for v in self.taps])}), "
                f"the image read in place")


# ----------------------------------------------------------------------------- run-time plans


#: The plan buffer of a contraction in a size-generic kernel (int64): these fields, in this
#: order, then the offset tables the ``*_table`` fields point at (their index in the buffer).
#: Sizes and blocks: the linear extents of the roles, the cache blocks and the thread grid.
#: ``swapped``: the operands run exchanged (a call whose output is contiguous along the other
#: one). ``*_base``: each tensor's element offset; ``a_k_unit``, ``b_k_unit``: A's, B's K is
#: one run of unit stride (the rows of an A sliver, the columns of a B sliver load as vectors).
#: ``guarded``: 0, or 1 / 2 when a / b is packed with zeros where a guard fails;
#: ``other_elements``: the elements of the operand beside it (scanned for inf and NaN). Tables: element offsets per linear index of each role
#: in A, B and C; per guard, its value's parts along batch (with its constant), its operand's
#: own role and K (``guard[g] = batch[g][bi] + own[g][i] + k[g][k] >= 0``); per NR-wide block
#: of N (slivers and tiles start at multiples of NR), whether its B columns and its C columns
#: are each one unit-stride run (vector copies and stores: every block of a GEMM, the blocks of
#: a convolution inside one image row). ``b_segments``: per column of N, the columns from it
#: on that are one run of B offsets with a step of 1 or 2 (a window's row, at stride 1 or 2)
#: as ``length * 4 + step``, which a sliver that is no one run copies run by run. ``winograd``: 0 on the packed path, else where the
#: winograd path's section (:data:`RUNTIME_WINOGRAD_FIELDS`) starts: the call runs as
#: Winograd, F(2x2, 3x3) or F(4x4, 3x3) (the sizes and tables above then serve the
#: point-by-point sums alone). ``path``: otherwise,
#: an index in :data:`RUNTIME_PATHS`; the small and stream paths read A in place along
#: ``a_m_stride`` and ``a_k_stride`` (the small path also B, its rows ``b_k_stride`` apart, each
#: sliver copied when ``copy_b``); ``mr``, ``nr``: the micro-tile (the kernel's, or on the small
#: and stream paths its plan's ``small_tile``). ``b_k_stride`` is set on every path (0 when B's
#: rows along K are no one stride apart): a chain's product reads B in place where it is laid
#: out as packed.
RUNTIME_FIELDS = (
    "batch", "m", "n", "k", "kc", "mc", "nc", "grid_batch", "grid_m", "grid_n", "swapped",
    "a_base", "b_base", "c_base", "a_k_unit", "b_k_unit", "guarded", "other_elements", "winograd",
    "path", "a_m_stride", "a_k_stride", "b_k_stride", "copy_b", "mr", "nr",
    "a_batch_table", "a_m_table", "a_k_table", "b_batch_table", "b_n_table", "b_k_table",
    "c_batch_table", "c_m_table", "c_n_table", "g_batch_table", "g_own_table", "g_k_table",
    "b_runs_table", "c_runs_table", "b_segments_table",
)

#: The winograd section of a plan buffer (see :class:`WinogradForm`; its ``*_table`` fields
#: index the whole buffer): the micro-tile (rows, vectors) and the tile size (which of the
#: kernel's routines runs), the batch, M (output channels), K (input channels), the tiles per
#: batch index and per axis, each axis' output extent, window, and strides of its output
#: variable in the image and the output and of its tap in the weights; the blocks (kc, mc and
#: nc: tiles per block); the tensors' element offsets and the image's elements (scanned for
#: inf and NaN); ``guards_k``: 1 when a guard's value depends on K (else an edge tile's
#: patch is tested once for every input channel). Tables: offsets per linear index of the batch, K, the images (the form's
#: ``n``) and M in the tensors each indexes; per guard, its value's parts along the batch (with
#: its constant), K and the images, its coefficients along the two axes' output variables and
#: its least part over K and a tile's input patch (a tile inside it everywhere needs no test).
RUNTIME_WINOGRAD_FIELDS = (
    "mr", "vectors", "tile", "batch", "m", "k", "tiles", "row_tiles", "col_tiles", "row_extent", "col_extent",
    "row_window", "col_window",
    "row_image", "col_image", "row_c", "col_c", "row_weights", "col_weights", "kc", "mc", "nc",
    "image_base", "weights_base", "c_base", "image_elements", "guards_k",
    "image_batch_table", "weights_batch_table", "c_batch_table", "image_k_table", "weights_k_table",
    "image_n_table", "c_n_table", "weights_m_table", "c_m_table",
    "g_batch_table", "g_k_table", "g_n_table", "g_row_table", "g_col_table", "g_k_min_table",
)

#: The paths of the run-time engine, in the plan buffer's ``path`` order: the packed path for
#: every contraction; the small and stream paths (A read in place) when the kernel's operands
#: have the contraction's type.
RUNTIME_PATHS = ("packed", "small", "stream")


def runtime_paths(con: Contraction) -> tuple[str, ...]:
    """The run-time engine's paths that a size-generic kernel holds for ``con`` (its
    contraction at the kernel's nominal sizes): the small and stream paths read operands in
    place, so only when they have the contraction's type."""
    same = con.a.dtype is con.dtype and con.b.dtype is con.dtype
    return RUNTIME_PATHS if same else RUNTIME_PATHS[:1]
