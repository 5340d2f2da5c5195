"""HTML for Jupyter: a kernel's signature, inferred shapes and ranges; errors as readable diagnostics.

``Kernel._repr_html_`` returns :func:`kernel_html`; errors show :func:`~tcpy.errors.error_html`
(defined with the errors, which must not import this module; importable from here too).
Everything shown is symbolic (in the def's size variables), so it needs no arrays.
"""
from __future__ import annotations

from html import escape

from .errors import TCError, error_html

_STYLE = "font-family: monospace; border-collapse: collapse; text-align: left"
_CELL = "padding: 0 1em 0 0; text-align: left"


def _row(*cells: str, head: bool = False) -> str:
    tag = "th" if head else "td"
    return "<tr>" + "".join(f'<{tag} style="{_CELL}">{c}</{tag}>' for c in cells) + "</tr>"


def _code(text: str) -> str:
    return f"<code>{escape(text)}</code>"


def kernel_html(kernel) -> str:
    """Signature, output/temporary shapes, per-statement index ranges and size preconditions."""
    from .ranges import format_shape

    def_, dr = kernel.def_, kernel.ranges
    parts = [f'<div class="tcpy-kernel"><b>tcpy kernel</b> {_code(def_.signature())}']
    if dr.shapes:
        roles = {t.name: t.role for t in def_.tensors}
        rows = [_row("tensor", "role", "shape", head=True)]
        for name, dims in dr.shapes.items():
            rows.append(_row(_code(name), escape(roles.get(name, "")), _code(format_shape(dims))))
        parts.append(f'<table style="{_STYLE}">{"".join(rows)}</table>')
    rows = [_row("statement", "index variable", "kind", "range", head=True)]
    for k, st in enumerate(dr.statements):
        first = True
        for var, vr in st.ranges.items():
            label = _code(f"{k + 1}: {st.stmt}") if first else ""
            rows.append(_row(label, _code(var), escape(vr.kind), _code(str(vr))))
            first = False
        if first:  # a statement with no index variables (rank-0 target, no reduction)
            rows.append(_row(_code(f"{k + 1}: {st.stmt}"), "", "", ""))
    parts.append(f'<table style="{_STYLE}">{"".join(rows)}</table>')
    if dr.preconditions:
        items = "".join(f"<li>{_code(p.text)} (line {p.span.line}) requires {_code(p.requires)}</li>"
                        for p in dr.preconditions)
        parts.append(f"<div>size preconditions (checked at call time):<ul>{items}</ul></div>")
    parts.append("</div>")
    return "\n".join(parts)


class Diagnostic:
    """A tcpy error for display: HTML in notebooks, the plain compiler-style text elsewhere."""

    def __init__(self, err: TCError):
        self.err = err

    def _repr_html_(self) -> str:
        return error_html(self.err)

    def __repr__(self) -> str:
        return f"{type(self.err).__name__}: {self.err}"


def load_ipython_extension(ipython) -> None:
    """``%load_ext tcpy.display``: show a tcpy error raised in a cell as its diagnostic.

    The compiler-style message (position, source line, caret) is what matters for a TCError;
    the traceback through tcpy's internals is left out. Other exceptions are untouched.
    """
    from IPython.display import display

    def show(shell, etype, value, tb, tb_offset=None):
        display(Diagnostic(value))

    ipython.set_custom_exc((TCError,), show)
