"""Jupyter display: a kernel's HTML shows its signature, shapes and ranges; errors keep their caret."""
import pytest

import tcpy
from tcpy.display import error_html, kernel_html

STRIDED = """
def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, 2*h + kh, 2*w + kw) * Wt(f, c, kh, kw)
}
"""


def test_kernel_html_shows_signature_shapes_and_ranges():
    html = tcpy.define(STRIDED)._repr_html_()
    assert html == kernel_html(tcpy.define(STRIDED))
    assert "<code>def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -&gt; (O)</code>" in html
    assert "<code>(N, F, (H - KH)/2 + 1, (W - KW)/2 + 1)</code>" in html
    assert "<code>0 &lt;= h &lt; (H - KH)/2 + 1</code>" in html
    assert html.count(">reduction<") == 3 and html.count(">output<") == 5  # 4 vars + O's role


def test_kernel_html_lists_temporaries_and_preconditions():
    kernel = tcpy.define("""
def f(float(N) B, float(P) C, float(M) D) -> (A) {
    T(i) = B(i) * 2
    A(i, j) = T(i) * C(i + j) * D(j)
}
""")
    html = kernel_html(kernel)
    assert ">temporary<" in html and "<code>T</code>" in html
    assert "size preconditions" in html
    assert "<code>C(i + j)</code> (line 4) requires <code>" in html  # the condition text is tcpy.ranges'


def test_error_html_keeps_message_and_caret_aligned():
    with pytest.raises(tcpy.TCSemanticError) as info:
        tcpy.define("def f(float(N) X) -> (Y) {\n    Y(i) = X(i) + Q(i)\n}\n")
    html = error_html(info.value)
    assert html.count("<pre") == 1
    assert '<b style="color: #c33">TCSemanticError</b>' in html
    assert "<b>&lt;string&gt;:2:19: error: in def &#x27;f&#x27;:" in html
    assert "\n        Y(i) = X(i) + Q(i)\n                      ^~~~</pre>" in html


def test_error_html_for_call_errors():
    import numpy as np

    kernel = tcpy.define("def f(float(N) X) -> (Y) { Y(i) = X(i) }")
    with pytest.raises(tcpy.TCArgumentError) as info:
        kernel(np.zeros(3))
    html = error_html(info.value)
    assert "TCArgumentError" in html and "must have dtype float32" in html


def test_ipython_extension_shows_tcerrors_as_diagnostics():
    from tcpy import display

    class Shell:
        def set_custom_exc(self, types, handler):
            self.types, self.handler = types, handler

    shell = Shell()
    display.load_ipython_extension(shell)
    assert shell.types == (tcpy.TCError,)
    with pytest.raises(tcpy.TCSyntaxError) as info:
        tcpy.define("def f(float(N) X) -> (Y) { Y(i) = X(i) + }")
    diagnostic = display.Diagnostic(info.value)
    assert repr(diagnostic) == f"TCSyntaxError: {info.value}"
    assert diagnostic._repr_html_() == error_html(info.value)
