"""Planning a new call shape of a size-generic kernel: its shortcuts (bounds evaluated without
isl, the L1 sets a B sliver crowds counted with NumPy and kept per sizes, a plan buffer's tables
read from their dimensions) give what the direct computations give, and shapes that share a
kept result run as the reference evaluator does."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.demo import ATTENTION, CONV2D, GEMM, padded_conv2d_source
from tcpy.ranges.index_values import check_index_results
from tcpy.ranges.isl_helpers import value_at
from tcpy.target import Target
from tcpy.transform.contraction import _sliver_lines_per_set
from tcpy.contraction_ir import RUNTIME_FIELDS, Path, Plan, cached, direct_init
from tcpy.transform.runtime_plan import assemble, _joined, _nonzero, _offsets, _section, _unit_run, _zeros_like, field

# a guarded read, a range of floor bounds (stride 2: isl evaluates those) and a depthwise window
DEFS = (GEMM, CONV2D, ATTENTION, padded_conv2d_source(3, 2, 1), padded_conv2d_source(5, 1, 2, depthwise=True))


@pytest.mark.parametrize("source", DEFS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_bound_ranges_and_shapes_are_isl_s_values(source, data):
    ranges = tcpy.define(source).ranges
    values = st.one_of(st.sampled_from((0, 1, 2, 3, 7)), st.integers(0, 5000))
    sizes = {name: data.draw(values, label=name) for name in ranges.size_vars}
    try:
        bound = ranges.bind(sizes)
    except tcpy.TCError:
        return  # (sizes its preconditions reject)
    point = ranges.size_point(sizes)
    for stmt, got in zip(ranges.statements, bound.statements):
        for var, vr in stmt.ranges.items():
            lo, hi = value_at(vr.lo_isl, point), value_at(vr.hi_isl, point)
            assert got[var] == ((0, 0) if lo is None or hi is None or hi <= lo else (lo, hi))
    for name, dims in ranges.shapes_isl.items():
        assert bound.shapes[name] == tuple(value_at(d, point) or 0 for d in dims)


def test_sizes_are_checked_as_before():
    ranges = tcpy.define(GEMM).ranges
    with pytest.raises(tcpy.TCShapeError, match="no value for size K"):
        ranges.bind({"M": 2, "N": 3})
    with pytest.raises(tcpy.TCShapeError, match="size N must be an integer >= 0, got -1"):
        ranges.bind({"M": 2, "N": -1, "K": 3})


@pytest.mark.parametrize("preset", ["x86-64-v3", "x86-64-v4"])
@settings(max_examples=60, deadline=None)
@given(stride=st.integers(-5000, 5000), rows=st.integers(1, 300), row_bytes=st.sampled_from((4, 64, 100, 192, 256)))
def test_a_sliver_s_lines_per_l1_set_count_each_line_once(preset, stride, rows, row_bytes):
    target = Target.preset(preset)
    line = target.cache_line
    sets = target.l1d // (target.l1d_ways * line)
    lines = {index for row in range(rows)
             for index in range(row * stride // line, row * stride // line + -(-row_bytes // line) + 1)}
    per_set = [0] * sets
    for index in lines:
        per_set[index % sets] += 1
    assert _sliver_lines_per_set(stride, rows, row_bytes, target) == max(per_set)


@pytest.mark.skipif(not Target.preset("x86-64-v3").can_run_here(), reason="needs AVX2")
def test_shapes_that_share_the_small_path_s_planning_run_as_the_reference(builds):
    """Shapes of one N and K (the same count of crowded L1 sets and micro-tile, kept once
    computed) and of other rows, with B's slivers copied and read in place."""
    kernel = tcpy.define(GEMM, options=tcpy.Options(specialize="never", target="x86-64-v3", num_threads=1))
    reference = tcpy.define(GEMM, backend="reference")
    rng = np.random.default_rng(3)
    for n, how in ((512, "read in place, each B sliver copied;"), (16, "read in place;")):
        for m in (25, 70, 25):
            a = rng.standard_normal((m, 64)).astype(np.float32)
            b = rng.standard_normal((64, n)).astype(np.float32)
            got = kernel(a, b)
            assert got.shape == (m, n) and got.dtype == np.float32
            np.testing.assert_allclose(got, reference(a, b), rtol=1e-4, atol=1e-4)
            assert f"run-time engine (small path: A and B {how}" in kernel.explain(a, b)
    assert len(builds) == 1


# int32 index values: a product of sizes and variables, a sum, a quotient and a remainder
INDEX_VALUES = """
def f(int32(N,M) X) -> (Y) {
    Y(i, j) = X(i, j) + i * M + j - N / (j + 1) + (i + 7) % M
}
"""


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2**31 - 1), m=st.integers(1, 2**31 - 1))
def test_a_bind_raises_exactly_where_an_index_value_leaves_int32(n, m):
    """Binding skips the index values' check at sizes too small for any to overflow: it raises
    where the check does, with its message."""
    ranges = tcpy.define(INDEX_VALUES).ranges
    sizes = {"N": n, "M": m}
    point = ranges.size_point(sizes)
    bound = ranges.evaluate(sizes, point)
    try:
        check_index_results(ranges.def_, ranges.statements, bound.statements, sizes, bound.shapes)
        expected = None
    except tcpy.TCPreconditionError as error:
        expected = str(error)
    if expected is None:
        assert ranges.bind(sizes) == bound
    else:
        with pytest.raises(tcpy.TCPreconditionError) as raised:
            ranges.bind(sizes)
        assert str(raised.value) == expected


def _counted(dims):
    """Each linear index's offset, counted out (outer dimension first)."""
    offsets = [0]
    for extent, stride in dims:
        offsets = [o + stride * i for o in offsets for i in range(extent)]
    return offsets


def _run_from(offsets, i):
    """The length and step of the run of equal steps of 1 or 2 from index ``i`` (1, 1: none)."""
    step = offsets[i + 1] - offsets[i] if i + 1 < len(offsets) else 0
    if step not in (1, 2):
        return 1, 1
    end = i
    while end + 1 < len(offsets) and offsets[end + 1] - offsets[end] == step:
        end += 1
    return end - i + 1, step


@settings(max_examples=300, deadline=None)
@given(dims=st.lists(st.tuples(st.integers(0, 6), st.sampled_from((0, 1, 2, 3, -1, -2, 4, 5, 12))), max_size=3),
       const=st.sampled_from((0, 5, -3)), width=st.integers(1, 5))
def test_a_plan_buffer_s_tables_are_the_counted_out_offsets(dims, const, width):
    dims = tuple(dims)
    offsets = [const + o for o in _counted(dims)]
    tables = {"b_n": _offsets(dims, const), "g_k": _joined([_zeros_like(_offsets(dims)), _offsets(dims, const)]),
              "b_runs": ("runs", "b_n", width), "b_segments": ("segments", "b_n"), "c_runs": ("values", (7, 8))}
    # (written at 3 in a larger buffer: its positions, and the tables runs and segments read, from there)
    buffer = assemble([_section(RUNTIME_FIELDS, {"nr": width}, tables, 0)],
                      np.full(3 + len(RUNTIME_FIELDS) + 4 * len(offsets) + -(-len(offsets) // width) + 2, -9), 3)
    assert buffer[:3].tolist() == [-9] * 3
    buffer = buffer[3:]
    assert buffer[field("nr")] == width

    def table(name, length):
        at = buffer[field(f"{name}_table")]
        return buffer[at:at + length].tolist()

    assert table("b_n", len(offsets)) == offsets
    assert table("g_k", 2 * len(offsets)) == [0] * len(offsets) + offsets
    assert _nonzero(_offsets(dims, const)) == any(offsets)
    assert table("c_runs", 2) == [7, 8]
    steps = [b - a for a, b in zip(offsets, offsets[1:])]
    if all(extent for extent, _ in dims):  # (a plan's tables have no empty dimension: planned with 1)
        assert _unit_run(dims) == all(s == 1 for s in steps)
    blocks = range(-(-len(offsets) // width))
    assert table("b_runs", len(blocks)) == [int(all(s == 1 for s in steps[b * width:(b + 1) * width - 1]))
                                            for b in blocks]
    runs = [_run_from(offsets, i) for i in range(len(offsets))]
    assert table("b_segments", len(offsets)) == [length * 4 + step for length, step in runs]
    assert len(buffer) == len(RUNTIME_FIELDS) + 4 * len(offsets) + len(blocks) + 2


def test_direct_init_builds_what_the_dataclass_init_builds():
    """direct_init's __init__ (planning's fast one) against the one dataclasses writes: the same
    fields, defaults (a factory's too), keyword-only fields, __post_init__, errors and frozenness."""
    def declare():
        @dataclasses.dataclass(frozen=True)
        class Point:
            x: int
            y: int = 2
            tags: list = dataclasses.field(default_factory=list)
            unit: str = dataclasses.field(default="m", kw_only=True)

            def __post_init__(self):
                object.__setattr__(self, "x", int(self.x))
        return Point

    slow, fast = declare(), direct_init(declare())
    for args, kwargs in (((1.5,), {}), ((1, 5), {"unit": "km"}), ((3,), {"tags": ["a"], "y": 0})):
        a, b = slow(*args, **kwargs), fast(*args, **kwargs)
        assert dataclasses.astuple(a) == dataclasses.astuple(b) and a.x == b.x == int(args[0])
    first, second = fast(1), fast(1)
    assert first.tags == [] and first.tags is not second.tags  # (a factory's value per instance)
    for args, kwargs in (((), {}), ((1, 2, (), "m"), {}), ((1,), {"z": 0})):
        with pytest.raises(TypeError) as slow_error:
            slow(*args, **kwargs)
        with pytest.raises(TypeError) as fast_error:
            fast(*args, **kwargs)
        assert str(fast_error.value).split("() ", 1)[1] == str(slow_error.value).split("() ", 1)[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast(1).x = 2
    plan = Plan("packed", 4, 32, 16, 256, 64, 512, 4, (1, 1, 1, 1), 1, (), cache_line=64)
    assert plan.path is Path.PACKED and dataclasses.replace(plan, mr=8).mr == 8
    assert dataclasses.replace(plan) == plan and hash(dataclasses.replace(plan)) == hash(plan)
    assert dataclasses.replace(plan, mr=8) != plan


def test_cached_values_are_computed_once_per_instance():
    class Counted:
        calls = 0

        def __init__(self, n):
            self.n = n

        @cached
        def square(self):
            """n squared."""
            Counted.calls += 1
            return self.n * self.n

    one, two = Counted(3), Counted(4)
    assert (one.square, one.square, two.square) == (9, 9, 16) and Counted.calls == 2
    assert Counted.square.__doc__ == "n squared." and vars(one)["square"] == 9


def test_direct_init_refuses_fields_outside_init():
    @dataclasses.dataclass(frozen=True)
    class Counted:
        n: int
        seen: int = dataclasses.field(default=0, init=False)

    with pytest.raises(TypeError, match="Counted.seen: direct_init takes only fields of __init__"):
        direct_init(Counted)
