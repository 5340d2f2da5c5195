"""The batch-lanes path (N = 1, the batch contiguous in every tensor): vector lanes over
consecutive batch indices (a depthwise convolution's channels)."""
from __future__ import annotations

from ..cwriter import CWriter
from .context import Context, cell_head


def batch_lanes(ctx: Context, w: CWriter):
    """N = 1, the batch contiguous in every tensor (:func:`_batch_lanes_ok`): per output
    row m (a pixel), runs of consecutive batch indices (channels) in vectors, four at a
    time, each summing the K taps whose guards hold at (m, k): the guards do not depend on
    the batch, so a tap is kept or skipped for all lanes; a pixel away from the padding
    sums all K unrolled, with constant offsets. Leftover batch indices are summed one by one."""
    p, T, con, K, L = ctx.prefix, ctx.T, ctx.con, ctx.K, ctx.plan.lanes
    count = len(con.guards)
    inner = con.batch[-1]
    a_k, b_k = ctx.k_offsets("a"), ctx.k_offsets("b")
    cell_head(ctx, w, "cell")
    w("(void)n0; (void)n1;", 1)
    if count:
        w(f"int64_t gk[{count}][{K}], gmin[{count}];  /* the guards' tap parts, their least */", 1)
        w(f"for (int64_t k = 0; k < {K}; k++) {{", 1)
        for i in range(count):
            w(f"gk[{i}][k] = {p}_off_g{i}_k(k);", 2)
            w(f"gmin[{i}] = k == 0 ? gk[{i}][0] : tcpy_min_int64(gmin[{i}], gk[{i}][k]);", 2)
        w("}", 1)

    def sums(width: int, every: bool, d: int):
        """``width`` vectors (one scalar when ``width`` is 0) at lane offset ``c``."""
        vec = width > 0
        n_acc = width if vec else 1
        w(f"{p}_v " + ", ".join(f"s{u} = {{0}}" for u in range(n_acc)) + ";" if vec else f"{T} s0 = 0;", d)
        load = (lambda base, u: f"*(const {p}_vu *)({base} + c + {u * L})") if vec else \
            (lambda base, u: f"({base})[c]")
        if every:
            for k in range(K):
                w(" ".join(f"s{u} += {load(f'ar + INT64_C({a_k[k]})', u)} * {load(f'bb + INT64_C({b_k[k]})', u)};"
                           for u in range(n_acc)), d)
        else:
            w(f"for (int64_t k = 0; k < {K}; k++) {{", d)
            if count:
                holds = " && ".join(f"g{i} + gk[{i}][k] >= 0" for i in range(count))
                w(f"if (!({holds})) continue;", d + 1)
            w(f"const {T} *ak = ar + {p}_off_a_k(k), *bk = bb + {p}_off_b_k(k);", d + 1)
            w(" ".join(f"s{u} += {load('ak', u)} * {load('bk', u)};" for u in range(n_acc)), d + 1)
            w("}", d)
        for u in range(n_acc):
            target = f"*({p}_vu *)(q + c + {u * L})" if vec else "q[c]"
            w(f"{target} {'=' if con.init else '+='} alpha * s{u};", d)

    w("for (int64_t bi = b0; bi < b1; ) {", 1)
    w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 2)
    w(f"const int64_t len = tcpy_min_int64(b1 - bi, {inner.extent} - bi % {inner.extent});", 2)
    w(f"const {T} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
    w(f"const {T} *TCPY_RESTRICT bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
    w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
    w("for (int64_t m = m0; m < m1; m++) {", 2)
    w(f"const {T} *TCPY_RESTRICT ar = ab + {p}_off_a_m(m);", 3)
    w(f"{T} *TCPY_RESTRICT q = cb + {p}_off_c_m(m);", 3)
    for i, g in enumerate(con.guards):
        w(f"const int64_t g{i} = INT64_C({g.const}) + {p}_off_g{i}_m(m);", 3)
    every = " && ".join(f"gmin[{i}] + g{i} >= 0" for i in range(count)) or "1"
    w("int64_t c = 0;", 3)
    for cond, all_taps in ((every, True), (None, False)):
        w(f"if ({cond}) {{" if cond else "else {", 3)
        for width in (4, 1):
            w(f"for (; c + {width * L} <= len; c += {width * L}) {{", 4)
            sums(width, all_taps, 5)
            w("}", 4)
        w("for (; c < len; c++) {", 4)
        sums(0, all_taps, 5)
        w("}", 4)
        w("}", 3)
    if ctx.epilogue:
        w(f"for (int64_t c = 0; c < len; c++) {ctx.epilogue}(tcpy_buffers, bi + c, m, 0, 1, q + c);", 3)
    w("}", 2)
    w("bi += len;", 2)
    w("}", 1)
    w("}")


