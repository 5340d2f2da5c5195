"""C of a fused chain (:class:`tcpy.loopir.BlockChain`) as its plan lays it out: the block
buffers carved from scratch, the parallel loop over batches and blocks of rows, per block the
head product, the rows between, and the tail product (:func:`tcpy.codegen.contraction.render_block`),
an online chain's blocks of columns and a deferred quotient's division. Functions over the
kernel's emitter (``em``, :class:`tcpy.codegen.emit._Emitter`)."""
import dataclasses
from typing import Mapping

from tcpy.codegen import contraction as contraction_c
from tcpy.codegen.contraction.runtime import F
from tcpy.codegen.cwriter import CLAIMS_PER_THREAD, ScratchSlot, c_literal, dynamic_schedule
from tcpy.codegen.expressions import c_name, convert, index_c, value
from tcpy.generic import engine_statements
from tcpy.loopir import BLOCK_ROWS, BLOCK_START, KEY_COLUMNS, OLD_MAXIMUM, ROW_PITCH, Prepack
from tcpy.transform.runtime_chains import FIELD

_N = F["n"]  # the run-time engine's plan buffer field of N


def block_chain(em, node, depth):
    """A fused chain: per-thread block buffers (ScratchSlot.CHAIN_BLOCKS), a parallel loop over the
    batch loops and blocks of rows; per block the head product, the rows, the tail product
    (an online chain's: per block of columns, see :func:`key_blocks`). b is packed where
    the chain's plan says (``node.prepack``): by each thread when its batch changes, or,
    shared (ScratchSlot.CHAIN_SHARED), by one thread for all, every thread running the batch loops and the
    blocks of the batch split between the threads. A size-generic kernel's: :func:`generic_chain`."""
    if em.generic is not None:
        generic_chain(em, node, depth)
        return
    keys = node.online
    calls, tail_c = _block_products(em, node.heads + node.tails, "", node.deferred is not None and not keys,
                                    keys is not None, keys)
    prepacks = " ".join(p for p, _ in calls if p)
    last_calls = None
    if keys is not None:
        if keys.last is not None:
            last_calls = _block_products(em, (keys.last[0], keys.last[2]), "_last", False, False, keys)[0]
        if prepacks:  # b of every block of columns
            if last_calls is not None:
                last = " ".join(p for p, _ in last_calls if p)
                prepacks = f"if ({keys.var} + {keys.columns} <= {keys.hi}) {{ {prepacks} }} else {{ {last} }}"
            prepacks = (f"for (int64_t {keys.var} = {keys.lo}; {keys.var} < {keys.hi}; {keys.var} += "
                        f"{keys.columns}) {{ {prepacks} }}")
    em.emit("{", depth)
    shared = node.prepack is Prepack.SHARED
    if shared:
        carve(em, "tcpy_shared", ScratchSlot.CHAIN_SHARED, node.shared, depth + 1)
    if node.parallel:
        em.emit(f"const int tcpy_nt = tcpy_num_threads < {node.chunks} ? tcpy_num_threads : {node.chunks};",
                  depth + 1)
        em.emit("#pragma omp parallel num_threads(tcpy_nt) if(tcpy_nt > 1)", depth + 1)
    em.emit("{", depth + 1)
    carve(em, "tcpy_mem", ScratchSlot.CHAIN_BLOCKS, node.buffers, depth + 2)
    em.emit("int64_t tcpy_batch = -1;  /* the batch whose operands this thread packed */", depth + 2)
    em.emit("(void)tcpy_batch;", depth + 2)
    d = depth + 2
    *batch_loops, (var, lo, hi) = node.loops
    threads = em.ir.options.threads
    if node.parallel and not shared:
        collapsed = len(node.loops) - node.accumulates  # (a batch's blocks, summed, run in one thread)
        collapse = f" collapse({collapsed})" if collapsed > 1 else ""
        em.emit(f"#pragma omp for {dynamic_schedule(node.chunks, threads)}{collapse}", d)
    for loop_var, lo_, hi_ in batch_loops:
        em.emit(f"for (int64_t {loop_var} = {lo_}; {loop_var} < {hi_}; {loop_var}++)", d)
        d += 1
    if shared:
        em.emit("{", d)
        em.emit("#pragma omp single", d + 1)
        em.emit(f"{{ {prepacks} }}", d + 1)
        if node.parallel:
            blocks = -(-(hi - lo) // node.rows)
            em.emit(f"#pragma omp for {dynamic_schedule(blocks, threads)}", d + 1)
        d += 1
    em.emit(f"for (int64_t {var} = {lo}; {var} < {hi}; {var} += {node.rows}) {{", d)
    em.emit(f"const int64_t {BLOCK_ROWS} = {hi} - {var} < {node.rows} ? {hi} - {var} : {node.rows};", d + 1)
    if node.prepack is Prepack.PER_THREAD:
        batch = "0"
        for loop_var, lo_, hi_ in batch_loops:
            batch = f"({batch}) * {hi_ - lo_} + ({loop_var} - {lo_})"
        em.emit(f"if ({batch} != tcpy_batch) {{ tcpy_batch = {batch}; {prepacks} }}", d + 1)
    if keys is not None:
        key_blocks(em, node, calls, last_calls, tail_c, d + 1)
    else:
        for product in node.heads + node.tails:
            if product.cleared:  # its output sums the batch's blocks: zero before the first
                pointer = c_name(product.bases[2][0]) + " + " + index_c(product.bases[2][1])
                em.emit(f"if ({var} == {lo}) {em.symbol}_s{product.stmt}_clear_rows({pointer}, "
                        f"{product.contraction.size('m')});", d + 1)
        for _, call in calls[:len(node.heads)]:
            em.emit(call, d + 1)
        block_rows(em, node.row_var, node.body, d + 1)
        for _, call in calls[len(node.heads):-1]:
            em.emit(call, d + 1)
        if node.deferred is None:
            em.emit(calls[-1][1], d + 1)
        else:
            deferred_tail(em, node, calls[-1][1], tail_c, d + 1)
    em.emit("}", d)
    if shared:
        em.emit("}", d - 1)
    em.emit("}", depth + 1)
    em.emit("}", depth)


def _block_products(em, products, suffix: str, divided: bool, online: bool, keys=None):
    """The C of a chain's products (helpers added to the file; ``suffix`` tells apart
    the products of one statement): ``([(prepack, call) per product], the last one's output
    pointer)``. With ``keys`` (an online chain's blocks of columns), b packed once per batch
    is the current block's. A product summing the blocks runs on all its rows (the block's
    are its sum)."""
    names = {name: c_name(name) for name in em.buffer_names()}
    calls, tail_c = [], ""
    for k, product in enumerate(products):
        pointers = tuple(f"{c_name(tensor)} + {index_c(offset)}" for tensor, offset in product.bases)
        last = product is products[-1]
        prepacked = c_name(product.prepacked) if product.prepacked else None
        if prepacked and keys is not None:
            prepacked = f"{prepacked} + ({keys.var} - {keys.lo}) / {keys.columns} * INT64_C({keys.panels[k]})"
        rows = str(product.contraction.size("m")) if product.cleared else index_c(product.rows)
        helpers, prepack, call = contraction_c.render_block(
            product.contraction, product.plan, names, f"{em.symbol}_s{product.stmt}{suffix}", pointers,
            rows, prepacked, divided and last, online and last, product.cleared)
        em.helpers.append(helpers)
        calls.append((prepack, call))
        tail_c = pointers[2]  # the block's rows of the last product's output
    return calls, tail_c


def block_rows(em, row_var: str, body, depth: int):
    """``body`` for each row of the block (none for a chain of two products)."""
    if not body:
        return
    em.emit(f"for (int64_t {row_var} = {BLOCK_START}; {row_var} < {BLOCK_START} + {BLOCK_ROWS}; "
              f"{row_var}++) {{", depth)
    em.loops += 1
    em.nodes(body, depth + 1)
    em.loops -= 1
    em.emit("}", depth)


def key_blocks(em, node, calls, last_calls, tail_c: str, depth: int):
    """An online chain's block of rows (see :class:`tcpy.loopir.Online`): the rows' running
    maximum at -inf and sum at 0, the output rows at 0; per block of columns the head
    product, the rows (folding the block into the running maximum and sum), the output rows
    rescaled by the factor and the tail product adding the block's terms; then the rows
    divided by their sums, and the flagged rows computed again whole."""
    keys = node.online
    T = node.tail.contraction.dtype
    tail_fn = f"{em.symbol}_s{node.tail.stmt}"
    mx, sm, factor = (c_name(b) for b in keys.running)
    redo = c_name(keys.redo)
    em.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{ {mx}[r] = TCPY_MAX_IDENTITY_{T.numpy_name}; "
              f"{sm}[r] = ({T.c_type})0; }}", depth)
    em.emit(f"{tail_fn}_clear_rows({tail_c}, {BLOCK_ROWS});", depth)
    em.emit(f"for (int64_t {keys.var} = {keys.lo}; {keys.var} < {keys.hi}; {keys.var} += {keys.columns}) {{",
              depth)
    variants = [(calls, node.body)]
    if keys.last is not None:
        variants.append((last_calls, keys.last[1]))
        em.emit(f"if ({keys.var} + {keys.columns} <= {keys.hi}) {{", depth + 1)
    for k, (variant, body) in enumerate(variants):
        if k:
            em.emit("} else {", depth + 1)
        d = depth + 1 + (keys.last is not None)
        em.emit(variant[0][1], d)
        block_rows(em, node.row_var, body, d)
        em.emit(f"{tail_fn}_scale_rows({tail_c}, {BLOCK_ROWS}, {factor});", d)
        em.emit(variant[1][1], d)
    if keys.last is not None:
        em.emit("}", depth + 1)
    em.emit("}", depth)
    head, body, tail, (numerator, row, divisor) = keys.whole
    whole_calls, _ = _block_products(em, (head, tail), "_whole", False, False)
    em.emit(f"if ({tail_fn}_finish_rows({tail_c}, {BLOCK_ROWS}, {mx}, {sm}, {redo})) {{", depth)
    em.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{", depth + 1)
    em.emit(f"if (!{redo}[r]) continue;", depth + 2)
    em.emit(f"const int64_t tcpy_row = {BLOCK_START} + r;", depth + 2)
    em.emit("{  /* the row as the statements say: its quotient itself, all its columns at once */", depth + 2)
    em.emit(f"const int64_t {BLOCK_START} = tcpy_row, {BLOCK_ROWS} = 1;", depth + 3)
    em.emit(whole_calls[0][1], depth + 3)
    block_rows(em, node.row_var, body, depth + 3)
    quotient_rows(em, numerator, row, divisor, T.c_type, None, depth + 3)
    em.emit(whole_calls[1][1], depth + 3)
    em.emit("}", depth + 2)
    em.emit("}", depth + 1)
    em.emit("}", depth)


def online_step(em, node, depth):
    """An :class:`tcpy.loopir.OnlineStep`: a block's maximum or sum folded into the row's
    running one (the factor is 0 while the running maximum is -inf: nothing was summed)."""
    em.stmt_index = node.stmt
    em.current_stmt = em.stmts[node.stmt]
    T = em.types[node.local]
    r = index_c(node.row)
    run, factor, local = c_name(node.running), c_name(node.factor), c_name(node.local)
    if node.kind == "sum":
        em.emit(f"{run}[{r}] = {run}[{r}] * {factor}[{r}] + {local}[0];", depth)
        return
    em.env = em.point_env(node.point)
    em.shapes[OLD_MAXIMUM], em.types[OLD_MAXIMUM] = (), T
    em.emit("{", depth)
    em.emit(f"const {T.c_type} {c_name(OLD_MAXIMUM)}[1] = {{{run}[{r}]}};", depth + 1)
    em.emit(f"{local}[0] = tcpy_max_{T.numpy_name}({c_name(OLD_MAXIMUM)}[0], {local}[0]);", depth + 1)
    rescale = convert(value(em, node.rescale), node.rescale.type, T)
    em.emit(f"{factor}[{r}] = {c_name(OLD_MAXIMUM)}[0] == TCPY_MAX_IDENTITY_{T.numpy_name} ? "
              f"({T.c_type})0 : {rescale};", depth + 1)
    em.emit(f"{run}[{r}] = {local}[0];", depth + 1)
    em.emit("}", depth)


def deferred_tail(em, node, call: str, tail_c: str, depth: int):
    """The tail product of a chain whose quotient ``X = Y / Z`` was deferred past it (see
    :class:`tcpy.loopir.Deferral`): rows whose Z is below 1 in magnitude or not finite
    (where Y / Z itself could overflow) divide Y in place (X itself) and set their Z to 1;
    the product runs on Y; its rows are divided by Z; if a row with Z != 1 came out not
    finite (its sum overflowed before the division), every such row takes X and the
    product runs again."""
    numerator, row, divisor = node.deferred
    T = node.tail.contraction.dtype.c_type
    divide = f"{em.symbol}_s{node.tail.stmt}_divide_rows"
    quotient_rows(em, numerator, row, divisor, T, f"!(isfinite(zr) && fabs(zr) >= ({T})1)", depth)
    em.emit(call, depth)
    em.emit(f"if ({divide}({tail_c}, {BLOCK_ROWS}, {c_name(divisor)})) {{", depth)
    quotient_rows(em, numerator, row, divisor, T, f"zr != ({T})1", depth + 1)
    em.emit(call, depth + 1)
    em.emit("}", depth)


def quotient_rows(em, numerator: str, row, divisor: str, T: str, condition, depth: int):
    """A deferred quotient ``X = Y / Z`` itself, in place in Y's block buffer (``row``
    elements of C type ``T`` a row: a count, or C text for a size-generic chain's), for the
    block's rows whose ``zr`` meets ``condition`` (all, if None); their Z becomes 1."""
    y, z = c_name(numerator), c_name(divisor)
    em.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{", depth)
    em.emit(f"const {T} zr = {z}[r];", depth + 1)
    em.emit(f"if ({condition or 1}) {{", depth + 1)
    em.emit(f"for (int64_t e = 0; e < {row}; e++) {y}[r * {row} + e] = {y}[r * {row} + e] / zr;", depth + 2)
    em.emit(f"{z}[r] = ({T})1;", depth + 2)
    em.emit("}", depth + 1)
    em.emit("}", depth)


def carve(em, base, slot, buffers, depth):
    """Declare ``buffers`` (name, elements, type) in scratch ``slot``, each on a cache line;
    elements given as C text (known at run time) come last."""
    offsets, total, line, dynamic = [], 0, em.ir.options.target.cache_line, ""
    for name, elements, type_ in sorted(buffers, key=lambda b: isinstance(b[1], str)):
        offsets.append((name, type_, f"{total}{dynamic}"))
        if isinstance(elements, str):
            dynamic += f" + ({elements} * {type_.bits // 8} + {line - 1}) / {line} * {line}"
        else:
            total += -(-elements * (type_.bits // 8) // line) * line
    em.emit(f"char *{base} = (char *)tcpy_scratch({slot}, {max(total, 1)}{dynamic});", depth)
    for name, type_, offset in offsets:
        em.emit(f"{type_.c_type} *TCPY_RESTRICT {c_name(name)} = ({type_.c_type} *)({base} + {offset});", depth)


def generic_chain(em, node, depth):
    """A size-generic kernel's online chain (:mod:`tcpy.transform.runtime_chains`): its loops
    over the call's ranges; the rows per block, the block buffers' row pitch, and each product's plan buffers and operands'
    bases, read from its statement's plan buffer (variant 0 on a whole block of columns, 1 on
    the last one; a row computed again whole runs them too, on one row, block after block of its
    columns); the products run the run-time engine's cell, their b
    packed by each thread once per batch for every block of columns, or read in place where
    it is laid out as packed (``<p>_packed_b``: attention's V at a head size of the tile's width)."""
    keys = node.online
    whole_head, _, whole_tail, _ = keys.whole
    names = {name: c_name(name) for name in em.buffer_names()}
    products = (node.head, node.tail)
    plans = {p.stmt: f"tcpy_chain{k}" for k, p in enumerate(products)}
    for k, product in enumerate(products):
        em.helpers.append(contraction_c.render_runtime_block(product.contraction, product.plan, names,
                                                             f"{em.symbol}_s{product.stmt}", k == 1))
        if product.plan.small_tile is not None:  # (its second micro-tile's routines: see _routine)
            mr, nr = product.plan.small_tile
            em.helpers.append(contraction_c.render_runtime_block(
                product.contraction, dataclasses.replace(product.plan, mr=mr, nr=nr), names,
                _second_prefix(em, product), False))
    *batch_loops, (var, lo, hi) = node.loops
    lo, hi = index_c(lo, top=True), index_c(hi, top=True)
    key_lo, key_hi = index_c(keys.lo, top=True), index_c(keys.hi, top=True)
    em.emit("{", depth)
    d = depth + 1
    engines = engine_statements(em.program)
    for product in products:
        slot = len(names) + 1 + engines.index(product.stmt)
        em.emit(f"const int64_t *TCPY_RESTRICT {plans[product.stmt]} = (const int64_t *)tcpy_buffers[{slot}];", d)
    em.emit(f"const int64_t tcpy_step = {plans[node.head.stmt]}[{FIELD['rows']}];  /* rows per block at this call */",
            d)
    em.emit(f"const int64_t {ROW_PITCH} = {plans[node.head.stmt]}[{FIELD['pitch']}];  /* the block buffers' rows "
            f"apart */ (void){ROW_PITCH};", d)
    em.emit(f"const int64_t tcpy_width = ({key_hi}) - ({key_lo}), tcpy_key_blocks = (tcpy_width + "
            f"{keys.columns - 1}) / {keys.columns};", d)
    chunks, batch = f"(({hi}) - ({lo}) + tcpy_step - 1) / tcpy_step", "0"
    for loop_var, lo_, hi_ in batch_loops:
        extent = f"(({index_c(hi_, top=True)}) - ({index_c(lo_, top=True)}))"
        chunks += f" * {extent}"
        batch = f"({batch}) * {extent} + ({loop_var} - ({index_c(lo_, top=True)}))"
    em.emit(f"const int64_t tcpy_chunks = {chunks};", d)
    em.emit("const int tcpy_nt = tcpy_num_threads < tcpy_chunks ? tcpy_num_threads : tcpy_chunks > 1 ? "
            "(int)tcpy_chunks : 1; (void)tcpy_nt;", d)
    # (a thread's iterations in a row: mostly one batch, whose packed b they share)
    em.emit(f"const int64_t tcpy_chunk = tcpy_chunks / ({CLAIMS_PER_THREAD} * tcpy_nt) > 1 ? "
            f"tcpy_chunks / ({CLAIMS_PER_THREAD} * tcpy_nt) : 1; (void)tcpy_chunk;", d)
    if node.parallel:
        em.emit("#pragma omp parallel num_threads(tcpy_nt) if(tcpy_nt > 1)", d)
    em.emit("{", d)
    d += 1
    whole = {tensor for p in (whole_head, whole_tail) for tensor, _ in p.bases}
    packed = [(f"prepack.{k}", f"tcpy_key_blocks * {plans[p.stmt]}[{FIELD['panel']}]", p.contraction.dtype)
              for k, p in enumerate(products)]
    carve(em, "tcpy_mem", ScratchSlot.CHAIN_BLOCKS,
          [(name, "tcpy_width" if name in whole else elements, type_) for name, elements, type_ in node.buffers]
          + packed, d)
    em.emit("int64_t tcpy_batch = -1;  /* the batch whose b this thread packed */", d)
    if node.parallel:
        collapse = f" collapse({len(node.loops)})" if len(node.loops) > 1 else ""
        em.emit(f"#pragma omp for schedule(dynamic, tcpy_chunk){collapse}", d)
    for loop_var, lo_, hi_ in batch_loops:
        em.emit(f"for (int64_t {loop_var} = {index_c(lo_, top=True)}; {loop_var} < {index_c(hi_, top=True)}; "
                f"{loop_var}++)", d)
        d += 1
    em.emit(f"for (int64_t {var} = {lo}; {var} < {hi}; {var} += tcpy_step) {{", d)
    em.emit(f"const int64_t {BLOCK_ROWS} = ({hi}) - {var} < tcpy_step ? ({hi}) - {var} : tcpy_step;", d + 1)
    loop_vars = [v for v, _, _ in batch_loops] + [var, keys.var]
    em.emit(f"if ({batch} != tcpy_batch) {{  /* b of every block of columns, packed once per batch */", d + 1)
    em.emit(f"tcpy_batch = {batch};", d + 2)
    em.emit(f"for (int64_t {keys.var} = {key_lo}; {keys.var} < {key_hi}; {keys.var} += {keys.columns}) {{", d + 2)
    em.emit(f"const int64_t tcpy_variant = ({key_hi}) - {keys.var} < {keys.columns};", d + 3)
    for k, product in enumerate(products):
        plan = plans[product.stmt]
        b = _operand(em, product, 1, plan, "tcpy_variant", loop_vars, 1 + len(loop_vars))
        em.emit(f"{{ const int64_t *TCPY_RESTRICT tcpy_pl = {plan} + {plan}[tcpy_variant] + "
                f"{3 * (1 + len(loop_vars))}; if (!{_routine(em, product, 'packed_b')}(tcpy_pl, {b})) "
                f"{_routine(em, product, 'prepack')}(tcpy_pl, {b}, {c_name(f'prepack.{k}')} + ({keys.var} - "
                f"({key_lo})) / {keys.columns} * {plan}[{FIELD['panel']}]); }}", d + 3)
    em.emit("}", d + 2)
    em.emit("}", d + 1)
    _generic_key_blocks(em, node, plans, loop_vars, d + 1)
    em.emit("}", d)
    em.emit("}", depth + 1)
    em.emit("}", depth)


def _generic_key_blocks(em, node, plans, loop_vars, depth):
    """A generic chain's block of rows (as :func:`key_blocks`): blocks of ``KEY_COLUMNS``
    columns, the last one shorter (its products run the plan buffers' variant 1)."""
    keys = node.online
    T = node.tail.contraction.dtype
    tail = node.tail
    tail_fn = f"{em.symbol}_s{tail.stmt}"
    mx, sm, factor = (c_name(b) for b in keys.running)
    redo = c_name(keys.redo)
    per = 1 + len(loop_vars)
    plan = plans[tail.stmt]
    rows_plan = f"({plan} + {plan}[0] + {3 * per})"  # (the output rows: the first variant's, as every variant's)
    tail_c = _operand(em, tail, 2, plan, "0", loop_vars[:-1], per)
    em.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{ {mx}[r] = TCPY_MAX_IDENTITY_{T.numpy_name}; "
            f"{sm}[r] = ({T.c_type})0; }}", depth)
    lo, hi = index_c(keys.lo, top=True), index_c(keys.hi, top=True)
    # (the first block of keys' tail product overwrites its rows; with no keys none runs)
    em.emit(f"if (({hi}) <= ({lo})) {tail_fn}_clear_rows({rows_plan}, {tail_c}, {BLOCK_ROWS});", depth)
    em.emit(f"for (int64_t {keys.var} = {lo}; {keys.var} < {hi}; {keys.var} += {keys.columns}) {{", depth)
    d = depth + 1
    em.emit(f"const int64_t {KEY_COLUMNS} = ({hi}) - {keys.var} < {keys.columns} ? ({hi}) - {keys.var} : "
            f"{keys.columns};", d)
    em.emit(f"const int tcpy_variant = {KEY_COLUMNS} < {keys.columns};", d)
    for k, product in enumerate((node.head, tail)):
        if product is tail:
            block_rows(em, node.row_var, node.body, d)
            em.emit(f"if ({keys.var} != {lo}) {tail_fn}_scale_rows({rows_plan}, {tail_c}, {BLOCK_ROWS}, {factor});"
                    "  /* (the first block's product writes its rows) */", d)
        prepacked = (f"{c_name(f'prepack.{k}')} + ({keys.var} - ({lo})) / {keys.columns} * "
                     f"{plans[product.stmt]}[{FIELD['panel']}]")
        em.emit(_cell_call(em, product, plans, "tcpy_variant", loop_vars, BLOCK_ROWS, prepacked,
                           f"{keys.var} == {lo}"), d)
    em.emit("}", depth)
    whole_head, body, whole_tail, (numerator, _, divisor) = keys.whole
    em.emit(f"if ({tail_fn}_finish_rows({rows_plan}, {tail_c}, {BLOCK_ROWS}, {mx}, {sm}, {redo})) {{", depth)
    em.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{", depth + 1)
    em.emit(f"if (!{redo}[r]) continue;", depth + 2)
    em.emit(f"const int64_t tcpy_row = {BLOCK_START} + r;", depth + 2)
    em.emit("{  /* the row as the statements say: its quotient itself, all its columns at once */", depth + 2)
    d = depth + 3
    em.emit(f"const int64_t {BLOCK_START} = tcpy_row, {BLOCK_ROWS} = 1;", d)
    _whole_row_product(em, node.head, whole_head, keys, plans, loop_vars, lo, hi, d)
    block_rows(em, node.row_var, body, d)
    quotient_rows(em, numerator, "tcpy_width", divisor, T.c_type, None, d)
    em.emit(f"if (({hi}) <= ({lo})) {tail_fn}_clear_rows({rows_plan}, {tail_c}, 1);", d)
    _whole_row_product(em, tail, whole_tail, keys, plans, loop_vars, lo, hi, d)
    em.emit("}", depth + 2)
    em.emit("}", depth + 1)
    em.emit("}", depth)


def _whole_row_product(em, product, whole, keys, plans, loop_vars, lo: str, hi: str, depth):
    """A generic chain's ``product`` on one whole row of columns ``lo`` to ``hi`` (C), block
    after block of ``keys`` (:class:`tcpy.loopir.KeyBlocks`) on the blocks' plans (variants 0 and
    1); ``whole``: the product as lowered on the whole row, whose operands in block buffers are
    in the row's whole buffers instead, read and written at each block's first column (a block
    plan on one row reads nothing of its buffers' row pitch)."""
    at = f"({keys.var} - ({lo}))"
    buffers = {k: f"{c_name(tensor)} + {at}"
               for k, ((tensor, _), (block, _)) in enumerate(zip(whole.bases, product.bases)) if tensor != block}
    em.emit(f"for (int64_t {keys.var} = {lo}; {keys.var} < {hi}; {keys.var} += {keys.columns}) {{", depth)
    em.emit(f"const int tcpy_variant = ({hi}) - {keys.var} < {keys.columns};", depth + 1)
    em.emit(_cell_call(em, product, plans, "tcpy_variant", loop_vars, "1", "0", f"{keys.var} == {lo}", buffers),
            depth + 1)
    em.emit("}", depth)


def _cell_call(em, product, plans, variant: str, loop_vars, rows: str, prepacked: str,
               fresh: str = "1", operands: Mapping[int, str] = {}) -> str:
    """The call of a generic chain product's cell with its plan buffer's ``variant`` (C: 0 or
    1) on ``rows`` rows, its N from that plan buffer, its operands at the variant's bases
    along ``loop_vars`` (the chain's loops, the block of columns' last) or as ``operands`` gives
    them (C, by index: 0 a, 1 b, 2 c), its b packed at ``prepacked`` (C: 0, the cell packs it);
    a product summing over the blocks of columns overwrites its output where ``fresh`` (C) holds."""
    plan = plans[product.stmt]
    per = 1 + len(loop_vars)
    operands = [operands.get(k) or _operand(em, product, k, plan, variant, loop_vars, per) for k in range(3)]
    alpha = c_literal(product.contraction.alpha, product.contraction.dtype)  # (no tensor scales a chain's)
    cell = _routine(em, product, "cell")
    in_place = ""
    if prepacked != "0":  # (b read in place where it is laid out as packed: see generic_chain)
        in_place = (f"const {product.contraction.dtype.c_type} *tcpy_in_place = "
                    f"{_routine(em, product, 'packed_b')}(tcpy_pl, {operands[1]}); ")
        prepacked = f"tcpy_in_place ? tcpy_in_place : {prepacked}"
    return (f"{{ const int64_t *TCPY_RESTRICT tcpy_pl = {plan} + {plan}[{variant}] + {3 * per}; {in_place}"
            f"{cell}(tcpy_pl, {', '.join(operands)}, 0, 1, 0, {rows}, 0, tcpy_pl[{_N}], "
            f"{alpha}, tcpy_stop, {prepacked}, {fresh}); }}")


def _second_prefix(em, product) -> str:
    mr, nr = product.plan.small_tile
    return f"{em.symbol}_s{product.stmt}_t{mr}x{nr}"


def _routine(em, product, name: str) -> str:
    """C: a generic chain product's routine ``name`` (cell, prepack) of the micro-tile that
    the plan buffer ``tcpy_pl`` (a variant's) was planned with: the product's plan's, or
    its second one (:func:`tcpy.transform.engines.second_tile`, the calls whose N it tiles
    better: attention's key rows of 64-column multiples take 6x64 rather than 8x48)."""
    own = f"{em.symbol}_s{product.stmt}_{name}"
    if product.plan.small_tile is None:
        return own
    mr, nr = product.plan.small_tile
    return (f"(tcpy_pl[{F['mr']}] == {mr} && tcpy_pl[{F['nr']}] == {nr} ? {_second_prefix(em, product)}_{name} "
            f": {own})")


def _operand(em, product, k: int, plan: str, variant: str, loop_vars, per: int) -> str:
    """C: operand ``k`` (a, b, c) of a generic chain's ``product``: a block buffer itself, or
    its tensor at the bases of its plan buffer ``plan``'s ``variant`` (``per`` values an
    operand) along ``loop_vars``."""
    tensor = product.bases[k][0]
    if tensor not in em.buffer_names():
        return c_name(tensor)
    at = f"{plan}[{plan}[{variant}] + {k * per}]"
    for j, var in enumerate(loop_vars):
        at += f" + {plan}[{plan}[{variant}] + {k * per + 1 + j}] * {var}"
    return f"{c_name(tensor)} + {at}"
