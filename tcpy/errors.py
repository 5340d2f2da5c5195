"""Every error tcpy raises for a bad program or a bad argument is a :class:`TCError`.

Program errors carry the source text and a :class:`~tcpy.lang.ast.Span` and render like a
compiler diagnostic::

    <string>:3:17: error: in def 'matmul': undefined variable 'Q'
        C(m, n) +=! A(m, k) * Q(k, n)
                              ^

In Jupyter an error shows as :func:`error_html`, a box with that report. At run time this module
imports nothing else of tcpy, so every module can import it.
"""
from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # the language layer stays import-light
    from .lang.ast import Span


class TCError(Exception):
    """Base class of everything tcpy raises for a bad program or a bad input."""

    def _repr_html_(self) -> str:  # Jupyter shows errors as a readable diagnostic box
        return error_html(self)


class TCProgramError(TCError):
    """An error located in TC source text.

    ``message`` is the bare diagnostic; ``str(err)`` is the rendered compiler-style report with
    the file name, line, column, the source line and a caret under the offending token.
    """

    kind = "error"

    def __init__(
        self,
        message: str,
        span: Optional["Span"] = None,
        source: Optional[str] = None,
        def_name: Optional[str] = None,
        filename: str = "<string>",
    ):
        self.message = message
        self.span = span
        self.source = source
        self.def_name = def_name
        self.filename = filename
        super().__init__(self.render())

    def located(self, source: str, filename: Optional[str] = None) -> "TCProgramError":
        """Attach the source text (and optionally a file name) and re-render."""
        self.source = source
        if filename is not None:
            self.filename = filename
        self.args = (self.render(),)
        return self

    @property
    def line(self) -> Optional[int]:
        return self.span.line if self.span else None

    @property
    def column(self) -> Optional[int]:
        return self.span.column if self.span else None

    def render(self) -> str:
        where = f" in def '{self.def_name}':" if self.def_name else ""
        if self.span is None:
            return f"{self.filename}: {self.kind}:{where} {self.message}"
        head = f"{self.filename}:{self.span.line}:{self.span.column}: {self.kind}:{where} {self.message}"
        if not self.source:
            return head
        lines = self.source.splitlines()
        if not 1 <= self.span.line <= len(lines):
            return head
        text = lines[self.span.line - 1].expandtabs(1)
        start = self.span.column - 1
        if self.span.end_line == self.span.line:
            width = max(1, self.span.end_column - self.span.column)
        else:
            width = max(1, len(text) - start)
        caret = " " * start + "^" + "~" * (width - 1)
        return f"{head}\n    {text}\n    {caret}"

    def __str__(self) -> str:
        return self.args[0] if self.args else self.render()


class TCSyntaxError(TCProgramError):
    """The source does not follow the TC grammar."""


class TCSemanticError(TCProgramError):
    """The source parses but breaks a language rule (names, types, reductions...)."""


class TCRangeError(TCProgramError):
    """Range inference cannot give a variable a safe, rectangular range."""


class TCLookupError(TCError, KeyError):
    """A def name that the source does not define."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TCArgumentError(TCError, TypeError):
    """A call argument of the wrong kind, count, dtype or rank."""


class TCShapeError(TCArgumentError, ValueError):
    """Argument sizes that disagree with each other or with the signature."""


class TCPreconditionError(TCShapeError):
    """Sizes for which some access of the program would read out of bounds."""


class TCMemoryError(TCShapeError, MemoryError):
    """Sizes for which a call's outputs and temporaries would need more memory than the machine has."""


class TCRuntimeError(TCError, RuntimeError):
    """A kernel stopped on bad data: integer division by zero, a data-dependent index out of bounds."""


class TCOverflowError(TCArgumentError, OverflowError):
    """A number argument (or size) outside the range of the type that must hold it."""


class TCOptionError(TCArgumentError, ValueError):
    """An option tcpy cannot use: an :class:`~tcpy.Options` field, a ``TCPY_*`` environment
    variable, or a compiler flag of the user's that makes the build fail."""


class TCOpError(TCArgumentError, ValueError):
    """An operation of :mod:`tcpy.ops` given operands or attributes its PTIR contract rejects
    (an axis out of range, a bad permutation, mismatched shapes or dtypes, ...)."""


class TCWarning(UserWarning):
    """A program that runs, but maybe not as meant (e.g. ``+=`` into an output nothing wrote yet)."""


class TCCompilerError(TCError, RuntimeError):
    """The C compiler rejected generated code: a bug in tcpy, please report it."""


def error_html(err: TCError) -> str:
    """A diagnostic box: the compiler-style message with its source line and caret kept aligned."""
    kind = type(err).__name__
    body = str(err)
    if isinstance(err, TCProgramError) and err.span is not None and err.source:
        head, _, rest = body.partition("\n")
        body = f"<b>{escape(head)}</b>\n{escape(rest)}" if rest else f"<b>{escape(head)}</b>"
    else:
        body = escape(body)
    return (f'<div class="tcpy-error" style="border-left: 4px solid #c33; padding: 4px 8px">'
            f'<b style="color: #c33">{escape(kind)}</b><pre style="margin: 4px 0">{body}</pre></div>')
