"""Statement fusion: consecutive statements that share their outer output loops run under them.

Softmax, layer norm and the middle of attention are written as several statements over the same
rows (``Mx(b,h,l) max=! Sc(b,h,l,s)``, ``E(b,h,l,s) = exp(...)``, ``Sm(b,h,l) +=! E(b,h,l,s)``,
...). Run one after the other, each streams the whole tensor through memory; fused under the
shared loops ``b, h, l``, one row is produced and consumed while it is in cache, and the rows run
in parallel.

Legality comes from isl dependence analysis, not from names of patterns: for every pair of
statements in a group and every tensor one writes and the other accesses, the dependence
relation ``{ Sa[x] -> Sb[y] : access_a(x) = access_b(y) }`` must keep the shared loops equal
(distance 0 on every shared loop), so each iteration of the shared loops only uses what that
same iteration produced, and the iterations can run in parallel. A statement whose shared
variable is a reduction, that reads a tensor at another point of the shared loops, or whose
indices are not affine, stays out.

A temporary that only the group touches, always at the shared point (the same dimensions
indexed by the shared variables in every access), **shrinks** to a buffer of one iteration (a
row): it lives in the parallel loop's body, one per thread, and is never allocated at full size.

**Chains.** When the statement right before a group is an engine contraction producing the rows
the group reads (attention's scores ``Sc(b,h,l,s)``) and the statement right after is one
consuming rows the group writes (``O(b,h,l,d) +=! P(b,h,l,s) * V(b,h,s,d)``), all three are one
group (legal by the same dependence test, with the shared variables output variables of both
products). The last shared variable then runs in blocks of rows: per block the first product
writes its rows into a per-thread block buffer through the micro-kernel, the statements
between run row by row on views of those buffers, and the second product reads its block of
rows as its A operand. How many rows a block holds, whether the columns run in blocks too,
which loops run in parallel and where the products' other operands are packed is the chain's
plan, decided by :mod:`tcpy.transform.chains` (lowered by :mod:`tcpy.lower_chains`). Several
products may come before the rows and after them (attention's backward: the scores and the
probabilities' cotangent of a block of query rows, the softmax rows, then dQ, dK and dV); a
product after them may sum over the blocked variable (``dK(s, d) +=! dSc(l, s) * Q(l, d)``
blocked on ``l``): each block adds its terms, and a batch's blocks run in order. Two
products back to back, the second reading the rows the first writes (``(A B) C``), chain the
same way with nothing between them. Every block of rows reads the products' other operands
again: such a pair chains when those reads pay (:func:`tcpy.transform.chains.rereads_pay`:
an MLP's large weights and short rows stay apart).

**Deferred quotients.** When the rows the second product reads are a quotient
``P(r, s) = E(r, s) / Sm(r)`` by one value per row (softmax's normalisation) that nothing else
reads, and the product overwrites a sum, the product reads ``E`` and its output rows are
divided by ``Sm`` instead (:class:`tcpy.loopir.Deferral`, flash attention's rescaling): one
division per output element instead of one per score. Rows where that could differ by more
than rounding (``Sm`` below 1 in magnitude or not finite; a sum that overflows before the
division) take ``P`` itself.

**Online softmax.** When the rows are a softmax whose normalisation is deferred (``M(r) max=!
S(r, c)``, ``E(r, c) = exp(k * (S(r, c) - M(r)))`` with ``k`` the same for every column,
``Z(r) +=! E(r, c)``, ``E / Z``), the columns ``c`` can run in blocks too
(:class:`tcpy.loopir.Online`, flash attention; the chain's plan does so when even a block of
one micro-tile's rows would not fit half of L2, for long sequences): per block, the block's
maximum is folded into a running one, the running sum and the output rows are multiplied by
the exponential statement's own expression at the old maximum (``exp(k * (m - m'))``) when it
grew, and the block's terms are added. The block buffers hold a block of rows and columns,
whatever the sequence length. Rows whose maximum or sum is not finite, whose sum is below 1 or
whose result is not finite run again whole, as the statements say.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import islpy as isl

from ..lang import ast
from ..lang.visit import accesses, map_expr
from ..loopir import Chain, Const, Deferral, FusedGroup, Online, Program, Statement
from ..options import Options
from ..ranges.affine import access_map, affine_form
from ..contraction_ir import Contraction
from .chains import rereads_pay
from .engines import restamp, stamp_loops
from .recognition import block_contraction

# Shrunk temporaries live on the stack of each thread: no bigger than this per group.
MAX_LOCAL_BYTES = 64 << 10
LOCAL_PREFIX = "local."  # (a "." keeps generated names apart from TC identifiers)
BLOCK_PREFIX = "block."


def fuse_statements(program: Program, options: Options) -> Program:
    """``program`` with fused groups (and their shrunk temporaries); unchanged unless
    ``options.fuse``."""
    if not options.fuse:
        return program
    statements = program.statements
    uses = _uses(statements)
    in_epilogues = {i for e in program.epilogues for i in e.members}
    fusable = [() if i in in_epilogues else _fusable_vars(program, s) for i, s in enumerate(statements)]
    groups: list[FusedGroup] = []
    start = 0
    while start < len(statements):
        shared = fusable[start]
        end = start + 1
        if shared:
            dependences = _GroupDependences(program, shared)
            dependences.admit(statements[start])
        while shared and end < len(statements):
            common = _common_vars(program, shared, fusable[end], statements[start], statements[end])
            if not common:
                break
            dependences.narrow(common)
            if not dependences.admit(statements[end]):
                break
            shared, end = common, end + 1
        if end - start >= 2:
            groups.append(FusedGroup(tuple(range(start, end)), shared))
        start = end
    chained = [_chain(program, uses, group, options) or group for group in groups]
    if program.generic is None:
        groups = _with_product_pairs(program, uses, chained, options)
    else:  # only online chains: their block buffers are sized from the blocks, not the sizes
        groups = [new if new.chain is None or _generic_chain(program, new) else old
                  for old, new in zip(groups, chained)]
    if not groups:
        return program
    statements = list(statements)
    for group in groups:
        deferral = group.chain.deferred if group.chain else None
        if deferral is not None:  # the last product reads the numerator in place of the quotient
            statements[group.statements[-1]] = restamp(_reading_numerator(statements[group.statements[-1]], deferral),
                                                       program, options)
    return _stamp_members(_shrink_temporaries(dataclasses.replace(program, statements=tuple(statements),
                                                                  groups=tuple(groups))), options)


def _stamp_members(program: Program, options: Options) -> Program:
    """``program`` with its groups' loop statements stamped again: they run under the shared
    loops (the parallel ones), on the shrunk temporaries."""
    inner = dataclasses.replace(options, parallel=False)
    statements = list(program.statements)
    for group in program.groups:
        for i in group.statements:
            if statements[i].engine is None:
                statements[i] = stamp_loops(statements[i], program.shapes, program.types, inner,
                                            program.generic is not None)
    return dataclasses.replace(program, statements=tuple(statements))


def _fusable_vars(program: Program, statement: Statement) -> tuple[str, ...]:
    """The statement's left-hand variables that could be shared loops (empty: not fusable).

    Contractions, register-tiled nests (GEMM-like) and the copies passes add keep their own
    loops; so do statements an epilogue runs (the caller knows those: they run in a
    contraction's store)."""
    stmt = statement.stmt
    if statement.origin < 0 or not stmt.lhs or statement.panel is not None:
        return ()
    if statement.engine is not None:
        return ()  # the contraction engine blocks it itself
    if statement.loops.compute.register_tile is not None:
        return ()
    if any(affine_form(e, program.sizes, program.shapes) is None
           for access, _ in accesses(stmt) for e in access.indices):
        return ()
    if program.generic is not None and any(program.generic.access(access, stmt.index_vars, statement.origin, "S")
                                           is None for access, _ in accesses(stmt)):
        return ()  # (an index in the sizes: its dependences would hold at the planned sizes only)
    return tuple(e.name for e in stmt.lhs if isinstance(e, ast.IndexVar))


def _common_vars(program: Program, shared, candidate, first: Statement, other: Statement) -> tuple[str, ...]:
    """The shared variables that the other statement also writes along, over the same range
    (``mean(c)`` and ``centered(n, c, h, w)`` share ``c``), in the first statement's order; in
    a generic program the same range at every size."""
    generic = program.generic
    return tuple(v for v in shared if v in candidate and first.ranges[v] == other.ranges[v]
                 and (generic is None or generic.same_range(first.origin, other.origin, v)))


# ----------------------------------------------------------------------------- chains


def _with_product_pairs(program: Program, uses, groups: list[FusedGroup], options: Options) -> list[FusedGroup]:
    """``groups`` and, in order among them, the chains of two consecutive products that no group
    holds, where the second reads the rows the first writes (``(A B) C``: the product of the
    first's rows by the second's operand needs nothing but those rows)."""
    taken = {i for group in groups for i in group.statements}
    pairs = []
    for first in range(len(program.statements) - 1):
        if first in taken or first + 1 in taken:
            continue
        head, tail = program.statements[first], program.statements[first + 1]
        # the shared loops: the first's output variables that the second writes along too
        shared = tuple(e.name for e in head.stmt.lhs if isinstance(e, ast.IndexVar)
                       and e.name in tail.stmt.output_vars and tail.ranges[e.name] == head.ranges[e.name])
        pair = _chain(program, uses, FusedGroup((), shared), options, first)
        if pair is not None:
            pairs.append(pair)
            taken |= {first, first + 1}
    return sorted(groups + pairs, key=lambda group: group.statements[0])


def _chain(program: Program, uses, group: FusedGroup, options: Options, first: int = -1) -> Optional[FusedGroup]:
    """``group`` widened by the contractions right before it and those right after it, when the
    first ones produce rows the group consumes and the last ones consume rows the group
    produces (scores, softmax, times V; attention's backward: scores and the probabilities'
    cotangent, the rows, then dQ, dK and dV), all along the shared loops but the last, which
    the products before write along: one parallel loop over blocks of rows then computes a
    block's products with the micro-kernel and its rows in cache. A product after the rows may
    sum over the last shared variable instead (``dK(s, d) +=! dSc(l, s) * Q(l, d)`` blocked on
    ``l``): each block adds its terms (:attr:`Chain.accumulating`). An empty ``group`` (with
    the pair's shared loops) chains statement ``first`` and the next, the second reading the
    first's rows. None otherwise."""
    statements = program.statements
    temporaries = {t.name for t in program.def_.temporaries}
    inner = [statements[i].stmt for i in group.statements]
    if group.statements:
        read = {a.tensor for s in inner for a, w in accesses(s) if not w}
        written = {s.target for s in inner}
        heads = _products_next_to(program, group.statements[0], -1, lambda s: s.target in read)
        tails = _products_next_to(program, group.statements[-1], 1, lambda s: any(
            a.tensor in written for a, w in accesses(s) if not w))
    elif first + 1 < len(statements) and _product_alone(program, first) and _product_alone(program, first + 1):
        heads, tails = [first], [first + 1]
    else:
        return None
    shared = group.shared
    if not heads or not tails or not shared:
        return None
    ranges = statements[heads[0]].ranges
    block_var, fixed = shared[-1], shared[:-1]
    engines = [statements[i].engine for i in heads + tails]
    accumulating = tuple(i for i in tails if block_var in statements[i].engine.contraction.role_vars("k"))
    for i in heads + tails:
        along = shared if i not in accumulating else fixed
        if not set(along) <= set(statements[i].stmt.output_vars) or any(
                statements[i].ranges[v] != ranges[v] for v in shared):
            return None
    if any(not statements[i].stmt.init for i in accumulating):
        return None  # (its blocks' terms are added to what a `+=!` sets to zero first)
    members = tuple(heads) + group.statements + tuple(tails)
    produced = [statements[i].stmt.target for i in heads]
    rows_written = {s.target for s in inner} | set(produced)
    consumed = []
    for i in tails:
        con = statements[i].engine.contraction
        reads = [acc.tensor for acc in (con.a, con.b) if acc.tensor in temporaries]
        if len(reads) != 1 or reads[0] not in rows_written:
            return None
        consumed.append(reads[0])
    if not set(produced) <= temporaries or any((c in produced) != (not inner) for c in consumed):
        return None
    row_tensors: tuple[str, ...] = tuple(dict.fromkeys(produced + consumed))
    if not all(_row_buffer_ok(program, uses, members, t, shared) for t in row_tensors) or not _legal(
            program, [statements[i] for i in members], shared):
        return None
    deferral = None
    if inner and len(heads) == len(tails) == 1 and not accumulating:
        tail = statements[tails[0]]
        deferral = _deferral(program, uses, group, produced[0], consumed[0], tail.engine.contraction)
        if deferral is not None and all(_row_buffer_ok(program, uses, members, t, shared)
                                        for t in (deferral.numerator, deferral.divisor)):
            deferred_tail = restamp(_reading_numerator(tail, deferral), program, options)
            if deferred_tail.engine is not None:
                engines[1] = deferred_tail.engine
                row_tensors = (produced[0], deferral.numerator, deferral.divisor)
        if len(row_tensors) < 3:
            deferral = None
    blocked = []
    for k, tensor in enumerate(row_tensors):
        row = 1
        for e, n in zip(next(a for i in members for a, _ in accesses(statements[i].stmt) if a.tensor == tensor).indices,
                        program.shapes[tensor]):
            row *= 1 if isinstance(e, ast.IndexVar) and e.name in shared else n
        blocked.append((tensor, f"{BLOCK_PREFIX}{k}", row))
    blocked = tuple(blocked)
    mr = _micro_rows(engines)
    if not inner and not rereads_pay(program, engines, blocked, ranges, shared, mr, options):
        return None  # (a softmax's chain keeps its rows in blocks whatever the b: its rows are the memory)
    buffers = {tensor: buffer for tensor, buffer, _ in blocked}
    # (whether a product runs on blocks depends on its roles, not on how many rows or columns)
    for i, engine in zip(heads + tails, engines):
        stmt = _reading_numerator(statements[i], deferral).stmt if deferral and i == tails[-1] else statements[i].stmt
        if block_contraction(engine.contraction, stmt, statements[i].ranges, fixed, block_var, mr, buffers,
                             program) is None:
            return None
    online = None
    if deferral is not None:
        online = _online(program, group, produced[0], deferral, engines[0].contraction, engines[1].contraction)
    reasons = ()
    if deferral is not None:
        last = tails[0]
        reasons += (f"{deferral.quotient} = {deferral.numerator} / {deferral.divisor} is read only by "
                    f"S{last}, and {deferral.divisor} is one value per row: S{last} reads {deferral.numerator} "
                    f"and divides its rows of {statements[last].stmt.target} by {deferral.divisor} "
                    f"(S{deferral.statement} does not run; rows whose {deferral.divisor} is below 1 in magnitude "
                    f"or not finite, or whose result is not, take {deferral.quotient} itself)",)
    if accumulating:
        reasons += (f"S{', S'.join(map(str, accumulating))} sum{'s' if len(accumulating) == 1 else ''} over "
                    f"{block_var}: each block of rows adds its terms, so a batch's blocks run in order in one "
                    f"thread (the loops over {', '.join(fixed) or 'no batch'} in parallel)",)
    return FusedGroup(members, shared, chain=Chain(block_var, blocked, reasons, deferral, online, heads=len(heads),
                                                   tails=len(tails), accumulating=accumulating))


def _generic_chain(program: Program, group: FusedGroup) -> bool:
    """Whether a size-generic kernel runs ``group``'s chain (see
    :mod:`tcpy.transform.runtime_chains`): its online form, whose blocks of rows and of columns
    have a fixed size, with one product each side scaled by no tensor (the block products run
    on the run-time engine, without the exact sums an inf or NaN scale needs), whose b is an
    input (packed once per batch for every block of rows)."""
    chain = group.chain
    inputs = {p.name for p in program.def_.params}
    products = [program.statements[i].engine.contraction for i in group.products]
    return (chain.online is not None and not chain.accumulating and chain.heads == chain.tails == 1
            and not any(con.alpha_tensors for con in products) and all(con.b.tensor in inputs for con in products))


def _micro_rows(engines) -> int:
    """The rows of a block of a chain of these products' engines are a multiple of this (every
    product's micro-tile rows)."""
    return math.lcm(*(e.plan.mr for e in engines))


def _product_alone(program: Program, index: int) -> bool:
    """Whether statement ``index`` is a contraction the engine runs, of the def, without an
    epilogue (a product with an epilogue runs it in its own store)."""
    statement = program.statements[index]
    return (statement.engine is not None and statement.origin >= 0
            and not any(e.producer == index for e in program.epilogues))


def _products_next_to(program: Program, index: int, step: int, wanted) -> list[int]:
    """The products (:func:`_product_alone`) whose statement is ``wanted`` right before
    statement ``index`` (``step`` -1) or right after it (1), in statement order."""
    found = []
    k = index + step
    while (0 <= k < len(program.statements) and _product_alone(program, k)
           and wanted(program.statements[k].stmt)):
        found.append(k)
        k += step
    return sorted(found)


def _online(program: Program, group: FusedGroup, produced: str, deferral: Optional[Deferral],
            head: Contraction, tail: Contraction) -> Optional[Online]:
    """The chain's :class:`Online` form, when its rows are a softmax whose normalisation is
    deferred (the chain pass decides whether it runs so): the statements between the products
    are, in order, ``M(r) max=! S(r, c)`` on the first product's rows ``S``, ``E(r, c) =
    exp(u)`` with ``u`` one of ``S(r, c) - M(r)``, ``k * (S - M)``, ``(S - M) * k`` or ``(S -
    M) / k`` (``k`` the same for every column: it reads nothing the chain writes and no
    ``c``), ``Z(r) +=! E(r, c)``, and the deferred quotient ``E / Z``; ``c`` is the first product's only output column
    variable and the last product's only reduction variable. Then ``exp(u(S) - u(S'))`` is
    ``exp(u(S)) / exp(u(S'))`` up to rounding, which is what rescaling relies on."""
    if deferral is None:
        return None
    statements = program.statements
    rest = [i for i in group.statements if i != deferral.statement]
    if len(rest) != 3 or head.role_vars("n") != tail.role_vars("k") or len(head.role_vars("n")) != 1:
        return None
    column = head.role_vars("n")[0]
    maximum, exponential, total = (statements[i].stmt for i in rest)

    def row_vars(indices) -> bool:
        return (all(isinstance(e, ast.IndexVar) for e in indices)
                and sorted(e.name for e in indices) == sorted(group.shared))

    scores = maximum.rhs
    if (maximum.reduction != "max" or not maximum.init or maximum.where or not row_vars(maximum.lhs)
            or not isinstance(scores, ast.Access) or scores.tensor != produced
            or not all(isinstance(e, ast.IndexVar) for e in scores.indices)
            or sorted(e.name for e in scores.indices) != sorted(group.shared + (column,))):
        return None
    mx = ast.Access(maximum.target, maximum.lhs)
    if (exponential.target != deferral.numerator or exponential.reduction is not None or exponential.where
            or [getattr(e, "name", None) for e in exponential.lhs] != [e.name for e in scores.indices]
            or not isinstance(exponential.rhs, ast.Call) or exponential.rhs.func != "exp"
            or len(exponential.rhs.args) != 1
            or not _scaled_difference(exponential.rhs.args[0], scores, mx, column, program, group)):
        return None
    summed = total.rhs
    if (total.target != deferral.divisor or total.reduction != "+" or not total.init or total.where
            or not row_vars(total.lhs) or not isinstance(summed, ast.Access) or summed.tensor != exponential.target
            or [getattr(e, "name", None) for e in summed.indices] != [e.name for e in exponential.lhs]):
        return None
    float_type = program.types[produced]
    if any(program.types[t] != float_type for t in (maximum.target, exponential.target, total.target)):
        return None
    return Online(column, *rest)


def _scaled_difference(u: ast.Expr, scores: ast.Access, mx: ast.Access, column: str, program: Program,
                       group: FusedGroup) -> bool:
    """Whether ``u`` is ``S - M``, ``k * (S - M)``, ``(S - M) * k`` or ``(S - M) / k`` with
    ``S`` the access ``scores``, ``M`` the row maximum ``mx`` and ``k`` free of the column
    variable and of anything the chain writes."""
    def is_difference(e) -> bool:
        return (isinstance(e, ast.Binary) and e.op == "-" and _same_access(e.lhs, scores)
                and _same_access(e.rhs, mx))

    if is_difference(u):
        return True
    if not isinstance(u, ast.Binary) or u.op not in ("*", "/"):
        return False
    if is_difference(u.lhs):
        factor = u.rhs
    elif u.op == "*" and is_difference(u.rhs):
        factor = u.lhs
    else:
        return False
    written = {program.statements[i].stmt.target for i in group.statements} | {scores.tensor}
    return not any((isinstance(node, ast.IndexVar) and node.name == column)
                   or (isinstance(node, ast.Access) and node.tensor in written) for node in factor.walk())


def _same_access(e: ast.Expr, access: ast.Access) -> bool:
    return (isinstance(e, ast.Access) and e.tensor == access.tensor
            and [getattr(i, "name", None) for i in e.indices] == [getattr(i, "name", None) for i in access.indices]
            and all(isinstance(i, ast.IndexVar) for i in e.indices))


def _row_buffer_ok(program: Program, uses, members, tensor: str, shared: tuple[str, ...]) -> bool:
    """Whether ``tensor`` can live in a chain's block buffer: only the chain uses it, always at
    the shared point, and its first writer writes every element (block buffers hold no zeros)."""
    users = [i for i, _, _ in uses.get(tensor, ())]
    return (set(users) <= set(members)
            and _shared_positions([a for _, a, _ in uses[tensor]], shared) is not None
            and _first_write_covers(program, program.statements[users[0]], tensor))


def _deferral(program: Program, uses, group: FusedGroup, produced: str, quotient: str,
              tail_con: Contraction) -> Optional[Deferral]:
    """The :class:`Deferral` of ``quotient`` past the chain's last product (``tail_con``), when its one
    statement in the group is ``X(v...) = Y(v...) / Z(shared...)`` on temporaries of the
    product's float type, ``Y`` is not the first product's ``produced`` rows (they have their
    own block), nothing else reads ``X``, nothing after it writes ``Y`` or ``Z``, and the
    product overwrites a sum (``+=!``), so dividing its result divides every term."""
    statements = program.statements
    last = group.statements[-1] + 1
    writers = [i for i in group.statements if statements[i].stmt.target == quotient]
    if len(writers) != 1:
        return None
    index = writers[0]
    stmt = statements[index].stmt
    rhs = stmt.rhs
    if (stmt.reduction is not None or stmt.where or not isinstance(rhs, ast.Binary) or rhs.op != "/"
            or not isinstance(rhs.lhs, ast.Access) or not isinstance(rhs.rhs, ast.Access)):
        return None
    numerator, divisor = rhs.lhs, rhs.rhs
    if ([getattr(e, "name", None) for e in numerator.indices] != [getattr(e, "name", None) for e in stmt.lhs]
            or not all(isinstance(e, ast.IndexVar) for e in stmt.lhs)
            or not all(isinstance(e, ast.IndexVar) and e.name in group.shared for e in divisor.indices)):
        return None
    names = {quotient, numerator.tensor, divisor.tensor}
    if produced in names:
        return None
    temporaries = {t.name for t in program.def_.temporaries}
    types = {program.types[t] for t in names | {statements[last].stmt.target}}
    if len(names) != 3 or not names <= temporaries or len(types) != 1 or not types.pop().is_float:
        return None
    if not statements[last].stmt.init or tail_con.dtype != program.types[quotient]:
        return None  # (a contraction's sum is `+`)
    readers = list(dict.fromkeys(i for i, _, write in uses.get(quotient, ()) if not write))
    later = group.statements[group.statements.index(index) + 1:]
    if readers != [last] or any(statements[i].stmt.target in names for i in later):
        return None
    return Deferral(index, quotient, numerator.tensor, divisor.tensor)


def _reading_numerator(tail: Statement, deferral: Deferral) -> Statement:
    """The chain's last product reading the deferral's numerator where it read the quotient (at
    the same indices)."""
    def swap(e):
        if isinstance(e, ast.Access) and e.tensor == deferral.quotient:
            return dataclasses.replace(e, tensor=deferral.numerator)
        return None
    return dataclasses.replace(tail, stmt=dataclasses.replace(tail.stmt, rhs=map_expr(tail.stmt.rhs, swap)))


# ----------------------------------------------------------------------------- dependences


def _accesses_rw(stmt: ast.Stmt):
    for access, is_write in accesses(stmt):
        yield access, is_write
    if stmt.reduction is not None:
        yield ast.Access(stmt.target, stmt.lhs), False


def _uses(statements) -> dict[str, list[tuple[int, ast.Access, bool]]]:
    """tensor -> (statement index, access, is_write) of every access to it, in statement order
    (an index built once, so that no question about a tensor scans every statement)."""
    uses: dict[str, list[tuple[int, ast.Access, bool]]] = {}
    for i, statement in enumerate(statements):
        for access, is_write in accesses(statement.stmt):
            uses.setdefault(access.tensor, []).append((i, access, is_write))
    return uses


def _shared_first(statement: Statement, shared: tuple[str, ...]) -> tuple[str, ...]:
    """The statement's loops, the shared ones first."""
    return shared + tuple(v for v in statement.stmt.index_vars if v not in shared)


class _GroupDependences:
    """The accesses of a growing group, per tensor, as maps ``{ S[shared] -> T[element] }`` (the
    statements' other loops projected out): a statement joins when every element it touches at a
    point of the shared loops is touched there only, by the members before it (one a writer).

    That is isl dependence analysis between the statement and each member at once, and it is
    exact: a dependence ``Sa[x] -> Sb[y]`` keeps the shared loops equal exactly when its
    projection on them does. One test per access of the statement, whatever the group's size:
    a def of thousands of statements fuses in linear time."""

    def __init__(self, program: Program, shared: tuple[str, ...]):
        self.program, self.shared = program, shared
        self.written: dict[str, isl.Map] = {}
        self.touched: dict[str, isl.Map] = {}

    def narrow(self, shared: tuple[str, ...]) -> None:
        """Keep only the shared loops ``shared`` (a subsequence of the current ones): a group
        legal under some shared loops stays legal under fewer of them."""
        dropped = [k for k, v in enumerate(self.shared) if v not in shared]
        if not dropped:
            return
        for maps in (self.written, self.touched):
            for tensor, relation in maps.items():
                for k in reversed(dropped):
                    relation = relation.project_out(isl.dim_type.in_, k, 1)
                maps[tensor] = relation.set_tuple_name(isl.dim_type.in_, "S").coalesce()
        self.shared = shared

    def admit(self, statement: Statement) -> bool:
        """Add ``statement`` if every dependence between it and the members keeps the shared
        loops equal; False (and nothing added) otherwise."""
        loops, program = _shared_first(statement, self.shared), self.program
        maps = []
        for access, is_write in _accesses_rw(statement.stmt):
            if program.generic is not None:  # the sizes as parameters: legal at every size
                relation = program.generic.access(access, loops, statement.origin, "S")
            else:
                relation = access_map(access, loops, statement.ranges, program.sizes, program.shapes, "S")
            maps.append((access.tensor, is_write,
                         relation.project_out(isl.dim_type.in_, len(self.shared),
                                              len(statement.stmt.index_vars) - len(self.shared))
                         .set_tuple_name(isl.dim_type.in_, "S")))
        for tensor, is_write, relation in maps:
            others = (self.touched if is_write else self.written).get(tensor)
            if others is not None:
                dependence = relation.apply_range(others.reverse())  # S[x] -> S[y]: one element
                if not dependence.is_subset(isl.Map.identity(dependence.get_space())):
                    return False
        for tensor, is_write, relation in maps:
            for table in (self.touched, self.written) if is_write else (self.touched,):
                table[tensor] = table[tensor].union(relation).coalesce() if tensor in table else relation
        return True


def _legal(program: Program, group, shared: tuple[str, ...]) -> bool:
    """Every dependence between statements of the group keeps the shared loops equal."""
    dependences = _GroupDependences(program, shared)
    return all(dependences.admit(statement) for statement in group)


# ----------------------------------------------------------------------------- shrinking


def _shrink_temporaries(program: Program) -> Program:
    temporaries = {t.name for t in program.def_.temporaries}
    uses = _uses(program.statements)
    statements = list(program.statements)
    shapes, types = dict(program.shapes), dict(program.types)
    generic = program.generic
    # a generic program's buffers: their shapes in the sizes (see tcpy.generic)
    generic_shapes = dict(generic.shapes) if generic is not None else {}
    groups, shrunk = [], []
    for group in program.groups:
        members = set(group.statements)
        # a chain's products read and write their block buffers directly; its rows see views
        blocked = {tensor for tensor, _, _ in group.chain.blocked} if group.chain else set()
        rewritten = members - set(group.products)
        locals_: list[tuple[str, str]] = []
        local_bytes = 0
        deferred = group.chain.deferred if group.chain else None
        touched = {a.tensor for i in group.statements for a, _ in accesses(program.statements[i].stmt)}
        for tensor in sorted(touched & temporaries):
            if deferred is not None and tensor == deferred.quotient:
                shrunk.append(tensor)  # its statement does not run: no buffer at all
                continue
            users = [i for i, _, _ in uses[tensor]]
            if not set(users) <= members:
                continue
            positions = _shared_positions([a for _, a, _ in uses[tensor]], group.shared)
            if positions is None:
                continue
            shape = tuple(n for d, n in enumerate(shapes[tensor]) if d not in positions)
            size = types[tensor].bits // 8
            for d in shape:
                size *= d
            if generic is not None:
                generic_shape = tuple(n for d, n in enumerate(generic.shapes[tensor]) if d not in positions)
                if not all(isinstance(n, Const) for n in generic_shape):
                    size = 0  # sized at run time, in per-thread scratch rather than on the stack
            if tensor not in blocked:
                if local_bytes + size > MAX_LOCAL_BYTES:
                    continue
                local_bytes += size
            local = f"{LOCAL_PREFIX}{len(shrunk)}"
            locals_.append((tensor, local))
            shrunk.append(tensor)
            shapes[local], types[local] = shape, types[tensor]
            if generic is not None:
                generic_shapes[local] = generic_shape

            def rest(indices, positions=positions):
                return tuple(e for d, e in enumerate(indices) if d not in positions)

            def to_local(e, tensor=tensor, local=local, rest=rest):
                if isinstance(e, ast.Access) and e.tensor == tensor:
                    return ast.Access(local, rest(e.indices), span=e.span, type=e.type)
                return None

            for i in set(users) & rewritten:
                stmt = statements[i].stmt
                new_stmt = dataclasses.replace(stmt, rhs=map_expr(stmt.rhs, to_local))
                if stmt.target == tensor:
                    new_stmt = dataclasses.replace(new_stmt, target=local, lhs=rest(stmt.lhs))
                statements[i] = dataclasses.replace(statements[i], stmt=new_stmt)
        # (a local's users are all members: the first of them is the group's first to touch it)
        zeroed = tuple(local for tensor, local in locals_
                       if not _first_write_covers(program, program.statements[uses[tensor][0][0]], tensor))
        groups.append(dataclasses.replace(group, locals=tuple(locals_), zeroed=zeroed))
    if generic is not None:
        generic = dataclasses.replace(generic, shapes=generic_shapes)
    return dataclasses.replace(program, statements=tuple(statements), shapes=shapes, types=types,
                               groups=tuple(groups), shrunk=tuple(shrunk), generic=generic)


def _first_write_covers(program: Program, first: Statement, tensor: str) -> bool:
    """Whether ``first``, the first statement of a group that touches ``tensor``, writes every
    element of it without reading it: then its buffer needs no zeros (TC: unwritten elements
    read 0)."""
    stmt = first.stmt
    reads_itself = (any(a.tensor == tensor for a, w in accesses(stmt) if not w)
                    or (stmt.reduction is not None and not stmt.init))
    if stmt.target != tensor or reads_itself:
        return False
    shape = program.shapes[tensor]
    if not all(isinstance(e, ast.IndexVar) for e in stmt.lhs):
        return False
    if program.generic is not None:  # at every size
        return program.generic.covers(first.origin, tuple(e.name for e in stmt.lhs), tensor)
    return all(first.ranges[e.name][0] <= 0 and first.ranges[e.name][1] >= n for e, n in zip(stmt.lhs, shape))


def _shared_positions(accesses: list[ast.Access], shared: tuple[str, ...]) -> Optional[frozenset[int]]:
    """The dimensions every access indexes with a shared variable, the same ones in each, so
    that one iteration of the shared loops uses a slice of the tensor; None if they differ."""
    found = None
    for access in accesses:
        positions = {d: e.name for d, e in enumerate(access.indices)
                     if isinstance(e, ast.IndexVar) and e.name in shared}
        if set(positions.values()) != set(shared) or len(positions) != len(shared):
            return None
        if found is not None and positions != found:
            return None
        found = positions
    return frozenset(found) if found is not None else None
