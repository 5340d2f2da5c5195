"""Range inference: TC's documented examples, the issue's cases, shapes, errors, zero sizes."""
import islpy as isl
import pytest

import tcpy
from tcpy.errors import TCPreconditionError, TCRangeError
from tcpy.ranges import explain, format_expr, infer


def ranges(src):
    return infer(tcpy.parse(src).defs[0], src)


def symbolic(dr, k=0):
    """{var: (lo, hi, kind)} of statement k, bounds printed in TC syntax."""
    return {v: (format_expr(r.lo), format_expr(r.hi), r.kind) for v, r in dr.statements[k].ranges.items()}


def shape(dr, name):
    return tuple(format_expr(d) for d in dr.shapes[name])


# ----------------------------------------------------------------------------- TC's documented examples


def test_matmul():
    dr = ranges("def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")
    assert symbolic(dr) == {"m": ("0", "M", "output"), "n": ("0", "N", "output"), "k": ("0", "K", "reduction")}
    assert shape(dr, "C") == ("M", "N")
    assert dr.preconditions == ()
    bound = dr.bind({"M": 3, "K": 4, "N": 5})
    assert bound.shapes == {"C": (3, 5)}
    assert bound.statements[0] == {"m": (0, 3), "n": (0, 5), "k": (0, 4)}


def test_stencil_from_tc_docs_starts_at_two():
    dr = ranges("def f(float(N) B, float(P) C) -> (A) { A(i) = B(i) + C(i - 2) }")
    assert symbolic(dr) == {"i": ("2", "min(N, P + 2)", "output")}
    bound = dr.bind({"N": 6, "P": 10})
    assert bound.statements[0]["i"] == (2, 6) and bound.shapes["A"] == (6,)  # A(0), A(1) stay zero
    assert dr.bind({"N": 6, "P": 1}).shapes["A"] == (3,)


def test_inverted_indexing():
    dr = ranges("def reverted(float(I) B) -> (A) { A(i) = B(10 - i) }")
    assert symbolic(dr) == {"i": ("11 - I", "11", "output")}
    assert shape(dr, "A") == ("11",)
    assert dr.bind({"I": 5}).statements[0]["i"] == (6, 11)
    assert dr.bind({"I": 5}).shapes["A"] == (11,)  # A(0..5) stay zero
    assert dr.bind({"I": 11}).statements[0]["i"] == (0, 11)


def test_inverted_indexing_output_below_zero_is_a_precondition():
    dr = ranges("def reverted(float(I) B) -> (A) { A(i) = B(10 - i) }")
    with pytest.raises(TCPreconditionError) as info:
        dr.bind({"I": 12})
    msg = str(info.value)
    assert "def 'reverted'" in msg and "I=12" in msg
    assert "output index 'i' of A(i) would range over -1 <= i < 11 (11 - I <= i < 11)" in msg
    assert "I <= 11" in msg


@pytest.mark.parametrize("size,expected", [(0, 0), (1, 1), (4, 2), (5, 3), (6, 3)])
def test_stride_two_rounds_up(size, expected):
    dr = ranges("def subsample_2(float(I) B) -> (A) { A(i) = B(2*i) }")
    assert symbolic(dr) == {"i": ("0", "(I + 1)/2", "output")}
    assert dr.bind({"I": size}).shapes["A"] == (expected,)


@pytest.mark.parametrize("size,expected", [(0, 0), (1, 0), (4, 2), (5, 2), (7, 3)])
def test_stride_two_with_offsets_intersects(size, expected):
    dr = ranges("def average_pool_2(float(I) B) -> (A) { A(i) = B(2*i) + B(2*i + 1) }")
    assert symbolic(dr) == {"i": ("0", "I/2", "output")}
    assert dr.bind({"I": size}).shapes["A"] == (expected,)


def test_stride_two_with_where_range_for_all_values():
    dr = ranges("def average_pool_2(float(I) B) -> (A) { A(i) +=! B(2*i + k) where k in 0:2 }")
    assert symbolic(dr) == {"i": ("0", "I/2", "output"), "k": ("0", "2", "reduction")}
    assert dr.statements[0].ranges["k"].origin == "where k in 0:2"


def test_stencil_rounds():
    dr = ranges("def conv1d(float(I) B, float(K) W) -> (A) { A(i) +=! B(i + k) * W(k) }")
    assert symbolic(dr) == {"i": ("0", "I - K + 1", "output"), "k": ("0", "K", "reduction")}
    assert dr.statements[0].ranges["k"].origin == "W(k) (round 1)"
    assert dr.statements[0].ranges["i"].origin == "B(i + k) (round 2)"
    assert dr.bind({"I": 10, "K": 3}).shapes["A"] == (8,)
    assert dr.bind({"I": 3, "K": 3}).shapes["A"] == (1,)
    assert dr.bind({"I": 2, "K": 3}).shapes["A"] == (0,)  # kernel larger than input: empty


def test_constant_fill_with_exists():
    dr = ranges("def constant_fill(float(N) A, float c) -> (B) { B(i) = c where exists A(i) }")
    assert symbolic(dr) == {"i": ("0", "N", "output")}
    assert dr.bind({"N": 6}).shapes["B"] == (6,)


def test_lut_index_is_checked_at_run_time():
    dr = ranges("def lut(float(J) B, int32(I) C) -> (A) { A(i) = B(C(i)) }")
    assert symbolic(dr) == {"i": ("0", "I", "output")}
    assert [str(a) for a in dr.statements[0].runtime_checked] == ["B(C(i))"]
    assert dr.preconditions == ()


# ----------------------------------------------------------------------------- convolutions and pooling


def test_strided_conv_nchw():
    dr = ranges("""def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(m, c, kh, kw)
    }""")
    sym = symbolic(dr)
    assert sym["h"] == ("0", "(H - KH)/2 + 1", "output")
    assert sym["w"] == ("0", "(W - KW)/2 + 1", "output")
    assert sym["kh"] == ("0", "KH", "reduction") and sym["c"] == ("0", "C", "reduction")
    assert shape(dr, "O") == ("N", "M", "(H - KH)/2 + 1", "(W - KW)/2 + 1")
    for h in range(3, 12):
        sizes = dict(N=2, C=3, H=h, W=9, M=4, KH=3, KW=2)
        assert dr.bind(sizes).shapes["O"] == (2, 4, (h - 3) // 2 + 1, (9 - 2) // 2 + 1)
    assert dr.preconditions == ()


def test_strided_conv_nhwc_stride_three():
    dr = ranges("""def conv(float(N,H,W,C) I, float(KH,KW,C,M) Wt) -> (O) {
        O(n, h, w, m) +=! I(n, 3*h + kh, 3*w + kw, c) * Wt(kh, kw, c, m)
    }""")
    assert shape(dr, "O") == ("N", "(H - KH)/3 + 1", "(W - KW)/3 + 1", "M")
    assert dr.bind(dict(N=1, H=10, W=8, C=2, KH=3, KW=3, M=5)).shapes["O"] == (1, 3, 2, 5)


def test_padded_conv_with_where_and_guard_has_no_preconditions():
    dr = ranges("""def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
            ? I(n, c, h + kh - 1, w + kw - 1) * Wt(m, c, kh, kw) : 0.0
            where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
    }""")
    sym = symbolic(dr)
    assert sym["h"] == ("0", "H", "output") and sym["kh"] == ("0", "KH", "reduction")
    assert sym["n"] == ("0", "N", "output") and sym["c"] == ("0", "C", "reduction")
    assert dr.preconditions == ()  # the guard keeps the reads of I in bounds
    assert dr.bind(dict(N=1, C=2, H=5, W=6, M=3, KH=3, KW=3)).shapes["O"] == (1, 3, 5, 6)


def test_padded_conv_without_guard_is_a_precondition_on_both_sides():
    dr = ranges("""def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw)
            where h in 0:H - 2, w in 0:W - 2, kh in 0:KH, kw in 0:KW
    }""")
    assert [p.text for p in dr.preconditions] == ["I(n, c, h + kh, w + kw)"]
    ok = dict(N=1, C=1, H=6, W=6, M=1, KH=3, KW=3)
    assert dr.bind(ok).shapes["O"] == (1, 1, 4, 4)
    with pytest.raises(TCPreconditionError) as info:
        dr.bind(dict(ok, KH=4))
    msg = str(info.value)
    assert "I(n, c, h + kh, w + kw) reads out of bounds of I (shape (1, 1, 6, 6))" in msg
    assert "index 2 (h + kh) takes values 0..6" in msg
    assert "N=1, C=1, H=6, W=6, M=1, KH=4, KW=3" in msg


def test_ternary_padding_in_inference_follows_tc():
    # TC counts accesses in ternary branches: without `kh in 0:KH` the read of I fixes kh (with
    # a warning, see below); kw comes from Wt, and w from I's unguarded index: no warning.
    with pytest.warns(tcpy.TCWarning) as caught:
        dr = ranges("""def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H) ? I(n, c, h + kh - 1, w + kw) * Wt(m, c, kh, kw) : 0.0
            where h in 0:H
    }""")
    assert symbolic(dr)["kh"] == ("1", "min(2, KH)", "reduction")
    assert symbolic(dr)["kw"] == ("0", "KW", "reduction")
    assert [str(w.message).split("'")[3] for w in caught] == ["kh"]


PADDED_CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n, f, h, w) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
        ? I(n, c, h + kh - 1, w + kw - 1) * W1(f, c, kh, kw) : 0
        where h in 0:H, w in 0:W%s
}"""


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_padded_convolution_without_its_where_clause_warns_at_define_time(backend):
    """Issue 34, item 5: the guarded read narrows kh and kw to [1, 2): a 1x1 convolution with the
    centre tap, silently. Each variable gets a warning naming the read and the fix."""
    with pytest.warns(tcpy.TCWarning) as caught:
        tcpy.define(PADDED_CONV % "", backend=backend)
    assert [str(w.message) for w in caught] == [
        f"line 2: in def 'conv': index variable '{v}' gets the range 1 <= {v} < min(2, K{v[1].upper()}) "
        f"from I(n, c, h + kh - 1, w + kw - 1), a read its ?: guard keeps in bounds (TC's range rule counts it "
        f"anyway), while the other accesses allow 0 <= {v} < K{v[1].upper()}; if the guard is padding, give the "
        f"range: `where {v} in 0:K{v[1].upper()}`" for v in ("kh", "kw")]


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_padded_convolution_with_its_where_clause_is_a_same_convolution(backend):
    import warnings

    import numpy as np
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conv = tcpy.define(PADDED_CONV % ", kh in 0:KH, kw in 0:KW", backend=backend)
    rng = np.random.default_rng(0)
    I, W1 = rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((3, 2, 3, 3))
    I, W1 = I.astype(np.float32), W1.astype(np.float32)
    padded = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.einsum("nchwij,fcij->nfhw", np.lib.stride_tricks.sliding_window_view(padded, (3, 3), (2, 3)), W1)
    np.testing.assert_allclose(conv(I, W1), want, rtol=1e-5, atol=1e-5)


def test_a_guard_that_drops_the_first_output_element_warns():
    # O(0) would never be computed: B allows i = 0, the read of X that i > 0 guards does not
    with pytest.warns(tcpy.TCWarning, match=r"index variable 'i' gets the range 1 <= i < N from X\(i - 1\).* "
                                            r"`where i in 0:N`"):
        ranges("def f(float(N) B, float(N) X) -> (O) { O(i) = B(i) + (i > 0 ? X(i - 1) : 0.0) }")


@pytest.mark.parametrize("src", [
    # the guard keeps I in bounds but the where clause already gives kh and kw
    PADDED_CONV % ", kh in 0:KH, kw in 0:KW",
    # a guarded read that narrows nothing
    "def f(float(N) A, float(N) B) -> (O) { O(i) = B(i) + (i < N ? A(i) : 0.0) }",
    # a guard that does not protect the index that narrows (the unguarded rule, as TC)
    "def f(float(N) A, float(N) B) -> (O) { O(i) +=! (i > 1) ? A(i + k) * B(k) : 0.0 }",
])
def test_no_padding_warning_when_nothing_guarded_narrows(src):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ranges(src)


def test_max_pooling():
    dr = ranges("""def maxpool(float(N,C,H,W) I) -> (O) {
        O(n, c, h, w) max=! I(n, c, 2*h + kh, 2*w + kw) where kh in 0:2, kw in 0:2
    }""")
    assert shape(dr, "O") == ("N", "C", "H/2", "W/2")
    assert dr.bind(dict(N=1, C=2, H=7, W=6)).shapes["O"] == (1, 2, 3, 3)


def test_constant_dims_in_signature():
    dr = ranges("def f(float(N,C,H,W) I, float(M,C,3,3) Wt) -> (O) "
                "{ O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw) }")
    assert shape(dr, "O") == ("N", "M", "H - 2", "W - 2")
    dr = ranges("def f(float(3,N) B) -> (A) { A(i, j) = B(i, j) }")
    assert shape(dr, "A") == ("3", "N")
    assert dr.bind({"N": 4}).shapes["A"] == (3, 4)


# ----------------------------------------------------------------------------- several statements


def test_transpose():
    dr = ranges("def t(float(M,N) B) -> (A) { A(j, i) = B(i, j) }")
    assert shape(dr, "A") == ("N", "M")
    assert dr.bind({"M": 2, "N": 3}).shapes["A"] == (3, 2)


def test_batched_transpose_three_dims():
    dr = ranges("def t(float(B,M,N) X) -> (Y) { Y(b, n, m) = X(b, m, n) }")
    assert dr.bind({"B": 2, "M": 3, "N": 4}).shapes["Y"] == (2, 4, 3)


def test_reads_of_temporaries_and_outputs():
    dr = ranges("""def f(float(M,K) A, float(K,N) B) -> (D) {
        C(m, n) +=! A(m, k) * B(k, n)
        D(m) +=! C(m, n)
    }""")
    assert symbolic(dr, 1) == {"m": ("0", "M", "output"), "n": ("0", "N", "reduction")}
    assert dr.bind({"M": 2, "K": 3, "N": 4}).shapes == {"D": (2,), "C": (2, 4)}
    dr = ranges("""def f(float(M) A) -> (O) {
        T(i) = A(i)
        O(i) = T(i) + T(i + 1)
    }""")
    assert shape(dr, "O") == ("M - 1",)
    assert dr.bind({"M": 5}).shapes == {"O": (4,), "T": (5,)}


def test_dim_ref_of_earlier_tensor_in_where():
    dr = ranges("""def f(float(M) A) -> (O) {
        T(i) = A(2 * i)
        O(i) = T(i) where i in 0:T.0
    }""")
    assert symbolic(dr, 1) == {"i": ("0", "(M + 1)/2", "output")}
    assert dr.preconditions == ()


def test_second_write_is_bounded_by_the_tensor():
    dr = ranges("""def f(float(N) A, float(P) B) -> (O) {
        O(i) = A(i)
        O(i) += B(i)
    }""")
    assert symbolic(dr, 1) == {"i": ("0", "min(N, P)", "output")}
    assert dr.bind({"N": 3, "P": 5}).statements[1]["i"] == (0, 3)
    assert shape(dr, "O") == ("N",)


def test_typed_return_bounds_the_left_side():
    dr = ranges("def f(float(N) A) -> (float(N) O) { O(i) = 2.0 where exists A(0) }")
    assert symbolic(dr) == {"i": ("0", "N", "output")}
    assert dr.statements[0].ranges["i"].origin == "O(i) (round 1)"


def test_reduction_over_all_dims_gives_rank_0():
    dr = ranges("def s(float(M,N) A) -> (S) { S +=! A(i, j) }")
    assert symbolic(dr) == {"i": ("0", "M", "reduction"), "j": ("0", "N", "reduction")}
    assert dr.shapes["S"] == ()
    assert dr.bind({"M": 2, "N": 3}).shapes["S"] == ()


def test_domain_is_an_isl_set_over_sizes_and_index_vars():
    dr = ranges("def conv1d(float(I) B, float(K) W) -> (A) { A(i) +=! B(i + k) * W(k) }")
    dom = dr.statements[0].domain
    assert dom.dim(isl.dim_type.set) == 2
    assert dom.get_var_names(isl.dim_type.param) == ["I", "K"]
    fixed = dom.intersect_params(isl.Set("[I, K] -> { : I = 5 and K = 2 }"))
    assert fixed.count_val().to_python() == 4 * 2


# ----------------------------------------------------------------------------- preconditions


def test_unused_access_becomes_precondition():
    src = """def f(float(N) B, float(P) C, float(M) D) -> (A) {
        A(i, j) = B(i) * C(i + j) * D(j)
    }"""
    dr = ranges(src)
    assert symbolic(dr) == {"i": ("0", "N", "output"), "j": ("0", "M", "output")}
    (pre,) = dr.preconditions
    assert pre.text == "C(i + j)" and pre.span.line == 2 and pre.kind == "access"
    assert dr.bind({"N": 3, "P": 5, "M": 3}).shapes["A"] == (3, 3)  # P = N + M - 1: just fits
    with pytest.raises(TCPreconditionError) as info:
        dr.bind({"N": 3, "P": 4, "M": 3})
    msg = str(info.value)
    assert msg.startswith("in def 'f', line 2: with sizes N=3, P=4, M=3, C(i + j) reads out of bounds of C")
    assert "index 0 (i + j) takes values 0..4" in msg
    assert msg.endswith("(these sizes must satisfy N + M <= P + 1)")
    # with an empty domain nothing is read
    assert dr.bind({"N": 0, "P": 0, "M": 3}).shapes["A"] == (0, 3)


def test_where_range_reading_out_of_bounds_when_sizes_are_known():
    dr = ranges("def f(float(N) B, float(M) C) -> (A) { A(i) = B(i) + C(i) where i in 0:M }")
    assert [p.text for p in dr.preconditions] == ["B(i)"]
    assert dr.bind({"N": 5, "M": 5}).shapes["A"] == (5,)
    assert dr.bind({"N": 5, "M": 4}).shapes["A"] == (4,)
    with pytest.raises(TCPreconditionError, match=r"B\(i\) reads out of bounds of B \(shape \(5,\)\): "
                                                  r"index 0 \(i\) takes values 0..5"):
        dr.bind({"N": 5, "M": 6})


def test_preconditions_isl_proves_are_dropped():
    assert ranges("def f(float(N) B) -> (A) { A(i) = B(i) + B(i) * B(N - 1 - i) }").preconditions == ()
    assert ranges("def f(float(N) B) -> (A) { A(i) = B(i) where i in 0:N }").preconditions == ()
    assert ranges("def f(float(N) B) -> (A) { A(i) = i > 0 ? B(i - 1) : 0.0 where i in 0:N }").preconditions == ()


def test_bind_rejects_missing_or_negative_sizes():
    dr = ranges("def f(float(N) B) -> (A) { A(i) = B(i) }")
    with pytest.raises(tcpy.TCShapeError, match="no value for size N"):
        dr.bind({})
    with pytest.raises(tcpy.TCShapeError, match="size N must be an integer >= 0, got -1"):
        dr.bind({"N": -1})


# ----------------------------------------------------------------------------- zero sizes


def test_zero_sizes():
    dr = ranges("def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")
    bound = dr.bind({"M": 2, "K": 0, "N": 3})
    assert bound.shapes["C"] == (2, 3)  # zeros: sum over an empty range
    assert bound.statements[0]["k"] == (0, 0)
    assert dr.bind({"M": 0, "K": 4, "N": 3}).shapes["C"] == (0, 3)
    dr = ranges("def conv1d(float(I) B, float(K) W) -> (A) { A(i) +=! B(i + k) * W(k) }")
    assert dr.bind({"I": 5, "K": 0}).shapes["A"] == (0,)  # i depends on the empty range of k
    dr = ranges("def reverted(float(I) B) -> (A) { A(i) = B(10 - i) }")
    assert dr.bind({"I": 0}).shapes["A"] == (0,)


# ----------------------------------------------------------------------------- errors


def check_error(src, message, line, column):
    with pytest.raises(TCRangeError) as info:
        ranges(src)
    err = info.value
    assert err.message == message
    assert (err.line, err.column) == (line, column)
    assert err.def_name == "f"
    return err


def test_unbounded_variable_asks_for_where():
    err = check_error("def f(float(N) B) -> (A) {\n  A(i) +=! B(i) * k\n}",
                      "cannot infer the range of index variable 'k' (no tensor access bounds it); "
                      "add a range with a where clause, e.g. `where k in 0:<hi>`", 2, 3)
    assert str(err).startswith("<string>:2:3: error: in def 'f': cannot infer")
    assert str(err).endswith("\n      A(i) +=! B(i) * k\n      ^~~~~~~~~~~~~~~~~")


def test_variables_that_only_appear_together():
    check_error("def f(float(I) B) -> (A) { A(i) +=! B(i + k) }",
                "cannot infer the range of index variable 'i' (it only appears together with other unresolved "
                "variables, in B(i + k)); add a range with a where clause, e.g. `where i in 0:I`", 1, 28)


def test_range_depending_on_tensor_values():
    check_error("def f(float(I) B, int32(1) S) -> (A) { A(i) = B(S(0)*i) }",
                "the range of 'i' depends on tensor values (in B(S(0) * i)); give it with a where clause, "
                "e.g. `where i in 0:I`", 1, 47)


def test_inconsistent_constraints():
    check_error("def f(float(N) B) -> (A) { A(i) = B(i) where i in 5:3 }",
                "inconsistent constraints on 'i': 5 <= i < 3 is empty for all sizes", 1, 46)
    check_error("def f(float(N) B) -> (A) { A(i) = B(i) + B(-i - 1) }",
                "inconsistent constraints on 'i': 0 <= i < 0 is empty for all sizes", 1, 28)


def test_output_index_below_zero():
    check_error("def f(float(I) B) -> (A) { A(i) = B(i + 1) }",
                "output index 'i' of A ranges over -1 <= i < I - 1, which starts below 0; output indices "
                "start at 0: restrict it, e.g. `where i in 0:I - 1`", 1, 28)


def test_output_index_starting_above_zero_is_fine():
    dr = ranges("def f(float(I) B) -> (A) { A(i) = B(i - 1) }")
    assert symbolic(dr) == {"i": ("1", "I + 1", "output")}
    assert dr.bind({"I": 4}).shapes["A"] == (5,)  # A(0) is never written and stays zero


def test_where_range_always_out_of_bounds():
    check_error("def f(float(I) B) -> (A) { A(i) = B(i) where i in 0:I+1 }",
                "B(i) reads out of bounds of B (shape (I,)) for all sizes when 0 <= i < I + 1", 1, 35)


# ----------------------------------------------------------------------------- explain


def test_explain_symbolic_and_bound():
    dr = ranges("""def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(m, c, kh, kw)
    }""")
    text = explain(dr)
    assert "output     0 <= h < (H - KH)/2 + 1" in text
    assert "reduction  0 <= kh < KH" in text
    assert text.endswith("O: (N, M, (H - KH)/2 + 1, (W - KW)/2 + 1)  (output)")
    text = explain(dr, dict(N=1, C=3, H=9, W=9, M=8, KH=3, KW=3))
    assert "    output     0 <= h < (H - KH)/2 + 1  = [0, 4)  (I(n, c, 2 * h + kh, 2 * w + kw) (round 2))" in text
    assert "O: (N, M, (H - KH)/2 + 1, (W - KW)/2 + 1) = (1, 8, 4, 4)  (output)" in text


def test_explain_shows_preconditions_and_violations():
    dr = ranges("def f(float(N) B, float(P) C, float(M) D) -> (A) {\n A(i, j) = B(i) * C(i + j) * D(j)\n}")
    assert "in bounds: C(i + j) (line 2) requires N + M <= P + 1" in explain(dr)
    assert explain(dr, {"N": 3, "P": 4, "M": 3}).endswith("VIOLATED")
    assert explain(dr, {"N": 3, "P": 5, "M": 3}).endswith("ok")


def test_not_affine_and_non_bounding_indices():
    check_error("def f(float(N) B) -> (A) { A(i) = B(i*i) }",
                "cannot infer the range of index variable 'i' (the index i * i in B(i * i) is not affine); "
                "add a range with a where clause, e.g. `where i in 0:N`", 1, 28)
    check_error("def f(float(N) B) -> (A) { A(i) = B(i % 4) }",
                "cannot infer the range of index variable 'i' (B(i % 4) stays in bounds for arbitrarily large "
                "or small 'i'); add a range with a where clause, e.g. `where i in 0:N`", 1, 28)
    check_error("def f(float(N) B) -> (A) { A(i) = B(max(i - 1, 0)) }",
                "index variable 'i' has no lower bound; add a range with a where clause, e.g. `where i in 0:N`",
                1, 28)


def test_non_affine_index_of_resolved_variables_is_checked_at_run_time():
    dr = ranges("def f(float(N) B, float(M) C) -> (A) { A(i, j) = B(i) * C(j) * B(i*j) }")
    assert [str(a) for a in dr.statements[0].runtime_checked] == ["B(i * j)"]
    assert dr.preconditions == ()


def test_floor_division_and_modulo_in_indices():
    dr = ranges("def f(float(N) B) -> (A) { A(i) = B(i / 2) }")
    assert symbolic(dr) == {"i": ("0", "2*N", "output")}
    dr = ranges("def f(float(N) B) -> (A) { A(i) = B(i) * B((i + 1) % N) }")
    assert symbolic(dr) == {"i": ("0", "N", "output")}
    assert dr.preconditions == ()


def test_let_clauses_are_inlined():
    check_error("def f(float(N) B) -> (A) { A(i) = B(x) where x = i + 1 }",
                "output index 'i' of A ranges over -1 <= i < N - 1, which starts below 0; output indices "
                "start at 0: restrict it, e.g. `where i in 0:N - 1`", 1, 28)
    dr = ranges("def f(float(N) B) -> (A) { A(i) = B(x) + B(x + 1) where x = 2 * i }")
    assert symbolic(dr) == {"i": ("0", "N/2", "output")}


def test_several_ranges_for_one_variable_intersect():
    dr = ranges("def f(float(N) B) -> (A) { A(i) = B(i) where i in 0:N, i in 1:N+1 }")
    assert symbolic(dr) == {"i": ("1", "N", "output")}
    assert dr.statements[0].ranges["i"].origin == "where i in 0:N, i in 1:N + 1"


def test_format_expr_keeps_floor_division_grouped():
    import sympy
    H, K = sympy.symbols("H K", integer=True)
    assert format_expr(2 * sympy.floor((H - K) / 2) + 1) == "2*((H - K)/2) + 1"
    assert format_expr(sympy.Min(H, K - 1)) == "min(H, K - 1)"


def test_guards_prove_reads_only_with_c_semantics():
    assert ranges("def f(float(N) B) -> (A) { A(i) = i >= 1 ? B(i - 1) : 0.0 where i in 0:N }").preconditions == ()
    # C truncates (0 - 1) / 2 to 0, so the guard holds at i = 0 and B(-1) would be read
    check_error("def f(float(N) B) -> (A) { A(i) = (i - 1) / 2 >= 0 ? B(i - 1) : 0.0 where i in 0:N }",
                "B(i - 1) reads out of bounds of B (shape (N,)) for all sizes when 0 <= i < N", 1, 54)


def test_modulo_index_becomes_a_precondition():
    dr = ranges("def f(float(N) B, float(M) C) -> (A) { A(i) = B(i % 4) + C(i) }")
    assert symbolic(dr) == {"i": ("0", "M", "output")}
    assert [p.text for p in dr.preconditions] == ["B(i % 4)"]
    assert dr.bind({"N": 4, "M": 9}).shapes["A"] == (9,)
    assert dr.bind({"N": 2, "M": 2}).shapes["A"] == (2,)
    with pytest.raises(TCPreconditionError, match=r"B\(i % 4\) reads out of bounds of B \(shape \(2,\)\): "
                                                  r"index 0 \(i % 4\) takes values 0..2"):
        dr.bind({"N": 2, "M": 3})


def test_precondition_message_with_dim_ref_index():
    dr = ranges("def f(float(N) A, float(M) B) -> (O) { O(i) = B(A.0 - 1 - i) where i in 0:N }")
    assert [p.text for p in dr.preconditions] == ["B(A.0 - 1 - i)"]
    assert dr.bind({"N": 3, "M": 3}).shapes["O"] == (3,)
    with pytest.raises(TCPreconditionError, match=r"B\(A.0 - 1 - i\) reads out of bounds of B \(shape \(2,\)\): "
                                                  r"index 0 \(A.0 - 1 - i\) takes values 0..2 "
                                                  r"\(these sizes must satisfy N <= M\)"):
        dr.bind({"N": 3, "M": 2})


def test_padded_conv_nhwc_with_where_ranges():
    dr = ranges("""def conv(float(N,H,W,C) I, float(KH,KW,C,M) Wt) -> (O) {
        O(n, h, w, m) +=! (h + kh - 1 >= 0 && h + kh - 1 < H && w + kw - 1 >= 0 && w + kw - 1 < W)
            ? I(n, h + kh - 1, w + kw - 1, c) * Wt(kh, kw, c, m) : 0.0
            where h in 0:H, w in 0:W, kh in 0:KH, kw in 0:KW
    }""")
    assert shape(dr, "O") == ("N", "H", "W", "M")
    assert dr.preconditions == ()
    assert dr.bind(dict(N=2, H=5, W=4, C=3, KH=3, KW=3, M=6)).shapes["O"] == (2, 5, 4, 6)


def test_strided_padded_conv_output_size():
    # stride 2, padding 1: output (H + 2 - KH)/2 + 1 via a where range on h
    dr = ranges("""def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! (2*h + kh - 1 >= 0 && 2*h + kh - 1 < H && 2*w + kw - 1 >= 0 && 2*w + kw - 1 < W)
            ? I(n, c, 2*h + kh - 1, 2*w + kw - 1) * Wt(m, c, kh, kw) : 0.0
            where h in 0:(H + 2 - KH)/2 + 1, w in 0:(W + 2 - KW)/2 + 1, kh in 0:KH, kw in 0:KW
    }""")
    assert shape(dr, "O") == ("N", "M", "(H - KH)/2 + 2", "(W - KW)/2 + 2")
    assert dr.preconditions == ()
    assert dr.bind(dict(N=1, C=1, H=7, W=8, M=1, KH=3, KW=3)).shapes["O"] == (1, 1, 4, 4)


def test_group_conv_and_average_pool():
    dr = ranges("""def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) Wt) -> (O) {
        O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * Wt(g, f, c, kh, kw)
    }""")
    assert shape(dr, "O") == ("N", "G", "F", "H - KH + 1", "W - KW + 1")
    dr = ranges("""def avgpool(float(N,C,H,W) I) -> (O) {
        O(n, c, h, w) +=! I(n, c, 3*h + kh, 3*w + kw) / 9.0 where kh in 0:3, kw in 0:3
    }""")
    assert shape(dr, "O") == ("N", "C", "H/3", "W/3")
    assert dr.bind(dict(N=1, C=1, H=8, W=9)).shapes["O"] == (1, 1, 2, 3)


def test_reading_an_earlier_output():
    dr = ranges("""def moments(float(M,N) A) -> (S, Mean) {
        S(m) +=! A(m, n)
        Mean(m) = S(m) / float(N)
    }""")
    assert symbolic(dr, 1) == {"m": ("0", "M", "output")}
    assert dr.statements[1].ranges["m"].origin == "S(m) (round 1)"
    assert dr.bind({"M": 3, "N": 4}).shapes == {"S": (3,), "Mean": (3,)}
