"""The public API around kernels: define(), Library, explain, c_source, options, display."""
import numpy as np
import pytest

import tcpy

TWO_DEFS = """
def scale(float(N) X, float a) -> (Y) {
    Y(i) = a * X(i)
}
def total(float(N) X) -> (s) {
    s +=! X(i)
}
"""


def test_several_defs_give_a_library_and_name_picks_one():
    lib = tcpy.define(TWO_DEFS)
    assert isinstance(lib, tcpy.Library)
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(lib.scale(X, 2.0), 2 * X)
    assert lib["total"](X) == 10
    total = tcpy.define(TWO_DEFS, name="total")
    assert isinstance(total, tcpy.Kernel) and total.name == "total"
    assert "scale" in repr(lib) and "total" in repr(lib)


def test_unknown_def_name_lists_the_available_ones():
    with pytest.raises(tcpy.TCLookupError, match=r"no def named 'mm'; the source defines 'scale', 'total'"):
        tcpy.define(TWO_DEFS, name="mm")


def test_unknown_backend_is_an_argument_error():
    with pytest.raises(tcpy.TCArgumentError, match=r"backend must be one of compiled, reference, got 'gpu'"):
        tcpy.define(TWO_DEFS, backend="gpu")


def test_repr_and_html_show_the_signature():
    k = tcpy.define(TWO_DEFS, name="scale")
    assert repr(k) == "<tcpy.Kernel def scale(float(N) X, float a) -> (Y)>"
    html = k._repr_html_()
    assert "def scale(float(N) X, float a)" in html and "<table" in html


def test_error_html_keeps_the_caret_line():
    with pytest.raises(tcpy.TCSemanticError) as info:
        tcpy.define("def f(float(N) A) -> (B) {\n    B(i) = Q(i)\n}")
    html = info.value._repr_html_()
    assert "TCSemanticError" in html and "unknown function or tensor" in html and "^" in html


def test_explain_symbolic_and_bound():
    k = tcpy.define("""
    def conv(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {
        O(n, m, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(m, c, kh, kw)
    }""")
    symbolic = k.explain()
    assert "h" in symbolic and "KH" in symbolic
    bound = k.explain((1, 3, 9, 9), (4, 3, 3, 3))
    assert "(1, 4, 4, 4)" in bound  # (9 - 3)/2 + 1 = 4
    assert "schedule:" in bound
    by_sizes = k.explain(N=1, C=3, H=9, W=9, M=4, KH=3, KW=3)
    assert by_sizes == bound


def test_explain_needs_every_size():
    k = tcpy.define(TWO_DEFS, name="total")
    with pytest.raises(tcpy.TCArgumentError, match="has no size variable 'Q'"):
        k.explain(Q=3)
    with pytest.raises(tcpy.TCArgumentError, match="needs values for sizes N"):
        k.c_source()


def test_c_source_is_shape_specialized():
    # a preset: how the reduction's loop is split into strips follows the vector width
    k = tcpy.define(TWO_DEFS, name="total", options=tcpy.Options(target="x86-64-v3"))
    source = k.c_source((37,))
    assert "sizes: N=37" in source and "36" in source  # the loop bound is a constant


def test_options_validate_their_values():
    with pytest.raises(ValueError, match="num_threads must be None or an int from 1 to"):
        tcpy.Options(num_threads=0)
    with pytest.raises(ValueError, match=r"tile_sizes\['m'\] must be an int from 0 to"):
        tcpy.Options(tile_sizes={"m": -4})
    with pytest.raises(ValueError, match="unroll must be an int from 0 to 65534 .*, got -1"):
        tcpy.Options(unroll=-1)


def test_single_thread_option_removes_parallel_loops():
    mm = """def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"""
    parallel = tcpy.define(mm).c_source((256, 256), (256, 256))
    serial = tcpy.define(mm, options=tcpy.Options(num_threads=1)).c_source((256, 256), (256, 256))
    assert "omp parallel" in parallel and "omp parallel" not in serial


def test_reference_backend_has_the_same_interface():
    k = tcpy.define(TWO_DEFS, name="scale", backend="reference")
    X = np.arange(4, dtype=np.float32)
    result = k(X, 3.0)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, 3 * X)


def test_a_source_without_defs_is_a_lookup_error():
    with pytest.raises(tcpy.TCLookupError, match="the source defines no def"):
        tcpy.define("# only a comment\n")


def test_def_name_attribute_works_for_a_single_def_too():
    k = tcpy.define(TWO_DEFS, name="total")
    assert k.total is k
    with pytest.raises(AttributeError):
        k.scale
