"""Parallel loops scale to large machines: the schedule's chunk counts, simulated for 2 to 256
threads without running anything (this machine has few cores)."""
import math

import numpy as np
import pytest

import tcpy
from tcpy import demo
from tcpy.loopir import ContractionNest, Loop, NestKind
from tcpy.schedule import CHUNKS_PER_THREAD, PARALLEL_MIN_WORK

THREADS = (2, 16, 64, 256)
ENGINE_PARALLEL_WORK = 1 << 22  # multiply-adds: ~50 us on one core, far above a team's start
GEMMS = [(n, n, n) for n in (64, 256, 1024, 4096)] + [(1024, 1024, 64), (128, 128, 4096), (4096, 64, 512)]
CONVS = [(n, c, hw) for n in (1, 8) for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7))]
ATTENTIONS = [(1, 1, 256), (1, 8, 512), (4, 12, 1024), (2, 24, 4096), (1, 1, 4096)]


def plans(kernel, *shapes):
    """(schedule, statement, extents) of every parallel-capable compute nest."""
    ir = kernel.specialize(*shapes).ir
    for nest in ir.nests:
        if nest.kind is NestKind.COMPUTE and nest.schedule is not None:
            statement = ir.program.statements[nest.stmt]
            yield nest, statement


def output_work_units(sched, statement) -> int:
    """Independent pieces of output work: register blocks, or output points outside the SIMD loop."""
    extents = statement.extents()
    outputs = [v for v in sched.order if v not in sched.reductions]
    if sched.register_tile is not None:
        row, rows, col, cols = sched.register_tile
        blocks = {row: rows, col: cols}
        return math.prod(max(1, -(-extents[v] // blocks.get(v, 1))) for v in outputs)
    simd = sched.order[-1] if sched.order else None
    return math.prod(max(1, extents[v]) for v in outputs if v != simd)


def check_engine_plans(kernel, threads, *shapes):
    """Contractions run on a BLIS-style grid of equal cells, one per thread: as many cells as
    threads (within 15%: cells divide the work evenly) unless the micro-tiles run out, or fewer
    cells when the slowest gets at most 15% more micro-tiles than an even split would give it."""
    ir = kernel.specialize(*shapes).ir
    for nest in ir.nests:
        for node in nest.body:
            if isinstance(node, ContractionNest):
                roles = node.contraction
                plan = node.plan
                extent = lambda groups: math.prod(g.extent for g in groups)  # noqa: E731
                tiles = (extent(roles.batch) * -(-extent(roles.m) // plan.mr) * -(-extent(roles.n) // plan.nr))
                if plan.path == "winograd":  # the threads split the slivers of transformed tiles
                    slivers = extent(roles.batch) * -(-plan.winograd.tiles // plan.nr)
                    assert plan.grid == (1, 1, min(threads, slivers), 1), plan.describe()
                    continue
                if plan.path == "direct_conv":  # the threads claim (row, segment, channel block) items
                    form = plan.conv
                    items = (extent(roles.batch) * form.row_count * -(-form.run.extent // plan.nc)
                             * -(-form.channel_count // plan.nr))
                    tiles = extent(roles.batch) * form.row_count * -(-form.run.extent // plan.mr)
                    assert plan.grid == (1, 1, min(threads, items), 1), plan.describe()
                    assert items >= min(threads, tiles), f"{plan.describe()}: {items} items"
                    continue
                cells = math.prod(plan.grid)
                assert cells <= threads, f"{plan.describe()}: more cells than threads"
                if plan.grid[3] == 1:
                    assert cells <= tiles, f"{plan.describe()}: more cells than micro-tiles"
                work = extent(roles.batch) * extent(roles.m) * extent(roles.n) * extent(roles.k)
                if work >= ENGINE_PARALLEL_WORK:  # (below, the cost model may rightly keep fewer)
                    tb, tm, tn, tk = plan.grid
                    slowest = (-(-extent(roles.batch) // tb) * -(-(-(-extent(roles.m) // plan.mr)) // tm)
                               * -(-(-(-extent(roles.n) // plan.nr)) // tn) / tk)
                    assert cells >= 0.85 * min(threads, tiles) or slowest <= 1.15 * -(-tiles // threads), (
                        f"{plan.describe()}: {tiles} micro-tiles")


def check_plan(kernel, threads, *shapes):
    check_engine_plans(kernel, threads, *shapes)
    for nest, statement in plans(kernel, *shapes):
        sched = nest.schedule
        work = math.prod(max(0, e) for e in statement.extents().values())
        if work < PARALLEL_MIN_WORK:
            assert sched.parallel_dims == 0
            continue
        wanted = min(CHUNKS_PER_THREAD * threads, output_work_units(sched, statement))
        assert sched.parallel_dims > 0 or wanted < 2, f"{statement.stmt}: serial"
        assert sched.chunks >= wanted, (
            f"{statement.stmt}: {sched.chunks} chunks for {threads} threads, output allows {wanted}: "
            f"{sched.describe()}")
        loops = [n for n in nest.body if isinstance(n, Loop) and n.parallel]
        assert all(loop.chunks == sched.chunks for loop in loops)  # no more threads than chunks


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("m, n, k", GEMMS)
def test_gemm_chunks(threads, m, n, k):
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(num_threads=threads))
    check_plan(kernel, threads, (m, k), (k, n))


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("batch, channels, hw", CONVS)
def test_conv_chunks(threads, batch, channels, hw):
    kernel = tcpy.define(demo.CONV2D, options=tcpy.Options(num_threads=threads))
    check_plan(kernel, threads, (batch, channels, hw + 2, hw + 2), (channels, channels, 3, 3))


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("b, h, s", ATTENTIONS)
def test_attention_chunks(threads, b, h, s):
    kernel = tcpy.define(demo.ATTENTION, options=tcpy.Options(num_threads=threads))
    q = (b, h, s, 64)
    check_plan(kernel, threads, q, q, q, 0.125)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("batch, channels, hw", [(1, 256, 56), (8, 256, 56), (1, 32, 112), (2, 3, 224)])
def test_depthwise_cells_keep_whole_images(threads, batch, channels, hw):
    """The direct path (its batch: the channels) splits the channels before the rows when they
    divide among the threads: each batch index a cell starts costs its tap tables, so a cell keeps
    whole images. Channels that do not divide leave the choice to the compute balance."""
    case = demo.resnet_conv_case(batch, channels, channels, hw, 3, 1, depthwise=True)
    kernel = tcpy.define(case.source, options=tcpy.Options(num_threads=threads))
    (node,) = [n for nest in kernel.specialize((batch, channels, hw, hw), (channels, 3, 3)).ir.nests
               for n in nest.body if isinstance(n, ContractionNest)]
    assert node.plan.path == "direct"
    if channels % threads == 0:
        assert node.plan.grid == (threads, 1, 1, 1), node.plan.describe()
    check_engine_plans(kernel, threads, (batch, channels, hw, hw), (channels, 3, 3))


NHWC_DEPTHWISE = """
def dw(float(N,H,W,C) I, float(3,3,C) Wt) -> (O) {
    O(n, h, w, c) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                      ? I(n, h + kh - 1, w + kw - 1, c) * Wt(kh, kw, c) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}
"""


@pytest.mark.parametrize("threads", [2, 16, 64, 256])
@pytest.mark.parametrize("hw", [2, 56])
def test_channels_last_depthwise_cells_split_the_pixels(threads, hw):
    """The batch-lanes path (lanes over the channels) splits the pixels between the threads, so
    each reads and writes contiguous rows of channels; the channels only when there are fewer
    pixels than threads (simulated thread counts)."""
    kernel = tcpy.define(NHWC_DEPTHWISE, options=tcpy.Options(num_threads=threads))
    shapes = (1, hw, hw, 256), (3, 3, 256)
    (node,) = [n for nest in kernel.specialize(*shapes).ir.nests for n in nest.body if isinstance(n, ContractionNest)]
    assert node.plan.path == "batch_lanes"
    pixels = hw * hw
    if pixels >= threads:
        assert node.plan.grid == (1, threads, 1, 1), node.plan.describe()
    else:
        assert node.plan.grid == (threads // pixels, pixels, 1, 1), node.plan.describe()
    check_engine_plans(kernel, threads, *shapes)


def test_explain_names_chunks_and_threads():
    # (a fixed target: the register tile, and so the parallel loops, depend on the registers)
    options = tcpy.Options(num_threads=16, contraction=False, target=tcpy.Target.preset("x86-64-v3"))
    text = tcpy.define(demo.CONV2D, options=options).explain((8, 128, 30, 30), (128, 128, 3, 3))
    assert "parallel over f_tile, n, h (" in text and " chunks for 16 threads)" in text


def test_a_serial_kernel_has_no_parallel_loops():
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(num_threads=1))
    assert "parallel over" not in kernel.explain((256, 256), (256, 256))


SPLIT_CASES = {
    "sum": ("def f(float(N) A) -> (S) { S() +=! A(i) }", np.float32, [(300_000,)]),
    "gemv_few_rows": ("def f(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }", np.float32,
                      [(3, 70_001), (70_001,)]),
    "row_max_nan": ("def f(double(M,K) A) -> (y) { y(m) max=! A(m,k) }", np.float64, [(2, 50_000)]),
    "product": ("def f(double(N) A) -> (P) { P() *=! A(i) }", np.float64, [(40_000,)]),
    "int_min": ("def f(int32(M,K) A) -> (y) { y(m) min=! A(m,k) }", np.int32, [(2, 60_000)]),
    "half_sum": ("def f(half(N) A) -> (S) { S() +=! A(i) }", np.float16, [(200_000,)]),
    "accumulate_twice": ("def f(float(N) A) -> (S) { S() +=! A(i)\n S() += 2 * A(i) }", np.float32, [(90_000,)]),
}


@pytest.mark.parametrize("threads", THREADS)
def test_few_long_reductions_are_split(threads):
    # (the contraction engine splits K its own way: test the loop nests' split)
    kernel = tcpy.define(SPLIT_CASES["gemv_few_rows"][0], options=tcpy.Options(num_threads=threads, contraction=False))
    (nest,) = [n for n, _ in plans(kernel, (4, 1_000_000), (1_000_000,))]
    sched = nest.schedule
    assert sched.split is not None and sched.chunks >= min(CHUNKS_PER_THREAD * threads, 1_000_000 // 4096)
    assert "split in" in kernel.explain((4, 1_000_000), (1_000_000,))


@pytest.mark.parametrize("case", sorted(SPLIT_CASES))
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_split_reductions_match_the_reference_and_repeat_exactly(case, threads):
    source, dtype, shapes = SPLIT_CASES[case]
    kernel = tcpy.define(source, options=tcpy.Options(num_threads=threads, contraction=False))
    reference = tcpy.define(source, backend="reference")
    rng = np.random.default_rng(1)
    if dtype == np.int32:
        args = [rng.integers(-1000, 1000, s).astype(dtype) for s in shapes]
    else:
        args = [(rng.random(s) + 0.5).astype(dtype) for s in shapes]
    if case == "product":
        args[0] = (1 + (args[0] - 1) * 1e-4).astype(dtype)  # a product that stays finite
    if case == "row_max_nan":
        args[0][1, 777] = np.nan
    got, want = kernel(*args), reference(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2e-3 if dtype == np.float16 else 1e-4, equal_nan=True)
    for _ in range(3):  # parts combine in a fixed order: the same bits every run
        np.testing.assert_array_equal(kernel(*args), got)
    if threads > 1:
        assert any(n.schedule.split for n, _ in plans(kernel, *args)), "this case should be split"


# the phase merge of a strided read's gradient: an element-wise nest over four output loops
PARITY_MERGE = """
def merge(float(N, C, H, W) like, float(N, C, H2, W2) even, float(N, C, H2, W2) odd) -> (X) {
    X(n, c, h, w) +=! w % 2 == 0 ? even(n, c, h / 2, w / 2) : odd(n, c, h / 2, w / 2)
        where n in 0:N, c in 0:C, h in 0:H, w in 0:W
}"""


@pytest.mark.parametrize("threads, collapsed, chunks", [(2, 2, 40), (7, 3, 960)])
def test_collapse_stops_once_the_chunks_suffice(threads, collapsed, chunks):
    # loops past enough chunks stay out of the collapse (they keep their own counters); the
    # merge runs split by the parity of w (h, read only as h / 2, keeps its loop)
    kernel = tcpy.define(PARITY_MERGE, options=tcpy.Options(num_threads=threads))
    like, half = (2, 20, 24, 40), (2, 20, 12, 20)
    (nest, _), = plans(kernel, like, half, half)
    assert nest.schedule.phases == (("w", 2),)
    assert (nest.schedule.parallel_dims, nest.schedule.chunks) == (collapsed, chunks), nest.schedule.describe()
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in (like, half, half)]
    got, want = kernel(*args), tcpy.define(PARITY_MERGE, backend="reference")(*args)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape == like
    np.testing.assert_array_equal(got, want)
