"""The sums as TC states them, point by point: packing writes 0 where a guard fails, and 0 x inf
is NaN where TC adds nothing, so an operand holding inf or NaN beside a guarded one takes this
slow, exact path (also the winograd path's, for inf, NaN or huge inputs). So does a scale by
rank-0 tensors that is inf or NaN: the engine scales each sum once, TC scales every term, and
``inf * 0`` terms make NaN where ``inf * sum`` would not."""
from __future__ import annotations

from ...contraction_ir import Path
from ..cwriter import CWriter
from .context import Context


def guarded_products(ctx: Context) -> bool:
    """Whether the other operand of a guarded one is scanned for inf and NaN before the
    engine runs (see :func:`exact_fallback`): whenever a failing guard leaves its term out,
    whatever the sizes (the direct paths test the guard per tap instead). A guarded factor's
    packed zeros multiply the other operand, as written: nothing to scan, except on the
    direct_conv path, which skips the taps of a padded row (0 x inf would be NaN)."""
    con = ctx.con
    other = con.b if con.guarded == "a" else con.a
    return (bool(con.guards) and (not con.padding_multiplies or ctx.plan.path == Path.DIRECT_CONV)
            and ctx.plan.path not in (Path.DIRECT, Path.BATCH_LANES) and other.elements > 0)


def has_exact_fallback(ctx: Context) -> bool:
    """Whether :func:`exact_fallback` opens a branch: a guarded product (see
    :func:`guarded_products`) or a scale by rank-0 tensors (which may be inf or NaN)."""
    return guarded_products(ctx) or bool(ctx.con.alpha_tensors)


def nonfinite(T: str, value: str) -> str:
    """C: whether ``value`` (of C type ``T``) is inf or NaN (``inf - inf`` and NaN are NaN)."""
    return f"({T}){value} - ({T}){value} != 0"


def exact_fallback(ctx: Context, w: CWriter, A: str, B: str, C: str) -> bool:
    """Packing writes 0 where a guard fails, and 0 x inf is NaN where TC adds nothing; so
    when the operand that is not guarded holds inf or NaN, the sums run as TC states them,
    point by point, skipping the terms whose guard fails (slow, for such inputs only); so do
    they when ``alpha``, a scale by rank-0 tensors, is inf or NaN. Opens ``if (...) { <that> ``
    and returns True, or returns False (no guard and no rank-0 scale: the engine runs alone)."""
    if not has_exact_fallback(ctx):
        return False
    T, con = ctx.T, ctx.con
    w(f"int64_t nonfinite = {nonfinite(T, 'alpha') if con.alpha_tensors else '0'};", 1)
    if guarded_products(ctx):
        other, name = (con.b, B) if con.guarded == "a" else (con.a, A)
        w(f"for (int64_t e = 0; e < INT64_C({other.elements}); e++) "
          f"nonfinite |= {nonfinite(T, f'{name}[e]')};  /* inf - inf and NaN are NaN */", 1)
    w("if (TCPY_UNLIKELY(nonfinite)) {", 1)
    w("#pragma omp parallel for collapse(2) num_threads(tcpy_num_threads) if(tcpy_num_threads > 1)", 2)
    w(f"for (int64_t bi = 0; bi < {ctx.batch}; bi++)", 2)
    exact_sums(ctx, w, 3, (A, B, C), ("0", str(ctx.M)), ("0", str(ctx.N)))
    return True


def exact_sums(ctx: Context, w: CWriter, depth: int, tensors, rows, cols):
    """The outputs of batch index ``bi`` in ``rows`` x ``cols`` (C ranges), each summed point by
    point as the statement is written: a term whose guard fails is left out, or for a guarded
    factor is 0 times the other operand (slow: for inputs with inf or NaN where packed zeros
    would make 0 x inf, or the winograd transforms NaN). A scale by rank-0 tensors multiplies
    every term, as TC states it (``alpha`` inf or NaN: see :func:`exact_fallback`)."""
    p, T, con = ctx.prefix, ctx.T, ctx.con
    A, B, C = tensors
    own = "m" if con.guarded == "a" else "n"
    w(f"for (int64_t i = {rows[0]}; i < {rows[1]}; i++) {{", depth)
    w(f"const {ctx.TA} *ar = {A} + INT64_C({con.a.offset}) + {p}_off_a_batch(bi) + {p}_off_a_m(i);", depth + 1)
    w(f"{T} *cr = {C} + INT64_C({con.c.offset}) + {p}_off_c_batch(bi) + {p}_off_c_m(i);", depth + 1)
    w(f"for (int64_t j = {cols[0]}; j < {cols[1]}; j++) {{", depth + 1)
    w(f"const {ctx.TB} *br = {B} + INT64_C({con.b.offset}) + {p}_off_b_batch(bi) + {p}_off_b_n(j);", depth + 2)
    index = "i" if own == "m" else "j"
    parts = [f"INT64_C({g.const}) + {p}_off_g{g_i}_batch(bi) + {p}_off_g{g_i}_{own}({index})"
             for g_i, g in enumerate(con.guards)]
    if parts:
        w(f"const int64_t g[{len(parts)}] = {{{', '.join(parts)}}};", depth + 2)
    w(f"{T} s = 0;", depth + 2)
    w(f"for (int64_t k = 0; k < {ctx.K}; k++) {{", depth + 2)
    holds = " && ".join(f"g[{g_i}] + {p}_off_g{g_i}_k(k) >= 0" for g_i in range(len(parts))) or "1"
    a_k, b_k = f"({T})ar[{p}_off_a_k(k)]", f"({T})br[{p}_off_b_k(k)]"
    if con.alpha_tensors:
        a_k = f"alpha * {a_k}"
    if con.padding_multiplies:
        if con.guarded == "a":
            a_k = f"({holds} ? {a_k} : ({T})0)"
        else:
            b_k = f"({holds} ? {b_k} : ({T})0)"
        w(f"s += {a_k} * {b_k};", depth + 3)
    else:
        w(f"if ({holds}) s += {a_k} * {b_k};", depth + 3)
    w("}", depth + 2)
    w(f"{T} *e = cr + {p}_off_c_n(j);", depth + 2)
    scaled = "s" if con.alpha_tensors else "alpha * s"
    w(f"*e = {scaled if con.init else '*e + ' + scaled};", depth + 2)
    if ctx.epilogue:
        w(f"{{ const {T} v = *e; {ctx.epilogue}(tcpy_buffers, bi, i, j, 1, &v); }}", depth + 2)
    w("}", depth + 1)
    w("}", depth)


