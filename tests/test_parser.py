"""Parser: source text -> unchecked AST (names, spans, precedence, syntax errors)."""
import pytest

from tcpy.errors import TCSyntaxError
from tcpy.lang import ast
from tcpy.lang.parser import parse_program
from tcpy.lang.types import ScalarType

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
