"""TC source text -> unchecked AST, with lark's LALR parser and ``tcpy/grammar.lark``.

The tree is unchecked: identifiers are :class:`~tcpy.lang.ast.Name`, builtin calls and
``min``/``max`` are :class:`~tcpy.lang.ast.Call`, and every other ``id(...)`` is an
:class:`~tcpy.lang.ast.Access`. :mod:`tcpy.lang.sema` resolves and checks it.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from ..errors import TCSyntaxError
from . import ast
from .builtins import BUILTINS
from .types import TYPE_NAMES

GRAMMAR_PATH = Path(__file__).resolve().parent.parent / "grammar.lark"

# Words the lexer reserves; the contextual lexer would otherwise accept them as names
# wherever the keyword itself cannot appear.
KEYWORDS = frozenset({"def", "where", "in", "exists", "min", "max"}) | frozenset(TYPE_NAMES)


@functools.lru_cache(maxsize=None)
def _lark() -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
    )


def parse_program(source: str, filename: str = "<string>") -> ast.Program:
    """Parse TC source into an unchecked :class:`~tcpy.lang.ast.Program`.

    Raises :class:`~tcpy.errors.TCSyntaxError` (rendered with line, column and a caret).
    """
    try:
        tree = _lark().parse(source)
    except UnexpectedInput as err:
        raise _syntax_error(err, source, filename) from None
    try:
        return _ToAst(source).transform(tree)
    except VisitError as err:  # the transformer's own TCSyntaxError (a keyword used as a name)
        if isinstance(err.orig_exc, TCSyntaxError):
            raise err.orig_exc.located(source, filename) from None
        raise


# ----------------------------------------------------------------------------- tree -> AST


def _span(meta) -> ast.Span:
    if getattr(meta, "empty", False):
        return ast.NO_SPAN
    return ast.Span(meta.line, meta.column, meta.end_line, meta.end_column, meta.start_pos, meta.end_pos)


def _token_span(tok: Token) -> ast.Span:
    return ast.Span(tok.line, tok.column, tok.end_line, tok.end_column, tok.start_pos, tok.end_pos)


def _present(items) -> tuple:
    """Drop lark's placeholders (None) for absent optional parts."""
    return tuple(x for x in items if x is not None)


@v_args(meta=True)
class _ToAst(Transformer):
    def __init__(self, source: str):
        super().__init__()
        self.source = source

    def _ident(self, tok: Token) -> str:
        if tok.value in KEYWORDS:
            raise TCSyntaxError(
                f"'{tok.value}' is a keyword and cannot be used as a name",
                _token_span(tok),
                def_name=_enclosing_def(self.source, tok.start_pos),
            )
        return tok.value

    # -- signature

    def start(self, meta, children):
        return ast.Program(tuple(children), self.source)

    def function(self, meta, children):
        name, params, results, *stmts = children
        return ast.Def(
            self._ident(name), params, results, tuple(stmts), span=_span(meta), name_span=_token_span(name)
        )

    def params(self, meta, children):
        return _present(children)

    results = params

    def param(self, meta, children):
        type_, name = children
        return ast.Param(self._ident(name), type_, span=_span(meta))

    def inferred_result(self, meta, children):
        (name,) = children
        return ast.Param(self._ident(name), None, span=_span(meta))

    def tensor_type(self, meta, children):
        scalar, *dims = children
        out = []
        for d in _present(dims):
            if d.type == "INT":
                out.append(ast.IntLit(int(d.value), span=_token_span(d)))
            else:
                out.append(ast.Name(self._ident(d), span=_token_span(d)))
        return ast.TensorType(scalar, tuple(out), span=_span(meta))

    def scalar_type(self, meta, children):
        return TYPE_NAMES[children[0].value]

    # -- statements

    def stmt(self, meta, children):
        target, lhs, op, rhs, equivalent, where = children
        reduction = None if op.value == "=" else op.value.split("=")[0]
        return ast.Stmt(
            self._ident(target),
            lhs or (),
            reduction,
            op.value.endswith("!"),
            rhs,
            where or (),
            equivalent,
            span=_span(meta),
            target_span=_token_span(target),
        )

    def lhs(self, meta, children):
        return _present(children)

    def equivalent(self, meta, children):
        name, *args = children
        return ast.Equivalent(self._ident(name), _present(args), span=_span(meta))

    def where(self, meta, children):
        return tuple(children)

    def range_constraint(self, meta, children):
        var, lo, hi = children
        return ast.RangeConstraint(self._ident(var), lo, hi, span=_span(meta))

    def let(self, meta, children):
        name, expr = children
        return ast.Let(self._ident(name), expr, span=_span(meta))

    def exists(self, meta, children):
        return ast.Exists(children[0], span=_span(meta))

    # -- expressions

    def ternary(self, meta, children):
        cond, then, other = children
        return ast.Ternary(cond, then, other, span=_span(meta))

    def binary(self, meta, children):
        lhs, op, rhs = children
        return ast.Binary(op.value, lhs, rhs, span=_span(meta))

    def unary(self, meta, children):
        op, operand = children
        return ast.Unary(op.value, operand, span=_span(meta))

    def int_lit(self, meta, children):
        return ast.IntLit(int(children[0].value), span=_span(meta))

    def float_lit(self, meta, children):
        return ast.FloatLit(float(children[0].value), span=_span(meta))

    def cast(self, meta, children):
        to, operand = children
        return ast.Cast(to, operand, span=_span(meta))

    def min_max(self, meta, children):
        func, a, b = children
        return ast.Call(func.value, (a, b), span=_span(meta))

    def apply(self, meta, children):
        name, *args = children
        args = _present(args)
        func = self._ident(name)
        if func in BUILTINS:
            return ast.Call(func, args, span=_span(meta))
        return ast.Access(func, args, span=_span(meta))

    def dim_ref(self, meta, children):
        name, dim = children
        return ast.DimRef(self._ident(name), int(dim.value), span=_span(meta))

    def name(self, meta, children):
        return ast.Name(self._ident(children[0]), span=_span(meta))


# ----------------------------------------------------------------------------- syntax errors

_DEF_RE = re.compile(r"\bdef\s+([_a-zA-Z][_a-zA-Z0-9]*)")


def _enclosing_def(source: str, pos: int):
    """The name of the last ``def`` that starts before ``pos`` (for error messages)."""
    names = [m.group(1) for m in _DEF_RE.finditer(_strip_comments(source[:pos]))]
    return names[-1] if names else None


def _strip_comments(text: str) -> str:
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group(0)), text)


def _syntax_error(err: UnexpectedInput, source: str, filename: str) -> TCSyntaxError:
    message, span = _describe(err, source)
    return TCSyntaxError(
        message, span, source, def_name=_enclosing_def(source, span.start_pos), filename=filename
    )


def _error_span(err: UnexpectedInput, source: str) -> ast.Span:
    tok = getattr(err, "token", None)
    if isinstance(tok, Token) and tok.type != "$END" and tok.line is not None:
        return _token_span(tok)
    pos = len(source) if tok is not None and tok.type == "$END" else err.pos_in_stream
    pos = min(pos if pos is not None else len(source), len(source))
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1) + 1
    if pos == len(source) and source.endswith("\n") and line > 1:  # point after the last token
        stripped = source.rstrip()
        return _error_span_at(source, len(stripped))
    return ast.Span(line, column, line, column + 1, pos, pos + 1)


def _error_span_at(source: str, pos: int) -> ast.Span:
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1) + 1
    return ast.Span(line, column, line, column + 1, pos, pos + 1)


def _describe(err: UnexpectedInput, source: str) -> tuple[str, ast.Span]:
    span = _error_span(err, source)
    if isinstance(err, UnexpectedCharacters):
        char = source[err.pos_in_stream]
        return f"unexpected character '{char}'", span
    tok = getattr(err, "token", None)
    found = "the end of the input" if tok is None or tok.type == "$END" else f"'{tok.value}'"
    expected = _expected_words(getattr(err, "expected", None) or getattr(err, "accepts", None) or ())
    return f"expected {expected} but found {found}", span


_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "ASSIGN_OP": "an assignment operator (=, +=, +=!, *=!, min=!, max=!, ...)",
    "MIN": "min(a, b)",
    "MAX": "max(a, b)",
}


def _expected_words(expected) -> str:
    """Say in words what the parser would have accepted."""
    words: list[str] = []
    types = False
    operators = False
    for name in sorted(expected):
        if name in _TERMINAL_WORDS:
            word = _TERMINAL_WORDS[name]
        else:
            try:
                pattern = _lark().get_terminal(name).pattern
            except KeyError:
                continue
            text = pattern.value
            if text in TYPE_NAMES:
                types = True
                continue
            if name in _OPERATORS:
                operators = True
                continue
            word = f"'{text}'"
        if word not in words:
            words.append(word)
    if operators:
        words.append("an operator")
    if types:
        words.append("a type (float, double, int32, ...)")
    if not words:
        return "something else"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


_OPERATORS = frozenset(
    {"OR", "AND", "LT", "GT", "LE", "GE", "EQ", "NE", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "QMARK", "BANG"}
)
