"""TC source text -> unchecked AST, with lark's LALR parser and ``tcpy/grammar.lark``.

The tree is unchecked: identifiers are :class:`~tcpy.lang.ast.Name`, builtin calls and
``min``/``max`` are :class:`~tcpy.lang.ast.Call`, and every other ``id(...)`` is an
:class:`~tcpy.lang.ast.Access`. :mod:`tcpy.lang.sema` resolves and checks it.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Optional

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from ..errors import TCArgumentError, TCSyntaxError
from . import ast
from .builtins import BUILTINS
from .types import TYPE_NAMES

GRAMMAR_PATH = Path(__file__).resolve().parent.parent / "grammar.lark"

# Words that can never be names (TC's lexer reserves them).
KEYWORDS = frozenset({"def", "where", "in", "exists", "min", "max"}) | frozenset(TYPE_NAMES)


@functools.lru_cache(maxsize=None)
def _lark() -> Lark:
    keyword_types: dict[str, str] = {}

    def reserve_keywords(tok: Token) -> Token:
        # The contextual lexer only knows the terminals the current parser state accepts, so a
        # keyword where none is expected would come out as a NAME. Give it its keyword type
        # so that the parser rejects it there.
        kind = keyword_types.get(tok.value)
        return tok if kind is None else Token.new_borrow_pos(kind, tok.value, tok)

    parser = Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"NAME": reserve_keywords},
    )
    for term in parser.terminals:
        if term.pattern.type == "str" and term.pattern.value in KEYWORDS:
            keyword_types[term.pattern.value] = term.name
    return parser


def parse_program(source: str, filename: str = "<string>") -> ast.Program:
    """Parse TC source into an unchecked :class:`~tcpy.lang.ast.Program`.

    Raises :class:`~tcpy.errors.TCSyntaxError` (rendered with line, column and a caret).
    """
    if not isinstance(source, str):
        hint = " (decode it first: source.decode())" if isinstance(source, (bytes, bytearray)) else ""
        raise TCArgumentError(f"TC source must be a str, got {type(source).__name__}{hint}")
    try:
        tree = _lark().parse(source)
    except UnexpectedInput as err:
        raise _syntax_error(err, source, filename) from None
    _check_depth(tree, source, filename)
    try:
        return _ToAst(source).transform(tree)
    except VisitError as err:  # lark wraps what a transformer method raises
        if isinstance(err.orig_exc, TCSyntaxError):
            raise err.orig_exc.located(source, filename) from None
        raise


# Every later stage walks expressions recursively; real programs nest a few levels deep.
MAX_NESTING = 200


def _check_depth(tree: Tree, source: str, filename: str) -> None:
    """Reject expressions nested deeper than :data:`MAX_NESTING` (e.g. a sum of thousands of
    terms) with a syntax error rather than a RecursionError in a later stage."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise TCSyntaxError(
                f"expression nested too deeply (more than {MAX_NESTING} levels of operators and calls); "
                "split it into several statements",
                _span(node.meta), source, None, filename)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


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

    # -- signature

    def start(self, meta, children):
        return ast.Program(tuple(children), self.source)

    def function(self, meta, children):
        name, params, results, *stmts = children
        return ast.Def(
            name.value, params, results, tuple(stmts), span=_span(meta), name_span=_token_span(name)
        )

    def params(self, meta, children):
        return _present(children)

    results = params

    def param(self, meta, children):
        type_, name = children
        return ast.Param(name.value, type_, span=_span(meta))

    def inferred_result(self, meta, children):
        (name,) = children
        return ast.Param(name.value, None, span=_span(meta))

    def tensor_type(self, meta, children):
        scalar, *dims = children
        out = []
        for d in _present(dims):
            if d.type == "INT_LIT":
                out.append(ast.IntLit(self.integer(d, meta), span=_token_span(d)))
            else:
                out.append(ast.Name(d.value, span=_token_span(d)))
        return ast.TensorType(scalar, tuple(out), span=_span(meta))

    def scalar_type(self, meta, children):
        return TYPE_NAMES[children[0].value]

    # -- statements

    def stmt(self, meta, children):
        target, lhs, op, rhs, equivalent, where = children
        reduction = None if op.value == "=" else op.value.split("=")[0]
        return ast.Stmt(
            target.value,
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
        return ast.Equivalent(name.value, _present(args), span=_span(meta))

    def where(self, meta, children):
        return tuple(children)

    def range_constraint(self, meta, children):
        var, lo, hi = children
        return ast.RangeConstraint(var.value, lo, hi, span=_span(meta))

    def let(self, meta, children):
        name, expr = children
        return ast.Let(name.value, expr, span=_span(meta))

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
        return ast.IntLit(self.integer(children[0], meta), span=_span(meta))

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
        func = name.value
        if func in BUILTINS:
            return ast.Call(func, args, span=_span(meta))
        return ast.Access(func, args, span=_span(meta))

    def dim_ref(self, meta, children):
        name, dim = children
        return ast.DimRef(name.value, self.integer(dim, meta), span=_span(meta))

    def integer(self, token: Token, meta) -> int:
        """The value of an integer token. Python refuses to convert more than 4300 digits, and
        no TC type holds more than 20, so longer constants are an error here."""
        digits = token.value.lstrip("0") or "0"
        if len(digits) > 20:
            raise TCSyntaxError(
                f"integer constant of {len(digits)} digits is too large: TC integers have at most 64 bits",
                _span(meta), self.source)
        return int(digits)

    def name(self, meta, children):
        return ast.Name(children[0].value, span=_span(meta))


# ----------------------------------------------------------------------------- syntax errors

_DEF_RE = re.compile(r"\bdef\s+([_a-zA-Z][_a-zA-Z0-9]*)")


def _enclosing_def(source: str, pos: int) -> Optional[str]:
    """The name of the last ``def`` that starts before ``pos`` (for error messages)."""
    text = re.sub(r"#[^\n]*", "", source[:pos])
    names = _DEF_RE.findall(text)
    return names[-1] if names else None


def _syntax_error(err: UnexpectedInput, source: str, filename: str) -> TCSyntaxError:
    span = _error_span(err, source)
    def_name = _enclosing_def(source, span.start_pos)
    return TCSyntaxError(_describe(err, source, def_name), span, source, def_name, filename)


def _pos_span(source: str, pos: int) -> ast.Span:
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1) + 1
    return ast.Span(line, column, line, column + 1, pos, pos + 1)


def _error_span(err: UnexpectedInput, source: str) -> ast.Span:
    tok = getattr(err, "token", None)
    if isinstance(err, UnexpectedCharacters):
        return _pos_span(source, err.pos_in_stream)
    if tok is not None and tok.type != "$END":
        return _token_span(tok)
    # The end of the input: point just after the last token.
    end = len(re.sub(r"(\s|#[^\n]*)*\Z", "", source))
    return _pos_span(source, end)


# Typical mistakes, each shown by example sources that make the parser stop in the same state
# (and, for the entries marked "token", on the same kind of token). The message says what was
# expected; "{found}" is the offending token, "{def}" the def's name.
_BODY = "def f(float(N) A) -> (B) {\n"
_MISTAKES: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    (
        "expected an assignment operator after the left-hand side: '=' or a reduction "
        "'+=!', '*=!', 'min=!', 'max=!' (without '!' to accumulate into existing values), "
        "but found {found}",
        False,
        (_BODY + "B(i) A(i) }", _BODY + "B A(0) }"),
    ),
    (
        "'=+' is not an operator: write '+=!' to sum starting from 0, or '+=' to add to existing values",
        True,
        (_BODY + "B(i) =+ A(i) }",),
    ),
    (
        "'=*' is not an operator: write '*=!' to multiply starting from 1, or '*=' to multiply existing values",
        True,
        (_BODY + "B(i) =* A(i) }",),
    ),
    (
        "'==' compares two values; a statement assigns with '=' or reduces with '+=!', '*=!', 'min=!', 'max=!'",
        True,
        (_BODY + "B(i) == A(i) }",),
    ),
    (
        "reduction operators are written without spaces: 'min=!', 'max=!'",
        True,
        (_BODY + "B(i) min = A(i) }", _BODY + "B(i) max = A(i) }"),
    ),
    (
        "{found} cannot start a statement: separate where clauses with ','",
        True,
        (_BODY + "B(i) = A(i) where i in 0:N j in 0:N }",),
    ),
    (
        "expected ':' and the value for a false condition ('cond ? a : b') but found {found}",
        False,
        (_BODY + "B(i) = A(i) > 0 ? 1 }", _BODY + "B(i) = A(i) > 0 ? A(i) }"),
    ),
    (
        "TC has no '**' operator; write pow(x, y)",
        True,
        (_BODY + "B(i) = A(i) ** 2 }",),
    ),
    (
        "unbalanced parentheses: expected ')' to close the '(' at {open} but found {found}",
        False,
        (
            _BODY + "B(i) = (A(i) + 1 }",
            _BODY + "B(i) = float(A(i) + 1 }",
            _BODY + "B(i) = max(A(i), 1 }",
        ),
    ),
    (
        "unbalanced parentheses: expected ',' or ')' to close the '(' at {open} but found {found}",
        False,
        (
            _BODY + "B(i) = A(i }",
            _BODY + "B(i) = A(i + 1 }",
            _BODY + "B(i) = A(A(i) }",
            _BODY + "B(i) = exp(A(i) }",
            _BODY + "B(i = A(i) }",
        ),
    ),
    (
        "unbalanced parentheses: this ')' closes no '('",
        True,
        (_BODY + "B(i) = A(i) + 1) }", _BODY + "B(i) = A(i)) }", _BODY + "B(i) = i) }", _BODY + "B(i) = 1) }"),
    ),
    (
        "expected '->' and the list of outputs after the parameters, e.g. 'def f(float(N) A) -> (B)', "
        "but found {found}",
        False,
        ("def f(float(N) A) (B) {}", "def f(float(N) A) {}"),
    ),
    (
        "parameter {found} needs a type, e.g. 'float(N, M) A' or 'float a' (only outputs may omit it)",
        True,
        ("def f(A) -> (B) {}", "def f(float(N) A, B) -> (C) {}"),
    ),
    (
        "expected '{{' to open the body of def '{def}' but found {found}",
        False,
        ("def f(float(N) A) -> (B) B(i) = A(i)",),
    ),
    (
        "a range constraint is written 'i in lo:hi' (hi excluded), not with '..'",
        True,
        (_BODY + "B(i) = A(i) where i in 0..N }",),
    ),
    (
        "'x = ...' in a where clause binds a value; a range is written 'i in lo:hi'",
        True,
        (_BODY + "B(i) = A(i) where i = 0:N }",),
    ),
    (
        "expected a where clause after 'where': 'i in lo:hi', 'x = expr' or 'exists expr', but found {found}",
        False,
        (_BODY + "B(i) = A(i) where }",),
    ),
    (
        "expected 'def': a TC source is a sequence of 'def name(params) -> (outputs) {{ statements }}', "
        "but found {found}",
        False,
        ("f(float(N) A) -> (B) {}", "def f(float(N) A) -> (B) {} g"),
    ),
)

# Characters TC does not use, and what the user probably meant.
_CHARACTER_HINTS = {
    ";": "TC statements do not end with ';': put each statement on its own line",
    "[": "TC indexes with parentheses: write A(i, j), not A[i][j]",
    "]": "TC indexes with parentheses: write A(i, j), not A[i][j]",
    "&": "logical and is written '&&'",
    "|": "logical or is written '||'",
}


@functools.lru_cache(maxsize=None)
def _mistake_table() -> dict[tuple, str]:
    """Map (parser state, accepted terminals, token type or None) of each example's error to
    its message."""
    table: dict[tuple, str] = {}
    for message, by_token, examples in _MISTAKES:
        for example in examples:
            try:
                _lark().parse(example)
            except (UnexpectedToken, UnexpectedEOF) as err:
                key = (err.state.position, frozenset(err.accepts), err.token.type if by_token else None)
                table.setdefault(key, message)
            else:  # pragma: no cover - a broken table entry
                raise AssertionError(f"example parses: {example!r}")
    return table


def _describe(err: UnexpectedInput, source: str, def_name: Optional[str]) -> str:
    if isinstance(err, UnexpectedCharacters):
        char = source[err.pos_in_stream]
        hint = _CHARACTER_HINTS.get(char)
        return hint if hint else f"unexpected character '{char}'"
    if not isinstance(err, UnexpectedToken):
        return "unexpected end of the input"
    tok = err.token
    at_end = tok.type == "$END"
    if at_end:
        found = "the end of the input"
    elif tok.value in KEYWORDS and tok.type != "NAME":
        found = f"the keyword '{tok.value}'"
    else:
        found = f"'{tok.value}'"
    fill = {"found": found, "def": def_name or "?", "open": _unclosed_paren(source, tok.start_pos)}
    table = _mistake_table()
    accepts = frozenset(err.accepts)
    state = err.state.position
    for key in ((state, accepts, tok.type), (state, accepts, None)):
        if key in table:
            return table[key].format(**fill)
    if at_end and "RBRACE" in accepts:
        return "the source ends before the '}' that closes the def"
    return f"expected {_expected_words(accepts)} but found {found}"


def _unclosed_paren(source: str, pos: Optional[int]) -> str:
    """'line:column' of the innermost '(' still open at ``pos``."""
    stack = []
    text = re.sub(r"#[^\n]*", lambda m: " " * len(m.group(0)), source[:pos])
    for i, char in enumerate(text):
        if char == "(":
            stack.append(i)
        elif char == ")" and stack:
            stack.pop()
    if not stack:
        return "?"
    span = _pos_span(source, stack[-1])
    return f"{span.line}:{span.column}"


_EXPRESSION_START = frozenset({"NAME", "INT_LIT", "FLOAT_LIT", "LPAR", "MINUS", "BANG", "MIN", "MAX"})
_OPERATORS = frozenset(
    {"OR", "AND", "LT", "GT", "LE", "GE", "EQ", "NE", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "QMARK"}
)
_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT_LIT": "an integer",
    "FLOAT_LIT": "a number",
    "ASSIGN_OP": "an assignment operator ('=', '+=!', ...)",
    "_EQUIVALENT": "'<=>'",
    "$END": "the end of the input",
}


def _expected_words(accepts: set[str]) -> str:
    """Say in words what the parser would have accepted."""
    words: list[str] = []
    types = {n for n in accepts if _terminal_text(n) in TYPE_NAMES}
    rest = set(accepts) - types
    if {"NAME", "INT_LIT", "LPAR"} <= rest:
        words.append("an expression")
        rest -= _EXPRESSION_START
    elif types:
        words.append("a type (float, double, int32, ...)")
    if rest & _OPERATORS:
        words.append("an operator")
        rest -= _OPERATORS
    for name in sorted(rest, key=lambda n: (n not in _TERMINAL_WORDS, n)):
        words.append(_TERMINAL_WORDS.get(name) or f"'{_terminal_text(name)}'")
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _terminal_text(name: str) -> str:
    try:
        pattern = _lark().get_terminal(name).pattern
    except KeyError:
        return name
    return pattern.value if pattern.type == "str" else name
