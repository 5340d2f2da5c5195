"""What a fused chain (:class:`tcpy.loopir.BlockChain`) renders of its products: a contraction
on one block of rows (one thread, no grid), and the helpers over a block's output rows (a
deferred quotient's division, an online chain's clearing, rescaling and finishing)."""
from __future__ import annotations

from ..cwriter import CWriter
from .context import Context, header
from .exact import exact_sums, nonfinite
from .grid import cell_call, path_helpers
from .packing import prepack


def render_block(ctx: Context, pointers: tuple[str, str, str], rows: str, prepacked,
                 divided: bool = False, online: bool = False, cleared: bool = False) -> tuple[str, str, str]:
    """``(helpers, prepack, call)`` for one block of rows inside a fused chain (one thread,
    no grid): ``pointers`` are the C pointers of a, b and c at the block; ``prepacked`` the
    C buffer holding B packed once per batch (None: the cell packs or reads B itself);
    ``cleared`` adds ``void <p>_clear_rows(T *C, int64_t rows)`` (see :func:`online_rows`)."""
    helpers = CWriter()
    header(ctx, helpers)
    path_helpers(ctx, helpers)
    if divided:
        divide_rows(ctx, helpers)
    if online:
        online_rows(ctx, helpers)
    elif cleared:
        rows_helper(ctx, helpers, "clear_rows", "", element=(f"*e = ({ctx.T})0;",))
    prepack_call = ""
    if prepacked is not None:
        prepack(ctx, helpers)
        prepack_call = f"{ctx.prefix}_prepack({pointers[1]}, {prepacked});"
    cell = cell_call(ctx, *pointers, "0, 1", f"0, {rows}", f"0, {ctx.N}", f"0, {ctx.K}", bpre=prepacked or "0")
    if ctx.con.alpha_tensors and not online:  # an inf or NaN scale scales every term (see .exact)
        exact = CWriter()
        exact_sums(ctx, exact, 0, pointers, ("0", rows), ("0", str(ctx.N)))
        cell = (f"if (TCPY_UNLIKELY({nonfinite(ctx.T, 'alpha')})) {{ const int64_t bi = 0;\n{exact.text()}}} "
                f"else {cell}")
    call = f"{{ const {ctx.T} alpha = {ctx.alpha()}; {cell}; }}"
    return helpers.text(), prepack_call, call


def rows_helper(ctx: Context, w: CWriter, name: str, params: str, row=(), element=(), after=()):
    """``<p>_<name>(T *C, int64_t rows<params>)``: for each output row r of a block, ``row``
    lines, then ``element`` lines for each of its elements ``*e``, then ``after`` lines; with
    ``after`` it returns ``int any`` (which those lines set), else nothing."""
    p, T = ctx.prefix, ctx.T
    w(f"static {'int' if after else 'void'} {p}_{name}({T} *TCPY_RESTRICT C, int64_t rows{params}) {{")
    if after:
        w("int any = 0;", 1)
    w("for (int64_t r = 0; r < rows; r++) {", 1)
    w(f"{T} *TCPY_RESTRICT o = C + {p}_off_c_m(r);", 2)
    for line in row:
        w(line, 2)
    w(f"for (int64_t j = 0; j < {ctx.N}; j++) {{", 2)
    w(f"{T} *e = o + {p}_off_c_n(j);", 3)
    for line in element:
        w(line, 3)
    w("}", 2)
    for line in after:
        w(line, 2)
    w("}", 1)
    if after:
        w("return any;", 1)
    w("}")


def online_rows(ctx: Context, w: CWriter):
    """The row helpers of an online chain's last product (its output rows summed over blocks
    of columns): ``void <p>_clear_rows(T *C, int64_t rows)`` sets a block's rows to 0;
    ``void <p>_scale_rows(T *C, int64_t rows, const T *f)`` multiplies row r by ``f[r]``
    (when it is not 1: the running maximum grew); ``int <p>_finish_rows(T *C, int64_t rows,
    const T *m, const T *z, int32_t *redo)`` divides row r by ``z[r]`` (the running sum) and
    sets ``redo[r]`` when the row cannot stand (``m[r]`` or ``z[r]`` not finite, ``z[r]``
    below 1 in magnitude, a result not finite); it returns whether any row is set."""
    T = ctx.T
    rows_helper(ctx, w, "clear_rows", "", element=(f"*e = ({T})0;",))
    rows_helper(ctx, w, "scale_rows", f", const {T} *TCPY_RESTRICT f",
                (f"const {T} s = f[r];", "if (s == 1) continue;"), ("*e = *e * s;",))
    rows_helper(ctx, w, "finish_rows",
                f", const {T} *TCPY_RESTRICT m, const {T} *TCPY_RESTRICT z, int32_t *TCPY_RESTRICT redo",
                (f"const {T} d = z[r];", f"int bad = !(isfinite(m[r]) && isfinite(d) && fabs(d) >= ({T})1);"),
                ("*e = *e / d;", "bad |= !isfinite(*e);"), ("redo[r] = bad;", "any |= bad;"))


def divide_rows(ctx: Context, w: CWriter):
    """``int <p>_divide_rows(T *C, int64_t rows, const T *z)``: a block's output rows, row r
    divided by ``z[r]`` (a quotient deferred past the product); returns 1 when a row whose
    ``z`` is not 1 came out inf or NaN (its sum may have overflowed before the division)."""
    T = ctx.T
    rows_helper(ctx, w, "divide_rows", f", const {T} *TCPY_RESTRICT z", (f"const {T} d = z[r];", "int bad = 0;"),
                ("*e = *e / d;", "bad |= !isfinite(*e);"), (f"any |= bad && d != ({T})1;",))


