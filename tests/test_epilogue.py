"""Epilogues: element-wise consumers of a contraction run in the engine's store.

Which statements attach (and which must not), what explain() says, and differential tests of
random contractions (from test_contraction's strategy) followed by random chains of
element-wise statements, against the reference evaluator, on every runnable preset (also with
tiny caches: many K blocks, split K, edge tiles) at 1, 2 and 7 threads.
"""
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_contraction as tc
import tcpy
from tcpy.loopir import ContractionNest
from tcpy.target import Target

EXAMPLES = int(os.environ.get("TCPY_EPILOGUE_EXAMPLES", "15"))

GEMM = "C(m, n) +=! A(m, k) * B(k, n)"
PARAMS = "float(M,K) A, float(K,N) B, float(N) bias"


def epilogue_of(src: str, *args):
    nests = tcpy.define(src).specialize(*args).ir.nests
    node = next(n.body[0] for n in nests if n.body and isinstance(n.body[0], ContractionNest))
    return node.epilogue.members if node.epilogue is not None else ()


def _args(m=5, n=7, k=3):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32),
            rng.standard_normal(n, dtype=np.float32))


@pytest.mark.parametrize("body, members", [
    ("Y(i, j) = fmax(C(i, j) + bias(j), 0.0)", (1,)),
    ("Y(j, i) = C(i, j) * 2.0", (1,)),  # another layout of the same elements
    ("Y(i, j) = C(i, j) + bias(j)\n Z(i, j) = tanh(Y(i, j)) + C(i, j)", (1, 2)),
    ("C(i, j) = C(i, j) > 0 ? C(i, j) : 0.1 * C(i, j)", (1,)),  # in place
    ("Y(i, j) = double(C(i, j))", (1,)),
])
def test_element_wise_consumers_attach(body, members):
    returns = ", ".join(sorted({"C", *re.findall(r"^\s*(\w+)\(", body, re.M)}))
    src = f"def f({PARAMS}) -> ({returns}) {{\n {GEMM}\n {body}\n}}"
    assert epilogue_of(src, *_args()) == members
    kernel = tcpy.define(src)
    got = kernel(*_args())
    want = tcpy.define(src, backend="reference")(*_args())
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body", [
    "Y(i, j) = C(i, j) + C(j, i)",  # another element: not finished when (i, j) is stored
    "Y(i, j) = C(i, j) + C(i, 0)",
    "Y(i) +=! C(i, j)",  # a reduction
    "T(i, j) = C(i, j)",  # writes what the contraction reads
    "Y(i, j) = C(i, j) where i in 0:M-1",  # another range
    "Y(i, j) = C(i, j) + bias(int32(C(i, j)) % N)",  # a data-dependent (checked) index
])
def test_what_must_not_attach(body):
    returns = ", ".join(sorted({"C", *re.findall(r"^\s*(\w+)\(", body, re.M)}))
    src = f"def f({PARAMS}) -> ({returns}) {{\n T(m, k) = A(m, k)\n {GEMM.replace('A(', 'T(')}\n {body}\n}}"
    args = _args(6, 6, 6)
    assert epilogue_of(src, *args) == ()
    got = tcpy.define(src)(*args)
    want = tcpy.define(src, backend="reference")(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_fuse_false_keeps_separate_nests_and_explain_names_the_epilogue():
    src = f"def f({PARAMS}) -> (Y) {{\n {GEMM}\n Y(i, j) = fmax(C(i, j) + bias(j), 0.0)\n}}"
    text = str(tcpy.define(src).explain(*_args()))
    assert "epilogue: Y(i, j) = fmax(" in text and "in the store of the last K block" in text
    nests = tcpy.define(src, options=tcpy.Options(fuse=False)).specialize(*_args()).ir.nests
    assert len(nests) == 2 and nests[0].body[0].epilogue is None


FORMS = ("fmax({x}, 0.0)", "{x} * 2.0 + bias({n})", "tanh({x})", "{x} > 0 ? {x} : 0.25 * {x}", "-{x}")


@st.composite
def epilogue_cases(draw):
    case = draw(tc.contractions())
    out = re.search(r"^\s*C\(([^)]*)\) \+=!", case.source, re.M)
    if out is None:  # rank-0 output: nothing element-wise to attach
        return case, 0
    out_vars = [v.strip() for v in out.group(1).split(",")]
    renamed = {v: f"e{i}" for i, v in enumerate(out_vars)}
    at = f"({', '.join(renamed[v] for v in out_vars)})"
    dtype = case.dtype
    lines, outputs, produced = [], ["C"], ["C"]
    params = case.source[case.source.index("(") + 1:case.source.index(") -> (C)")]
    bias = np.random.default_rng(len(case.source)).uniform(-1, 1, 1).astype(np.float32 if case.dtype == "float" else np.float64)
    for s in range(draw(st.integers(1, 3))):
        x = " + ".join(f"{t}{at}" for t in draw(st.lists(st.sampled_from(produced), min_size=1, max_size=2)))
        rhs = draw(st.sampled_from(FORMS)).format(x=f"({x})", n="0")
        if draw(st.integers(0, 4)) == 0 and s == 0:
            target = "C"  # in place
        else:
            target = f"Y{s}"
            produced.append(target)
            outputs.append(target)
        lhs_vars = [renamed[v] for v in out_vars]
        if target != "C":  # (an in-place transposition is order-dependent: not drawn)
            lhs_vars = draw(st.permutations(lhs_vars))
        lines.append(f"    {target}({', '.join(lhs_vars)}) = {rhs}")
    if draw(st.booleans()):
        outputs.remove("C")  # C becomes a temporary
    source = case.source.replace(f"{params}) -> (C)", f"{params}, {dtype}(1) bias) -> ({', '.join(outputs)})")
    source = source.rstrip().rstrip("}") + "\n".join(lines) + "\n}\n"
    case.source, case.args = source, case.args + [bias]
    return case, len(lines)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(drawn=epilogue_cases())
def test_random_epilogues_match_the_reference(drawn):
    case, chain = drawn
    kernel = tcpy.define(case.source, options=tcpy.Options(**case.options))
    ir = kernel.specialize(*case.args).ir
    nodes = [n.body[0] for n in ir.nests if n.body and isinstance(n.body[0], ContractionNest)]
    if chain and nodes and nodes[-1].stmt == len(nodes) - 1:
        # the first drawn statement reads C only at the element it writes: it runs in the last
        # contraction's store, unless range inference gave that contraction less than the whole
        # output (later ones may read an earlier one transposed, which must stay out)
        node, producer = nodes[-1], ir.program.statements[nodes[-1].stmt]
        if all(producer.ranges[e.name] == (0, n) for e, n in zip(producer.stmt.lhs, ir.program.shapes["C"])):
            assert node.epilogue is not None and node.epilogue.members[0] == node.stmt + 1, kernel.loop_ir(*case.args)
    got = kernel(*case.args)
    want = tcpy.define(case.source, backend="reference")(*case.args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    eps = tc.EPS[case.dtype]
    tol = 16 * eps * (case.k_len + 1) * max(1.0, abs(case.scale)) * 2 ** chain
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * case.k_len)


def test_epilogue_after_split_k_and_batched_multi_variable_roles():
    """The combine step of a split K runs the epilogue; batch and merged roles decompose."""
    t = tc.tiny_caches(Target.preset("x86-64"))
    src = """def f(double(M,K) A, double(K,N) B) -> (Y) {
        C(m, n) +=! A(m, k) * B(k, n)
        Y(i, j) = C(i, j) > 0 ? C(i, j) : -1.0
    }"""
    kernel = tcpy.define(src, options=tcpy.Options(target=t, num_threads=7))
    node = kernel.specialize((9, 4000), (4000, 5)).ir.nests[0].body[0]
    assert node.plan.grid[3] > 1 and node.epilogue is not None
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((9, 4000)), rng.standard_normal((4000, 5))
    C = A @ B
    np.testing.assert_allclose(kernel(A, B), np.where(C > 0, C, -1.0), rtol=1e-10, atol=1e-10)
    src = """def f(float(N,C,H,W) I, float(F,C) Wt, float(F) b) -> (O) {
        T(n, f, h, w) +=! I(n, c, h, w) * Wt(f, c)
        O(n, f, h, w) = fmax(T(n, f, h, w) + b(f), 0.0)
    }"""
    I = rng.standard_normal((2, 5, 3, 7), dtype=np.float32)
    Wt = rng.standard_normal((4, 5), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    kernel = tcpy.define(src)
    assert kernel.specialize(I, Wt, b).ir.nests[0].body[0].epilogue is not None
    want = np.maximum(np.einsum("nchw,fc->nfhw", I, Wt) + b[None, :, None, None], 0)
    np.testing.assert_allclose(kernel(I, Wt, b), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, window", [(1, 1), (1, 3), (3, 1)])
def test_epilogue_reads_variables_of_one_value(n, window):
    """A batch of one image or a 1x1 window gives the engine no role for that variable; the
    epilogue still sees its value (here in the bias's index and the output's)."""
    src = """def f(float(N,C,H,W) I, float(F,C,KH,KW) Wt, float(N,F) b) -> (O) {
        T(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
        O(n, f, h, w) = fmax(T(n, f, h, w) + b(n, f), 0.0)
    }"""
    rng = np.random.default_rng(n * 10 + window)
    I = rng.standard_normal((n, 5, 9, 11), dtype=np.float32)
    Wt = rng.standard_normal((6, 5, window, window), dtype=np.float32)
    b = rng.standard_normal((n, 6), dtype=np.float32)
    kernel = tcpy.define(src)
    assert kernel.specialize(I, Wt, b).ir.nests[0].body[0].epilogue is not None
    want = tcpy.define(src, backend="reference")(I, Wt, b)
    np.testing.assert_allclose(kernel(I, Wt, b), want, rtol=1e-5, atol=1e-5)
