"""The loop-nest IR: what lowering produces, transform passes rewrite, and codegen renders.

Two levels, both frozen:

* :class:`Program` — the statements to lower, each let-inlined with its concrete ranges, plus
  the concrete shapes and types of every tensor (including copies that passes add). Operand
  copies (:mod:`tcpy.transform.packing`) are Program -> Program passes.
* :class:`KernelIR` — loop nests over those statements. Loop bounds, guards and points are
  structured integer expressions (:class:`Const`, :class:`Var`, :class:`BinOp`, ...), built
  from isl's AST by :func:`from_isl`; codegen turns them into C. Register tiles
  (:mod:`tcpy.transform.register_tile`) are a KernelIR -> KernelIR pass.

:func:`dump` prints a KernelIR as indented text (the golden loop-IR tests use it).
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Union

import islpy as isl

from .lang import ast
from .lang.types import ScalarType

if TYPE_CHECKING:
    from .options import Options
    from .schedule import StmtSchedule
    from .contraction_ir import Contraction, Plan
    from .transform.recognition import Base


class Mode(enum.Enum):
    """What a :class:`Point` does to its statement's target."""

    ASSIGN = "assign"  # T = rhs
    MEMORY = "memory"  # T = T op rhs
    REGISTER = "register"  # acc = acc op rhs (inside an Accumulate)
    INIT = "init"  # T = identity of op
    COMBINE = "combine"  # T = (T op) the statement's partial results, in order


class NestKind(enum.Enum):
    INIT = "init"  # sets a `!` reduction's target to the identity
    COMPUTE = "compute"
    COMBINE = "combine"  # combines the partial results of a split reduction


# ----------------------------------------------------------------------------- index expressions


@dataclass(frozen=True, slots=True)
class Const:
    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, slots=True)
class Var:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class BinOp:
    """``lhs op rhs`` for ``+ - *``, comparisons, ``&& ||``; ``floordiv`` (floor), ``div``
    (exact, or a non-negative dividend: C division is right), ``rem`` (C remainder)."""

    op: str
    lhs: "IExpr"
    rhs: "IExpr"

    def __str__(self) -> str:
        if self.op in ("floordiv", "div", "rem"):
            return f"{self.op}({self.lhs}, {self.rhs})"
        return f"({self.lhs} {self.op} {self.rhs})"


@dataclass(frozen=True, slots=True)
class Neg:
    operand: "IExpr"

    def __str__(self) -> str:
        return f"(-{self.operand})"


@dataclass(frozen=True, slots=True)
class Call:
    """``min``/``max`` of its arguments."""

    fn: str
    args: tuple["IExpr", ...]

    def __str__(self) -> str:
        return f"{self.fn}({', '.join(map(str, self.args))})"


@dataclass(frozen=True, slots=True)
class Select:
    cond: "IExpr"
    then: "IExpr"
    other: "IExpr"

    def __str__(self) -> str:
        return f"({self.cond} ? {self.then} : {self.other})"


IExpr = Union[Const, Var, BinOp, Neg, Call, Select]

_OP = isl.ast_expr_op_type
_ISL_BINARY = {
    _OP.add: "+", _OP.sub: "-", _OP.mul: "*", _OP.le: "<=", _OP.lt: "<", _OP.ge: ">=",
    _OP.gt: ">", _OP.eq: "==", _OP.and_: "&&", _OP.and_then: "&&", _OP.or_: "||", _OP.or_else: "||",
    _OP.fdiv_q: "floordiv", _OP.pdiv_q: "div", _OP.div: "div", _OP.pdiv_r: "rem", _OP.zdiv_r: "rem",
}


def from_isl(expr: isl.AstExpr) -> IExpr:
    """The structured form of an isl AST expression."""
    kind = expr.get_type()
    if kind == isl.ast_expr_type.int:
        return Const(int(expr.get_val().to_python()))
    if kind == isl.ast_expr_type.id:
        return Var(expr.get_id().get_name())
    op = expr.get_op_type()
    args = tuple(from_isl(expr.get_op_arg(i)) for i in range(expr.get_op_n_arg()))
    if op in _ISL_BINARY:
        return BinOp(_ISL_BINARY[op], args[0], args[1])
    if op == _OP.minus:
        return Neg(args[0])
    if op in (_OP.min, _OP.max):
        return Call("min" if op == _OP.min else "max", args)
    if op in (_OP.select, _OP.cond):
        return Select(*args)
    raise NotImplementedError(f"isl AST operation {op} in loop bounds")


def substitute(expr: IExpr, values: Mapping[str, IExpr]) -> IExpr:
    """``expr`` with the variables named in ``values`` replaced."""
    if isinstance(expr, Var):
        return values.get(expr.name, expr)
    if isinstance(expr, Const):
        return expr
    if isinstance(expr, BinOp):
        return BinOp(expr.op, substitute(expr.lhs, values), substitute(expr.rhs, values))
    if isinstance(expr, Neg):
        return Neg(substitute(expr.operand, values))
    if isinstance(expr, Call):
        return Call(expr.fn, tuple(substitute(a, values) for a in expr.args))
    return Select(substitute(expr.cond, values), substitute(expr.then, values), substitute(expr.other, values))


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class Panel:
    """A register tile's fast path reads ``tensor`` from ``copy``, laid out in panels of
    ``cols`` columns: ``copy(nb, q..., c) = tensor(q..., cols * nb + c)``."""

    tensor: str
    copy: str
    cols: int


@dataclass(frozen=True)
class Engine:
    """The contraction engine runs a statement: what it computes and how (path, micro-tile,
    cache blocks, thread grid), decided once by :mod:`tcpy.transform.engines`."""

    contraction: "Contraction"
    plan: "Plan"


@dataclass(frozen=True)
class Loops:
    """A loop nest runs a statement: the schedule of its compute nest and, for a reduction
    over reduction variables, of the nests over its outputs (the identity's, and a split
    reduction's combine), decided once by :mod:`tcpy.transform.engines`."""

    compute: "StmtSchedule"
    outputs: Optional["StmtSchedule"] = None


@dataclass(frozen=True)
class Statement:
    """One statement to lower: let-inlined, with its concrete ranges ``{var: (lo, hi)}``.

    ``origin`` is its index in the def's statements, -1 for a copy a pass added. ``engine``:
    the contraction engine runs it; ``loops``: else, the schedules of its loop nests; both
    stamped by :func:`tcpy.transform.engines.decide_engines` (and again by a pass that
    rewrites the statement).
    """

    stmt: ast.Stmt
    ranges: Mapping[str, tuple[int, int]]
    origin: int
    panel: Optional[Panel] = None
    engine: Optional[Engine] = None
    loops: Optional[Loops] = None
    # the scaling of a product's result (split from it by decide_engines): the product's
    # reduction variables, at statement ``origin``; where one of their ranges is empty the sum
    # has no terms and is 0, not 0 times the scale (NaN for a divisor 0): a size-generic
    # kernel's scaling does not run there (a specialised kernel runs no empty sum on the engine)
    scales_sum_over: tuple[str, ...] = ()

    def extents(self) -> dict[str, int]:
        return {v: max(0, hi - lo) for v, (lo, hi) in self.ranges.items() if v in self.stmt.index_vars}


@dataclass(frozen=True)
class FusedGroup:
    """Consecutive statements run under shared outer loops over the variables ``shared`` (see
    :mod:`tcpy.transform.fusion`). ``locals`` pairs each temporary the group shrank with the
    per-iteration buffer that replaced it; ``zeroed`` names the buffers that start at zero each
    iteration (their first writer does not write every element, and unwritten elements read 0)."""

    statements: tuple[int, ...]
    shared: tuple[str, ...]
    locals: tuple[tuple[str, str], ...] = ()
    zeroed: tuple[str, ...] = ()
    chain: Optional["Chain"] = None
    parallel: bool = False  # the shared loops run in parallel (stamped by tcpy.transform.chains)

    @property
    def products(self) -> tuple[int, ...]:
        """A chain's products (those before its rows, then those after), in statement order."""
        if self.chain is None:
            return ()
        return self.statements[:self.chain.heads] + self.statements[len(self.statements) - self.chain.tails:]

    @property
    def rows(self) -> tuple[int, ...]:
        """The statements that run row by row (a chain's: those between its products)."""
        if self.chain is None:
            return self.statements
        return self.statements[self.chain.heads:len(self.statements) - self.chain.tails]


@dataclass(frozen=True)
class Chain:
    """A fused group that starts and ends with a contraction (scores, softmax, times V; or two
    products back to back), legal by :mod:`tcpy.transform.fusion`: the last shared variable
    ``block_var`` runs in blocks of rows; the first and last statements run on a block of rows
    through the contraction engine's micro-kernel, the ones between (if any) row by row.
    ``blocked`` pairs each temporary the products share with the rows in between with its
    per-thread block buffer and the elements of one of its whole rows; ``deferred`` and
    ``online`` are the forms the rows allow; ``reasons`` say why. How it runs (rows per block,
    online or not, parallel loops, packed operands) is its ``plan``.

    The group's first ``heads`` statements are products writing rows (attention's backward:
    the scores and the cotangent of the probabilities, both from a block of query rows), its
    last ``tails`` products reading them. A tail whose reduction runs over ``block_var``
    (``dV(s, d) +=! P(l, s) * dO(l, d)`` blocked on ``l``) is in ``accumulating``: each block
    adds its terms to the whole output, so a batch's blocks run one after the other, in one
    thread, and rows per block divide the range of ``block_var``."""

    block_var: str
    blocked: tuple[tuple[str, str, int], ...]  # (tensor, block buffer, elements of a whole row)
    reasons: tuple[str, ...] = ()
    deferred: Optional["Deferral"] = None
    online: Optional["Online"] = None
    plan: Optional["ChainPlan"] = None  # how it runs: stamped by tcpy.transform.chains
    heads: int = 1
    tails: int = 1
    accumulating: tuple[int, ...] = ()  # tails summing over block_var (statement indices)


class Prepack(enum.Enum):
    """Where a chain's products find their b operand (see :class:`ChainPlan`)."""

    NONE = "none"  # each block's cell packs (or reads) b itself
    PER_THREAD = "per thread"  # packed once per batch by each thread, into its own buffer
    SHARED = "shared"  # packed once per batch by one thread for all (fewer batches than threads)


@dataclass(frozen=True)
class ChainProduct:
    """One of a chain's products on a block of rows (and of columns): ``contraction`` is the
    block's (:func:`tcpy.transform.recognition.block_contraction`), planned for one thread;
    its operands a, b, c start at ``bases``; ``prepacked`` names the buffer holding its b
    packed once per batch (None: the plan packs or reads b itself); ``cleared``: its output
    sums the blocks of rows (they are its reduction), set to zero before a batch's first
    block."""

    stmt: int
    contraction: "Contraction"
    plan: "Plan"
    bases: tuple["Base", ...]
    prepacked: Optional[str] = None
    cleared: bool = False


@dataclass(frozen=True)
class ChainPlan:
    """How a :class:`Chain` runs, decided once by :mod:`tcpy.transform.chains`: blocks of
    ``rows`` rows, and with ``columns`` > 0 its :class:`Online` form on blocks of that many
    columns (``block_loops``: the loops of its maximum, exponential and total statements on one
    block of columns, ``last_block_loops`` on the shorter last one when ``columns`` does not
    divide the range); ``blocked`` is the chain's with the elements of a row in a block. The
    loop over the batches and blocks of rows has ``chunks`` iterations to share (when its group
    is parallel); ``prepack`` says where its products' b is packed, into the ``packed`` buffers
    (name, elements, type; an online chain's hold every block of columns', ``panels`` elements
    a block, per buffer). ``products`` are its products on a block (those before the rows,
    then those after), ``last_products`` an
    online chain's on its shorter last block of columns, ``whole_products`` on one whole row,
    for the rows computed again as the statements say, in the ``whole`` buffers (tensor,
    buffer, row elements). ``reasons`` say why."""

    rows: int
    columns: int
    blocked: tuple[tuple[str, str, int], ...]
    chunks: int
    prepack: Prepack
    products: tuple[ChainProduct, ...]
    last_products: Optional[tuple[ChainProduct, ChainProduct]] = None
    whole_products: Optional[tuple[ChainProduct, ChainProduct]] = None
    whole: tuple[tuple[str, str, int], ...] = ()
    packed: tuple[tuple[str, int, ScalarType], ...] = ()
    panels: tuple[int, ...] = ()
    block_loops: tuple["Loops", ...] = ()
    last_block_loops: tuple["Loops", ...] = ()
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Online:
    """The online-softmax form of a chain (flash attention), for rows that do not fit in
    cache: the column variable ``column_var`` (the first product's output columns, the last
    product's reduction) can run in blocks too. Per block of columns, the ``maximum``
    statement (``M(r) max=! S(r, c)``) gives the block's maximum, folded into a running one;
    the ``exponential`` statement (``E(r, c) = exp(f(S(r, c) - M(r)))``) uses the running
    maximum; the ``total`` statement (``Z(r) +=! E(r, c)``) gives the block's sum. When the
    maximum grows from ``m`` to ``m'``, what was summed so far (the running sum and the last
    product's partial rows) is multiplied by ``exp(f(m - m'))``, the exponential statement's
    own expression. The deferred quotient divides the rows at the end. Rows where that could
    differ from the statements by more than rounding (a maximum or sum not finite, a sum below
    1, a result not finite) are computed again whole, as the statements say."""

    column_var: str
    maximum: int
    exponential: int
    total: int


@dataclass(frozen=True)
class Deferral:
    """A quotient ``X = Y / Z`` (one ``Z`` per row) that only a chain's last product reads,
    moved past it (the rescaling of flash attention): the product reads ``Y``'s block and its
    output rows are divided by ``Z``, so ``statement`` (X's) never runs and the division is
    done once per output element instead of once per element of ``X``'s rows. Rows whose
    ``Z`` is below 1 in magnitude or not finite (where ``Y / Z`` itself could overflow), or
    whose divided output is not finite (the sum overflowed before the division), get ``X``
    itself (``Y`` divided in place) and their product again: the results differ from the
    statement's only by rounding."""

    statement: int
    quotient: str
    numerator: str
    divisor: str


@dataclass(frozen=True)
class Epilogue:
    """Element-wise statements that consume the output of the engine contraction ``producer``
    and run in its store (see :mod:`tcpy.transform.epilogue`): each entry is a statement index
    and its variables paired with the producer's (``(("i", "m"), ("j", "n"))``)."""

    producer: int
    statements: tuple[tuple[int, tuple[tuple[str, str], ...]], ...]

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(index for index, _ in self.statements)


@dataclass(frozen=True)
class Program:
    """Statements with concrete shapes, types and sizes, before loops exist.

    ``groups``: fused statement groups; ``shrunk``: the def's temporaries that no longer exist
    at full size (a fused group's per-iteration buffers replaced them); ``epilogues``: the
    statements that run in a contraction's store; ``generic``: set when the sizes are nominal
    and the kernel takes its sizes at run time (:mod:`tcpy.generic`).
    """

    def_: ast.Def
    statements: tuple[Statement, ...]
    shapes: Mapping[str, tuple[int, ...]]
    types: Mapping[str, ScalarType]
    sizes: Mapping[str, int]
    groups: tuple[FusedGroup, ...] = ()
    shrunk: tuple[str, ...] = ()
    epilogues: tuple[Epilogue, ...] = ()
    generic: Optional[object] = None  # a tcpy.generic.GenericSizes (which reads this module)

    def __post_init__(self):
        for name in ("shapes", "types", "sizes"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def copies(self) -> tuple[str, ...]:
        """Temporaries that passes added (passed to the kernel after the def's own)."""
        return tuple(s.stmt.target for s in self.statements if s.origin < 0)


# ----------------------------------------------------------------------------- loop nests


class _Leaf:
    """A node with no nodes inside it."""

    __slots__ = ()

    def children(self) -> tuple[tuple["Node", ...], ...]:
        """The sequences of nodes inside this node, in order (see :func:`map_nodes`)."""
        return ()

    def with_children(self, children: tuple[tuple["Node", ...], ...]) -> "Node":
        """This node with ``children`` (shaped as :meth:`children` gives them) inside it."""
        return self


class _HasBody:
    """A node whose only nodes are its ``body``."""

    __slots__ = ()

    def children(self) -> tuple[tuple["Node", ...], ...]:
        """The sequences of nodes inside this node, in order (see :func:`map_nodes`)."""
        return (self.body,)

    def with_children(self, children: tuple[tuple["Node", ...], ...]) -> "Node":
        """This node with ``children`` (shaped as :meth:`children` gives them) inside it."""
        (body,) = children
        return dataclasses.replace(self, body=body)


@dataclass(frozen=True, slots=True)
class Loop(_HasBody):
    """``for (var = lo; cond; var += step)``; ``parallel`` is the OpenMP collapse depth (0: none),
    ``chunks`` the iterations of the collapsed loops (no more threads than that are started)."""

    var: str
    lo: IExpr
    cond: IExpr
    step: int
    body: tuple["Node", ...]
    parallel: int = 0
    chunks: int = 0
    simd: bool = False
    simd_reduction: Optional[str] = None  # accumulator combined by an omp simd reduction clause
    unroll: int = 0


@dataclass(frozen=True, slots=True)
class Guard:
    """``if (cond) then else other`` from isl (rare for rectangular domains)."""

    cond: IExpr
    then: tuple["Node", ...]
    other: tuple["Node", ...] = ()

    def children(self) -> tuple[tuple["Node", ...], ...]:
        """The sequences of nodes inside this node, in order (see :func:`map_nodes`)."""
        return (self.then, self.other)

    def with_children(self, children: tuple[tuple["Node", ...], ...]) -> "Guard":
        """This node with ``children`` (shaped as :meth:`children` gives them) inside it."""
        then, other = children
        return Guard(self.cond, then, other)


Point_ = tuple[tuple[str, IExpr], ...]  # index variable -> its value at a point


@dataclass(frozen=True, slots=True)
class Block(_HasBody):
    """``body`` with per-iteration buffers declared before it: (tensor, shape, type, zeroed),
    and ``views``: (tensor, block buffer, element offset) names for a row of a block buffer."""

    buffers: tuple[tuple[str, tuple[int, ...], ScalarType, bool], ...]
    body: tuple["Node", ...]
    views: tuple[tuple[str, str, "IExpr"], ...] = ()


@dataclass(frozen=True, slots=True)
class Point(_Leaf):
    """One instance of statement ``stmt`` at ``point``; with ``residues`` ((variable, stride,
    residue) ...), of its piece where those hold (:func:`tcpy.transform.phases.phase_piece`)."""

    stmt: int
    point: Point_
    mode: Mode
    residues: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Accumulate(_HasBody):
    """A register accumulator around the reduction loops of a statement.

    Starts at the identity, runs ``body``, then stores into the target at the output point
    (``T = acc`` for ``!`` reductions, ``T = T op acc`` otherwise), or, for a split reduction,
    into element ``part`` of the statement's partials (:class:`Scratch`).
    """

    stmt: int
    point: Point_  # output variables only
    body: tuple["Node", ...]
    part: Optional[IExpr] = None


@dataclass(frozen=True)
class Scratch:
    """A buffer the kernel needs beyond the def's tensors: the partial results of statement
    ``stmt``'s split reduction, ``shape = (parts,) + target shape``, in the accumulator type."""

    name: str
    shape: tuple[int, ...]
    type: ScalarType
    stmt: int


# Variables a register tile binds for the code inside it: the block's first row and column,
# and the row and column within the block.
TILE_ROW0, TILE_COL0, TILE_ROW, TILE_COL = "tcpy_row0", "tcpy_col0", "tcpy_r", "tcpy_c"
# Variables a fused chain's loops bind: the first row of the block and its number of rows, and
# in the online form the first column of a block of columns.
BLOCK_START, BLOCK_ROWS, KEY_START = "tcpy_blk", "tcpy_rows", "tcpy_key"
# ... and in a size-generic kernel's online chain, the columns of the block of columns.
KEY_COLUMNS = "tcpy_key_cols"
# ... and the elements between the rows of its block buffers (the call's: a short key row, a
# short pitch and more rows per block).
ROW_PITCH = "tcpy_pitch"
# Index variables of a panel copy (block, lane within it). Names that passes generate for tensors
# and index variables contain a ".", which no TC identifier does, so they never meet the user's.
PANEL_BLOCK, PANEL_LANE = "panel.nb", "panel.cc"


@dataclass(frozen=True, slots=True)
class RegisterTile:
    """A ``rows x cols`` block of the target kept in registers across the reduction loops.

    ``fast`` runs when the block is whole (``full``): it loads the block, runs the reduction
    loops whose innermost body is a :class:`TileUpdate`, and stores the block back. ``slow``
    is the plain loop nest for partial blocks at the edges. Inside, ``row_var`` is
    ``TILE_ROW0 + TILE_ROW`` and ``col_var`` is ``TILE_COL0 + TILE_COL``.
    """

    stmt: int
    row_var: str
    rows: int
    row_start: IExpr
    col_var: str
    cols: int
    col_start: IExpr
    full: IExpr
    point: Point_  # the other output variables
    fast: tuple["Node", ...]
    slow: tuple["Node", ...]

    def children(self) -> tuple[tuple["Node", ...], ...]:
        """The sequences of nodes inside this node, in order (see :func:`map_nodes`)."""
        return (self.fast, self.slow)

    def with_children(self, children: tuple[tuple["Node", ...], ...]) -> "RegisterTile":
        """This node with ``children`` (shaped as :meth:`children` gives them) inside it."""
        fast, slow = children
        return dataclasses.replace(self, fast=fast, slow=slow)


@dataclass(frozen=True, slots=True)
class TileUpdate(_Leaf):
    """``tile[r][c] = tile[r][c] op rhs`` over the whole register tile, at ``point`` (all
    variables but the tile's row and column). ``rhs`` is the statement's value, reading a
    panel copy where the tile has one; ``lets`` binds the variables it adds."""

    stmt: int
    point: Point_
    rhs: ast.Expr
    lets: Point_ = ()


@dataclass(frozen=True)
class ContractionNest(_Leaf):
    """A statement the contraction engine runs (:mod:`tcpy.contraction_ir`): its roles
    and affine accesses, and the plan (path, micro-tile, cache blocks, thread grid)."""

    stmt: int
    contraction: "Contraction"
    plan: "Plan"
    epilogue: Optional[Epilogue] = None

    def describe(self) -> str:
        text = f"contraction engine: {self.contraction.describe()}; {self.plan.describe()}"
        if self.epilogue is not None:
            text += f"; epilogue S{', S'.join(str(i) for i in self.epilogue.members)} in the store"
        return text


@dataclass(frozen=True)
class BlockProduct:
    """A contraction on one block of rows (:func:`tcpy.transform.recognition.block_contraction`):
    operands ``a``, ``b``, ``c`` start at ``bases`` (tensor, element offset in the loops'
    variables); ``rows`` is the block's row count; ``prepacked`` names the buffer holding b
    packed once per batch (None: the plan packs or reads b itself); ``cleared``: its output
    sums the blocks of rows, set to zero before a batch's first block."""

    stmt: int
    contraction: "Contraction"
    plan: "Plan"
    bases: tuple[tuple[str, "IExpr"], ...]
    rows: "IExpr"
    prepacked: Optional[str] = None
    cleared: bool = False

    def describe(self) -> str:
        return f"S{self.stmt} on a block of rows: {self.contraction.describe()}; {self.plan.describe()}"


@dataclass(frozen=True)
class BlockChain:
    """The loops of a fused :class:`Chain`: ``loops`` (variable, lo, hi) over the shared
    variables, the last one stepping by ``rows`` (parallel over all, ``chunks`` iterations);
    per-thread ``buffers`` (name, elements, type); per block: the ``heads`` products, then
    ``body`` for each row (``row_var`` from the block's first row), then the ``tails``
    (``head`` and ``tail``: the first and the last product, a deferred quotient's and an
    online chain's, which have one each). With a product that sums the blocks of rows
    (``cleared``), only the loops before the last run in parallel. Prepacked operands are packed
    again when the loops before the last change: by each thread into its own buffer, or, with
    ``shared`` buffers (fewer batches than threads), once by one thread for all, the batch loops
    then running in every thread and only the blocks of a batch split between threads."""

    loops: tuple[tuple[str, int, int], ...]
    rows: int
    row_var: str
    buffers: tuple[tuple[str, int, ScalarType], ...]
    shared: tuple[tuple[str, int, ScalarType], ...]
    heads: tuple[BlockProduct, ...]
    body: tuple["Node", ...]
    tails: tuple[BlockProduct, ...]
    parallel: bool
    chunks: int
    # a Deferral's (numerator's block buffer, its row elements, divisor's block buffer): the
    # tail reads the numerator and its output rows are divided by the divisor
    deferred: Optional[tuple[str, int, str]] = None
    online: Optional["KeyBlocks"] = None
    prepack: Prepack = Prepack.NONE  # where the products' b is packed (the plan's)

    @property
    def head(self) -> BlockProduct:
        return self.heads[0]

    @property
    def tail(self) -> BlockProduct:
        return self.tails[-1]

    @property
    def accumulates(self) -> bool:
        """Whether a product sums the blocks of rows (they then run in order, per batch)."""
        return any(p.cleared for p in self.heads + self.tails)

    def children(self) -> tuple[tuple["Node", ...], ...]:
        """The sequences of nodes inside this node, in order (see :func:`map_nodes`): the rows'
        body, then an online chain's (:meth:`KeyBlocks.bodies`)."""
        return (self.body,) + (self.online.bodies() if self.online is not None else ())

    def with_children(self, children: tuple[tuple["Node", ...], ...]) -> "BlockChain":
        """This node with ``children`` (shaped as :meth:`children` gives them) inside it."""
        online = self.online.with_bodies(children[1:]) if self.online is not None else None
        return dataclasses.replace(self, body=children[0], online=online)


@dataclass(frozen=True)
class KeyBlocks:
    """The loops of an :class:`Online` chain inside each block of rows: ``var`` runs over the
    column range ``lo..hi`` in steps of ``columns``; the :class:`BlockChain`'s head, body and
    tail are those of a whole block of columns, ``last`` the (head, body, tail) of a shorter
    last one (None when the columns divide the range). The running maximum, sum and
    rescaling factor of each row live in the per-thread buffers ``running``. ``whole`` is
    the chain as the statements say it, on one row (head, body, tail, its buffers (numerator,
    its row elements, divisor)), for the rows the online form cannot give exactly (``redo``).
    Products with b packed once per batch pack it for every block of columns, one after the
    other, ``panels`` elements apart."""

    var: str
    lo: int
    hi: int
    columns: int
    last: Optional[tuple["BlockProduct", tuple["Node", ...], "BlockProduct"]]
    running: tuple[str, str, str]  # (maximum, sum, factor) buffers
    redo: str  # a flag per row: computed again whole
    whole: tuple["BlockProduct", tuple["Node", ...], "BlockProduct", tuple[str, int, str]]
    panels: tuple[int, ...] = ()  # elements of one block's packed b, per prepacked product

    def bodies(self) -> tuple[tuple["Node", ...], ...]:
        """The rows' bodies of the shorter last block of columns (if any) and of ``whole``."""
        return ((self.last[1],) if self.last is not None else ()) + (self.whole[1],)

    def with_bodies(self, bodies: tuple[tuple["Node", ...], ...]) -> "KeyBlocks":
        """These key blocks with ``bodies`` (shaped as :meth:`bodies` gives them)."""
        last = None
        if self.last is not None:
            head, _, tail = self.last
            last, bodies = (head, bodies[0], tail), bodies[1:]
        (whole_body,) = bodies
        head, _, tail, buffers = self.whole
        return dataclasses.replace(self, last=last, whole=(head, whole_body, tail, buffers))


class OnlineKind(str, enum.Enum):
    """What an :class:`OnlineStep` folds; compares equal to its name."""

    MAX = "max"
    SUM = "sum"

    __str__ = str.__str__
    __format__ = str.__format__


@dataclass(frozen=True, slots=True)
class OnlineStep(_Leaf):
    """Inside a row of an :class:`Online` chain's block of columns: ``kind`` "max" folds the
    block's maximum (in ``local``) into the running one (``running``), leaves the new maximum
    in ``local`` and the factor ``rescale`` (the exponential statement ``stmt``'s expression of
    the old maximum, ``OLD_MAXIMUM``, at ``point``) in ``factor``; "sum" folds the block's sum
    (``local``) into the running sum, times the factor. ``row`` is the row's index in the block."""

    kind: OnlineKind
    stmt: int
    point: Point_
    row: "IExpr"
    local: str
    running: str
    factor: str
    rescale: Optional[ast.Expr] = None


OLD_MAXIMUM = "online.old"  # the running maximum before a block, in OnlineStep.rescale


Node = Union[Loop, Guard, Block, Point, Accumulate, RegisterTile, TileUpdate, ContractionNest, BlockChain,
             OnlineStep]


@dataclass(frozen=True, slots=True)
class Nest:
    stmt: int
    kind: NestKind
    body: tuple[Node, ...]
    schedule: Optional["StmtSchedule"] = None
    group: Optional[FusedGroup] = None  # the statements fused in this nest, if any


@dataclass(frozen=True)
class KernelIR:
    """Everything codegen needs: the program and its loop nests, and the options."""

    program: Program
    nests: tuple[Nest, ...]
    options: "Options"
    scratch: tuple[Scratch, ...] = ()

    @property
    def stmts(self) -> tuple[ast.Stmt, ...]:
        return tuple(s.stmt for s in self.program.statements)

    @property
    def origins(self) -> tuple[int, ...]:
        return tuple(s.origin for s in self.program.statements)


def map_nodes(nodes: tuple[Node, ...], fn: Callable[[Node], Optional[Node]]) -> tuple[Node, ...]:
    """Rebuild ``nodes`` top-down: ``fn(node)`` returns a replacement, or None to keep the node
    and recurse into its children (every node type says which it has: ``children()``)."""
    out = []
    for node in nodes:
        new = fn(node)
        if new is None:
            children = node.children()
            new = node.with_children(tuple(map_nodes(c, fn) for c in children)) if children else node
        out.append(new)
    return tuple(out)


def first_point(node: Node) -> Point:
    """The first :class:`Point` below ``node`` (its values name the loops around it)."""
    if isinstance(node, Point):
        return node
    if isinstance(node, RegisterTile):
        return first_point(node.slow[0])
    body = node.then if isinstance(node, Guard) else node.body
    return first_point(body[0])


# ----------------------------------------------------------------------------- dump


def dump(ir: KernelIR) -> str:
    """Indented text of every nest, for reading and golden tests."""
    lines: list[str] = []
    prog = ir.program
    lines.append(f"kernel {prog.def_.name} sizes {dict(sorted(prog.sizes.items()))}")
    for name in prog.copies:
        lines.append(f"copy {name}{list(prog.shapes[name])} {prog.types[name].numpy_name}")
    for scratch in ir.scratch:
        lines.append(f"scratch {scratch.name}{list(scratch.shape)} {scratch.type.numpy_name}")
    for nest in ir.nests:
        stmt = prog.statements[nest.stmt].stmt
        if nest.group is not None:
            lines.append(f"fused {describe_group(prog, nest.group)}")
        else:
            lines.append(f"{nest.kind.value} S{nest.stmt}: {stmt}")
        if nest.schedule is not None and nest.kind is NestKind.COMPUTE:
            lines.append(f"  schedule: {nest.schedule.describe()}")
        _dump_nodes(nest.body, 1, lines)
    return "\n".join(lines) + "\n"


def dump_program(program: Program) -> str:
    """Indented text of a program between passes (before loops exist): each statement with how
    it runs, then the fused groups and epilogues."""
    lines = [f"program {program.def_.name} sizes {dict(sorted(program.sizes.items()))}"]
    for index, statement in enumerate(program.statements):
        origin = "copy" if statement.origin < 0 else f"statement {statement.origin}"
        lines.append(f"S{index} ({origin}): {statement.stmt}")
        if statement.engine is not None:
            lines.append(f"  engine: {statement.engine.contraction.describe()}; {statement.engine.plan.describe()}")
        if statement.loops is not None:
            lines.append(f"  loops: {statement.loops.compute.describe()}")
        if statement.panel is not None:
            lines.append(f"  reads {statement.panel.tensor} from panels {statement.panel.copy} "
                         f"of {statement.panel.cols} columns")
    lines.extend(f"fused {describe_group(program, group)}" for group in program.groups)
    lines.extend(f"epilogue of S{e.producer}: S{', S'.join(map(str, e.members))}" for e in program.epilogues)
    return "\n".join(lines) + "\n"


def describe_group(program: Program, group: FusedGroup) -> str:
    """``S2-S5 over b, h, l; per-thread buffers E -> local.0[512] (2048 bytes)`` for explain()."""
    first, last = group.statements[0], group.statements[-1]
    text = f"S{first}-S{last} over {', '.join(group.shared)}"
    blocked = {tensor for tensor, _, _ in group.chain.blocked} if group.chain else set()
    parts = []
    for tensor, local in group.locals:
        if tensor in blocked:  # a chain's block buffer: described below
            continue
        shape = program.shapes[local]
        size = program.types[local].bits // 8
        for d in shape:
            size *= d
        parts.append(f"{tensor} -> {local}{list(shape)} ({size} bytes)")
    if parts:
        text += "; per-thread buffers " + ", ".join(parts)
    if group.chain is not None:
        chain = group.chain
        if parts:
            text += ("\n    why: each per-thread buffer is produced and consumed within one row (its "
                     "dependences keep the shared loops equal)")
        plan = chain.plan
        online = plan is not None and plan.columns > 0
        for tensor, buffer, row in plan.blocked if plan is not None else chain.blocked:
            if online and chain.deferred and tensor == chain.deferred.divisor:
                use = "one value per row: a block of columns' sum, folded into the row's running sum"
            elif chain.deferred and tensor == chain.deferred.divisor:
                use = "one value per row, that divides the last product's rows"
            else:
                use = (f"one block of {'rows and columns' if online else 'rows'}, written or read by a "
                       "product's micro-kernel, so it spans the block")
            if plan is None:  # (before the chain pass)
                text += f"\n    {tensor} -> {buffer}[rows, {row}]: {use} (per thread)"
                continue
            size = plan.rows * row * program.types[tensor].bits // 8
            text += f"\n    {tensor} -> {buffer}[{plan.rows}, {row}] ({size} bytes): {use} (per thread)"
        reasons = chain.reasons + (plan.reasons if plan is not None else ())
        text += "".join(f"\n    why: {reason}" for reason in reasons)
    return text


def _dump_products(label: str, heads: tuple[BlockProduct, ...], body, tails: tuple[BlockProduct, ...],
                   row_var: str, depth: int, lines: list[str], between: str = "") -> None:
    inner = "  " * depth
    for product in heads + tails:
        if product is tails[-1] and between:
            lines.append(f"{inner}{between}")
        prepacked = f"; b prepacked in {product.prepacked} per batch" if product.prepacked else ""
        cleared = "; its output set to 0 before a batch's first block" if product.cleared else ""
        lines.append(f"{inner}{label}{product.describe()}{prepacked}{cleared}")
        if product is heads[-1]:
            lines.append(f"{inner}for {row_var} in the block's rows")
            _dump_nodes(body, depth + 1, lines)


def _point_text(point: Point_) -> str:
    return ", ".join(f"{v}={e}" for v, e in point)


def _dump_nodes(nodes, depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    for node in nodes:
        if isinstance(node, Loop):
            tags = [t for t in (f"parallel({node.parallel}, {node.chunks} chunks)" if node.parallel else "",
                                "simd" if node.simd else "",
                                f"reduction({node.simd_reduction})" if node.simd_reduction else "",
                                f"unroll({node.unroll})" if node.unroll else "") if t]
            lines.append(f"{pad}for {node.var} = {node.lo}; {node.cond}; +{node.step}"
                         + (f"  [{' '.join(tags)}]" if tags else ""))
            _dump_nodes(node.body, depth + 1, lines)
        elif isinstance(node, Guard):
            lines.append(f"{pad}if {node.cond}")
            _dump_nodes(node.then, depth + 1, lines)
            if node.other:
                lines.append(f"{pad}else")
                _dump_nodes(node.other, depth + 1, lines)
        elif isinstance(node, Block):
            for name, shape, type_, zeroed in node.buffers:
                lines.append(f"{pad}buffer {name}{list(shape)} {type_.numpy_name}{' zeroed' if zeroed else ''}")
            for name, buffer, offset in node.views:
                lines.append(f"{pad}view {name} = {buffer} + {offset}")
            _dump_nodes(node.body, depth, lines)
        elif isinstance(node, Point):
            piece = "".join(f" {v} = {r} mod {stride}" for v, stride, r in node.residues)
            lines.append(f"{pad}S{node.stmt}{piece} {node.mode.value} ({_point_text(node.point)})")
        elif isinstance(node, Accumulate):
            part = f" part {node.part}" if node.part is not None else ""
            lines.append(f"{pad}accumulate S{node.stmt} into ({_point_text(node.point)}){part}")
            _dump_nodes(node.body, depth + 1, lines)
        elif isinstance(node, RegisterTile):
            lines.append(f"{pad}register tile S{node.stmt} {node.row_var}:{node.rows} from {node.row_start}"
                         f" x {node.col_var}:{node.cols} from {node.col_start} at ({_point_text(node.point)})")
            lines.append(f"{pad}whole if {node.full}")
            _dump_nodes(node.fast, depth + 1, lines)
            lines.append(f"{pad}else")
            _dump_nodes(node.slow, depth + 1, lines)
        elif isinstance(node, ContractionNest):
            lines.append(f"{pad}{node.describe()}")
        elif isinstance(node, BlockChain):
            for name, elements, type_ in node.buffers:
                lines.append(f"{pad}per-thread buffer {name}[{elements}] {type_.numpy_name}")
            for name, elements, type_ in node.shared:
                lines.append(f"{pad}buffer {name}[{elements}] {type_.numpy_name} shared by the threads")
            for depth_, (var, lo, hi) in enumerate(node.loops):
                step = node.rows if depth_ == len(node.loops) - 1 else 1
                parallel_at = len(node.loops) - 1 if node.prepack is Prepack.SHARED else 0
                tag = (f"  [parallel({len(node.loops) - parallel_at - node.accumulates}, {node.chunks} chunks)]"
                       if node.parallel and depth_ == parallel_at else "")
                lines.append(f"{'  ' * (depth + depth_)}for {var} = {lo}; {var} < {hi}; +{step}{tag}")
            inner = "  " * (depth + len(node.loops))
            keys = node.online
            if keys is not None:
                lines.append(f"{inner}running {', '.join(keys.running)} = -inf, 0; S{node.tail.stmt}'s rows = 0")
                lines.append(f"{inner}for {keys.var} = {keys.lo}; {keys.var} < {keys.hi}; +{keys.columns}")
            products = [("", node.heads, node.body, node.tails)]
            if keys is not None and keys.last is not None:
                head, body, tail = keys.last
                products.append(("last block of columns: ", (head,), body, (tail,)))
            for label, head, body, tail in products:
                _dump_products(label, head, body, tail, node.row_var, depth + len(node.loops) + (keys is not None),
                               lines)
            if keys is not None:
                lines.append(f"{inner}divide the rows of S{node.tail.stmt}'s output by {keys.running[1]}; "
                             f"rows flagged in {keys.redo}, whole:")
                head, body, tail, (numerator, _, divisor) = keys.whole
                _dump_products("", (head,), body, (tail,), node.row_var, depth + len(node.loops) + 1, lines,
                               f"{numerator} divided by {divisor} before S{tail.stmt}")
            elif node.deferred is not None:
                lines.append(f"{inner}divide the rows of S{node.tail.stmt}'s output by {node.deferred[2]}")
        elif isinstance(node, OnlineStep):
            into = (f"{node.running} = max({node.running}, {node.local}), {node.factor} = {node.rescale} "
                    f"at {OLD_MAXIMUM} = the old {node.running}" if node.kind == "max" else
                    f"{node.running} = {node.running} * {node.factor} + {node.local}")
            lines.append(f"{pad}online {node.kind} of row {node.row}: {into}")
        elif isinstance(node, TileUpdate):
            lets = f" with {_point_text(node.lets)}" if node.lets else ""
            lines.append(f"{pad}tile update S{node.stmt} ({_point_text(node.point)}){lets}: {node.rhs}")
