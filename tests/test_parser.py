"""Parser: source text -> unchecked AST (names, spans, precedence, syntax errors)."""
from pathlib import Path

import pytest

from tcpy.errors import TCSyntaxError
from tcpy.lang import ast
from tcpy.lang.parser import parse_program
from tcpy.lang.types import TYPE_NAMES, ScalarType

MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)   # a comment
}
"""


def test_matmul_tree_and_spans():
    prog = parse_program(MATMUL)
    (d,) = prog.defs
    assert d.name == "matmul"
    assert d.name_span == ast.Span(2, 5, 2, 11, 5, 11)
    assert [p.name for p in d.params] == ["A", "B"]
    assert d.params[0].type == ast.TensorType(ScalarType.FLOAT32, (ast.Name("M"), ast.Name("K")))
    assert d.returns == (ast.Param("C", None),)
    (s,) = d.stmts
    assert (s.target, s.reduction, s.init) == ("C", "+", True)
    assert s.lhs == (ast.Name("m"), ast.Name("n"))
    assert s.rhs == ast.Binary(
        "*", ast.Access("A", (ast.Name("m"), ast.Name("k"))), ast.Access("B", (ast.Name("k"), ast.Name("n")))
    )
    assert (s.span.line, s.span.column) == (3, 5)
    assert (s.rhs.span.line, s.rhs.span.column, s.rhs.span.end_column) == (3, 17, 34)
    assert s.target_span == ast.Span(3, 5, 3, 6, 53, 54)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a + b * c", "a + b * c"),
        ("(a + b) * c", "(a + b) * c"),
        ("a - (b - c)", "a - (b - c)"),
        ("-a * b", "-a * b"),
        ("-(a * b)", "-(a * b)"),
        ("a < b && c || !d", "a < b && c || !d"),
        ("a ? b : c ? d : e", "a ? b : c ? d : e"),
        ("(a ? b : c) ? d : e", "(a ? b : c) ? d : e"),
        ("a || b ? c + 1 : d", "a || b ? c + 1 : d"),
        ("x % 2 == 0", "x % 2 == 0"),
    ],
)
def test_precedence_round_trips(text, expected):
    src = f"def f(float x) -> (y) {{ y = {text} }}"
    (s,) = parse_program(src).defs[0].stmts
    assert str(s.rhs) == expected


def test_builtins_become_calls_other_applications_accesses():
    src = "def f(float(N) A) -> (B) { B(i) = exp(A(i)) + max(A(i), 0) + g(i) + A.0 }"
    rhs = parse_program(src).defs[0].stmts[0].rhs
    calls = [n for n in rhs.walk() if isinstance(n, ast.Call)]
    accesses = [n.tensor for n in rhs.walk() if isinstance(n, ast.Access)]
    assert [c.func for c in calls] == ["exp", "max"]
    assert accesses == ["A", "A", "g"]
    assert any(isinstance(n, ast.DimRef) and n.dim == 0 for n in rhs.walk())


def test_syntax_error_is_located():
    with pytest.raises(TCSyntaxError) as info:
        parse_program("def f(float(N) A) -> (B) {\n  B(i) A(i)\n}")
    err = info.value
    assert (err.line, err.column) == (2, 8)
    assert err.def_name == "f"
    assert "assignment operator" in err.message


GOOD = sorted((Path(__file__).parent / "golden" / "good").glob("*.tc"))


def _parse_expr(text: str) -> ast.Expr:
    return parse_program(f"def f() -> () {{ y = {text} }}").defs[0].stmts[0].rhs


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_every_span_covers_its_node(path):
    """Each expression's span is exactly its source text: re-parsing the slice gives the node."""
    source = path.read_text()
    for d in parse_program(source).defs:
        assert source[d.name_span.start_pos:d.name_span.end_pos] == d.name
        assert source[d.span.start_pos:d.span.end_pos].startswith("def") and source[d.span.end_pos - 1] == "}"
        for s in d.stmts:
            assert source[s.target_span.start_pos:s.target_span.end_pos] == s.target
            exprs = [*s.lhs, s.rhs] + [e for c in s.where for e in _clause_exprs(c)]
            for top in exprs:
                for e in top.walk():
                    assert e.span != ast.NO_SPAN
                    assert _parse_expr(source[e.span.start_pos:e.span.end_pos]) == e


def _clause_exprs(clause):
    if isinstance(clause, ast.RangeConstraint):
        return [clause.lo, clause.hi]
    return [clause.expr]


@pytest.mark.parametrize(
    "text, value",
    [("7", ast.IntLit(7)), ("1.5", ast.FloatLit(1.5)), ("3.", ast.FloatLit(3.0)), (".5e-7", ast.FloatLit(0.5e-7)),
     ("3E-5", ast.FloatLit(3e-5)), ("2e3", ast.FloatLit(2000.0))],
)
def test_number_literals(text, value):
    assert _parse_expr(text) == value


def test_keywords_are_reserved_and_min_max_are_calls():
    e = _parse_expr("min(a, max(b, c)) + minimum")
    assert e == ast.Binary(
        "+", ast.Call("min", (ast.Name("a"), ast.Call("max", (ast.Name("b"), ast.Name("c"))))), ast.Name("minimum")
    )
    with pytest.raises(TCSyntaxError, match="found the keyword 'in'"):
        parse_program("def f(float(N) in) -> (B) { }")


def test_all_assignment_operators_and_where_clauses():
    ops = ["=", "+=", "*=", "min=", "max=", "+=!", "*=!", "min=!", "max=!"]
    body = "\n".join(f"    O {op} A(i) where i in 0:N, x = 1, exists A(i)" for op in ops)
    d = parse_program(f"def f(float(N) A) -> (O) {{\n{body}\n}}").defs[0]
    assert [s.op for s in d.stmts] == ops
    assert all(len(s.where) == 3 for s in d.stmts)


def test_casts_to_every_type_spelling():
    for spelling, scalar in TYPE_NAMES.items():
        assert _parse_expr(f"{spelling}(x)") == ast.Cast(scalar, ast.Name("x"))


def test_empty_source_and_several_defs():
    assert parse_program("").defs == ()
    assert parse_program("  # only a comment\n").defs == ()
    names = [d.name for d in parse_program("def a() -> () {}\ndef b() -> () {}").defs]
    assert names == ["a", "b"]
