"""Statement fusion: which statements fuse (isl dependences decide), results unchanged against
the reference evaluator at several thread counts, temporaries shrunk to per-thread buffers."""
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy import demo
from tcpy.loopir import NestKind
from tcpy.target import Target
from tcpy.transform.contraction import micro_tile

GOOD = Path(__file__).parent / "golden" / "good"
EXAMPLES = int(os.environ.get("TCPY_FUSION_EXAMPLES", "40"))


def fused_groups(kernel, *shapes):
    ir = kernel.specialize(*shapes).ir
    return [n.group for n in ir.nests if n.group is not None], ir.program


def check_against_reference(source, args, threads, rtol=1e-5, atol=1e-6):
    reference = tcpy.define(source, backend="reference")
    kernel = tcpy.define(source, options=tcpy.Options(num_threads=threads))
    got, want = kernel(*args), reference(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def test_softmax_rows_fuse_and_their_temporaries_shrink():
    source = (GOOD / "softmax_temporaries.tc").read_text()
    groups, program = fused_groups(tcpy.define(source), (37, 101))
    (group,) = groups
    assert group.statements == (0, 1, 2, 3) and group.shared == ("n",)
    assert {t for t, _ in group.locals} == {"mx", "e", "s"} and set(program.shrunk) == {"mx", "e", "s"}
    assert "fused S0-S3 over n; per-thread buffers" in tcpy.define(source).explain((37, 101))


def test_batchnorm_fuses_over_channels_wherever_they_are_indexed():
    source = (GOOD / "batchnorm.tc").read_text()
    groups, _ = fused_groups(tcpy.define(source), (8, 16, 10, 10), (16,), (16,), np.float32(0.1), np.float32(1e-5))
    assert [(g.statements, g.shared) for g in groups] == [(tuple(range(9)), ("c",))]


def test_attention_fuses_into_one_chain_over_blocks_of_query_rows():
    shapes = (1, 2, 40, 16), (1, 2, 40, 16), (1, 2, 40, 16), np.float32(0.5)
    kernel = tcpy.define(demo.ATTENTION, options=tcpy.Options(target="x86-64-v3"))  # (a plan: not the host's)
    groups, program = fused_groups(kernel, *shapes)
    (group,) = groups
    assert group.statements == tuple(range(6)) and group.shared == ("b", "h", "l")
    rows, _ = micro_tile(Target.preset("x86-64-v3"), 4)
    assert group.chain is not None and group.chain.block_var == "l" and group.chain.plan.rows % rows == 0
    # P = E / Sm is deferred past the last product: it reads E's block, its rows divided by Sm
    assert [(t, b) for t, b, _ in group.chain.blocked] == [("Sc", "block.0"), ("E", "block.1"), ("Sm", "block.2")]
    assert group.chain.deferred is not None and group.chain.deferred.quotient == "P"
    assert set(program.shrunk) == {"Sc", "Mx", "E", "Sm", "P"}  # no temporary exists at full size
    text = str(kernel.explain(*shapes))
    assert "Sc -> block.0[" in text and "on a block of rows" in text and "why: row block" in text


def test_without_the_engine_attention_fuses_only_the_rows():
    kernel = tcpy.define(demo.ATTENTION, options=tcpy.Options(contraction=False))
    groups, program = fused_groups(kernel, (1, 2, 40, 16), (1, 2, 40, 16), (1, 2, 40, 16), np.float32(0.5))
    (group,) = groups
    assert group.chain is None and len(group.statements) == 4
    assert {t for t, _ in group.locals} == {"Mx", "E", "Sm"}  # P is read by the last product: kept


@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("name, shapes", [
    ("softmax_temporaries", [(37, 101)]),
    ("softmax", [(5, 1031)]),
    ("log_softmax", [(13, 17)]),
    ("layernorm", [(3, 5, 67), (67,), (67,)]),
    ("moments", [(29, 513)]),
    ("batchnorm", [(3, 5, 7, 9), (5,), (5,), (), ()]),
])
def test_fused_kernels_match_the_reference(name, shapes, threads):
    source = (GOOD / f"{name}.tc").read_text()
    rng = np.random.default_rng(3)
    params = tcpy.parse(source).defs[0].params
    args = [rng.standard_normal(s).astype(np.float64 if "double" in str(p.type) else np.float32)
            for s, p in zip(shapes, params)]
    args = [abs(a) + 0.1 if a.ndim == 0 else a for a in args]  # batchnorm's momentum and eps
    check_against_reference(source, args, threads, rtol=2e-5)


@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("b, h, s, d", [(1, 3, 37, 16), (2, 1, 129, 8)])
def test_fused_attention_matches_the_reference(b, h, s, d, threads):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    check_against_reference(demo.ATTENTION, [q, k, v, np.float32(d ** -0.5)], threads, rtol=1e-4)


# Both products read their B operand through an N role of two groups that do not merge (in
# K(b, s, d, t) s and t are not adjacent, in V(b, e, s, t, f) neither are e and f): pack_b looks
# the columns' offsets up in a table, which once lived in the scratch slot of the chain's block
# buffers. The head's table overwrote the first scores of its block between K blocks (D spans
# several), and the tail's, larger than the block buffers, reallocated them under the running
# chain on the first call (a use after free: NaN when the memory was reused).
CHAIN_SPLIT_N = """def f(float(B,L,D) Q, float(B,S,D,T) K, float(B,E,S,T,F) V) -> (O) {
    Sc(b, l, s, t) +=! Q(b, l, d) * K(b, s, d, t)
    Mx(b, l) max=! Sc(b, l, s, t)
    P(b, l, s, t) = exp(Sc(b, l, s, t) - Mx(b, l))
    O(b, l, e, f) +=! P(b, l, s, t) * V(b, e, s, t, f)
}"""


@pytest.mark.parametrize("threads", [1, 2, 7])
def test_a_chain_whose_products_gather_their_columns_matches_the_reference(threads):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 40, 1000)).astype(np.float32) / np.float32(30)
    k = rng.standard_normal((2, 4, 1000, 8)).astype(np.float32)
    v = rng.standard_normal((2, 16, 4, 8, 64)).astype(np.float32)
    (group,), _ = fused_groups(tcpy.define(CHAIN_SPLIT_N), q.shape, k.shape, v.shape)
    assert group.chain is not None and len(group.statements) == 4
    for _ in range(2):  # the first call grows the scratch buffers, the second reuses them
        check_against_reference(CHAIN_SPLIT_N, [q, k, v], threads, rtol=1e-4, atol=1e-4)


NOT_FUSED = {
    # the consumer reads the producer at another point of the shared loop
    "other_point": """def f(float(N,K) A) -> (C) {
        T(i) +=! A(i, k)
        C(i, k) = A(i, k) * T(N - 1 - i)
    }""",
    # the producer's value at i needs all of its reduction over j, which the consumer's i runs in
    "reduction_of_shared": """def f(float(N,N) A) -> (C) {
        T(i) +=! A(j, i)
        C(i, j) = A(i, j) - T(j)
    }""",
    # a later statement overwrites what an earlier one reads at other points
    "anti_dependence": """def f(float(N) A) -> (C, D) {
        C(i) = A(i) + 1
        D(i) = C(N - 1 - i)
        C(i) = A(i) * 2
    }""",
}


@pytest.mark.parametrize("name", sorted(NOT_FUSED))
def test_illegal_fusion_is_not_done_and_results_are_right(name):
    source = NOT_FUSED[name]
    kernel = tcpy.define(source)
    rng = np.random.default_rng(5)
    arg = rng.standard_normal((9, 9) if "N,K" in source or "N,N" in source else (9,)).astype(np.float32)
    groups, _ = fused_groups(kernel, arg)
    assert groups == []
    check_against_reference(source, [arg], 2)


def test_the_same_shape_read_at_the_shared_point_fuses():  # the control for the cases above
    source = NOT_FUSED["other_point"].replace("T(N - 1 - i)", "T(i)")
    groups, program = fused_groups(tcpy.define(source), (9, 9))
    assert [g.statements for g in groups] == [(0, 1)] and program.shrunk == ("T",)
    check_against_reference(source, [np.arange(81, dtype=np.float32).reshape(9, 9)], 2)


def test_fusion_can_be_turned_off():
    source = (GOOD / "softmax_temporaries.tc").read_text()
    kernel = tcpy.define(source, options=tcpy.Options(fuse=False))
    groups, program = fused_groups(kernel, (37, 101))
    assert groups == [] and program.shrunk == ()
    assert all(n.kind is not NestKind.COMPUTE or n.group is None for n in kernel.specialize((37, 101)).ir.nests)


@st.composite
def row_programs(draw):
    """A def of 2-6 statements over rows ``i`` of ``A(N, M)``: row reductions ``Tk(i) op=! X(i, j)``
    and elementwise ``Tk(i, j) = ...`` reading earlier tensors at the row ``i`` (fusable) or at
    ``N - 1 - i`` (not), in chains and diamonds."""
    rows, cols = [], ["A"]  # earlier 1-D (per row) and 2-D tensors
    lines = []
    for k in range(draw(st.integers(2, 6))):
        name = f"T{k}"
        x = draw(st.sampled_from(cols))
        if draw(st.booleans()):
            op = draw(st.sampled_from(["+=!", "max=!", "min=!"]))
            lines.append(f"{name}(i) {op} {x}(i, j)")
            rows.append(name)
        else:
            terms = [f"{x}(i, j)"]
            for y in draw(st.lists(st.sampled_from(rows), max_size=2)) if rows else []:
                terms.append(f"{y}({draw(st.sampled_from(['i', 'N - 1 - i']))})")
            lines.append(f"{name}(i, j) = " + draw(st.sampled_from([" + ", " - ", " * "])).join(terms))
            cols.append(name)
    outputs = [f"T{k}" for k in range(len(lines)) if k == len(lines) - 1 or draw(st.integers(0, 3)) == 0]
    source = f"def f(float(N, M) A) -> ({', '.join(outputs)}) {{\n    " + "\n    ".join(lines) + "\n}"
    shape = (draw(st.sampled_from([1, 2, 5, 13])), draw(st.sampled_from([1, 3, 17, 64])))
    return source, shape, draw(st.sampled_from([1, 2, 7]))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=row_programs())
def test_random_row_programs_match_the_reference(case):
    source, shape, threads = case
    arg = np.random.default_rng(len(source)).standard_normal(shape).astype(np.float32)
    check_against_reference(source, [arg], threads, rtol=1e-4)


def test_generated_names_never_meet_the_users():
    # the C names of generated buffers (local.0 -> x_local_0) and of copies (pack.0 -> x_pack_0)
    source = """def f(float(N, D) I, float(D, N) W) -> (O, P) {
        mx(n) max=! I(n, d)
        x_local_0(n, d) = exp(I(n, d) - mx(n))
        tcpy_part(n) +=! x_local_0(n, d)
        O(n, d) = x_local_0(n, d) / tcpy_part(n)
        P(n, x_pack_0) +=! O(n, d) * W(d, x_pack_0)
    }"""
    rng = np.random.default_rng(6)
    args = [rng.standard_normal((7, 600)).astype(np.float32), rng.standard_normal((600, 7)).astype(np.float32)]
    check_against_reference(source, args, 2, rtol=1e-4)


def test_a_shrunk_temporary_that_is_not_fully_written_reads_zeros():
    # found by the long fuzz run: T(i, 0, 0) is never written (j starts at 1) and must read 0
    source = """def f(float(1,M) A, float(N) B, int32(M) L) -> (float(M) O) {
        T(i,j,k) = float(A(0,0)) where j in 1:M, k in 0:M, exists B(i)
        O(i) = T(i,0,0) + z0 where z0 = A(0,0)
    }"""
    groups, program = fused_groups(tcpy.define(source), (1, 9), (9,), (9,))
    assert [g.zeroed for g in groups] == [("local.0",)]
    args = [np.full((1, 9), 2.5, np.float32), np.ones(9, np.float32), np.zeros(9, np.int32)]
    for _ in range(5):  # stack garbage would show up sooner or later
        check_against_reference(source, args, 2)


def test_a_fully_written_row_buffer_is_not_zeroed():
    source = (GOOD / "softmax_temporaries.tc").read_text()
    (group,), _ = fused_groups(tcpy.define(source), (37, 101))
    assert group.zeroed == ()


def test_a_long_def_fuses_with_dependence_work_linear_in_its_statements(monkeypatch):
    # n statements that all accumulate into O depend on each other pairwise; testing every pair
    # made the first call quadratic (2,000 statements took minutes): now each statement's
    # accesses are tested once against the group's, so n statements build 3n access maps
    from tcpy.transform import fusion
    built = []
    build = fusion.access_map
    monkeypatch.setattr(fusion, "access_map", lambda *args: built.append(args) or build(*args))
    n = 150
    source = ("def f(float(N) A) -> (O) {\n    O(i) = A(i)\n"
              + "".join(f"    O(i) += A(i) * {k % 5}.0\n" for k in range(1, n)) + "}")
    groups, _ = fused_groups(tcpy.define(source), (16,))
    assert [(g.statements, g.shared) for g in groups] == [(tuple(range(n)), ("i",))]
    assert len(built) <= 3 * n
    check_against_reference(source, [np.arange(16, dtype=np.float32)], 2)


def test_a_group_stops_at_the_first_statement_that_reads_another_row():
    # the dependence on S0 is found among the group's accesses however many statements
    # between them touch O
    source = ("def f(float(N) A) -> (O, P) {\n    O(i) = A(i)\n"
              + "".join(f"    O(i) += A(i) * {k}.0\n" for k in range(1, 6))
              + "    P(i) = O(N - 1 - i)\n}")
    groups, _ = fused_groups(tcpy.define(source), (9,))
    assert [g.statements for g in groups] == [tuple(range(6))]
    check_against_reference(source, [np.arange(9, dtype=np.float32)], 2)
