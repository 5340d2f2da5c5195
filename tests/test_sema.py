"""Semantic checks: name resolution, types, statement classification, and every diagnostic
(class, the words of its message, and its line and column)."""
import pytest

import tcpy
from tcpy.errors import TCLookupError, TCSemanticError, TCSyntaxError
from tcpy.lang import ast
from tcpy.lang.parser import parse_program
from tcpy.lang.sema import check_program, select_def
from tcpy.lang.visit import inline_lets, map_expr
from tcpy.lang.types import ScalarType as S

MATMUL = """def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""


def test_matmul_checked():
    (d,) = tcpy.parse(MATMUL).defs
    assert d.size_vars == ("M", "K", "N")
    assert d.tensors == (
        ast.TensorInfo("A", "input", S.FLOAT32, 2),
        ast.TensorInfo("B", "input", S.FLOAT32, 2),
        ast.TensorInfo("C", "output", S.FLOAT32, 2),
    )
    (s,) = d.stmts
    assert (s.output_vars, s.reduction_vars, s.index_vars) == (("m", "n"), ("k",), ("m", "n", "k"))
    assert s.lhs == (ast.IndexVar("m"), ast.IndexVar("n"))
    assert all(isinstance(i, ast.IndexVar) and i.type is S.INT32 for a in s.rhs.children() for i in a.indices)
    assert s.rhs.type is S.FLOAT32


def test_reduction_vars_follow_tc_creation_order():
    # TC creates index variables from the left-hand side, then where clauses, then the rhs.
    src = "def f(float(N, M, P) A) -> (O) { O(i) +=! A(i, j, k) where k in 0:P }"
    (s,) = tcpy.parse(src).defs[0].stmts
    assert s.reduction_vars == ("k", "j")


def test_index_var_only_in_exists_or_where_is_a_reduction_var():
    src = "def f(float(N) A, float(N) B) -> (O) { O(i) +=! A(i) where exists B(j), q in 0:2 }"
    (s,) = tcpy.parse(src).defs[0].stmts
    assert s.reduction_vars == ("j", "q")


def test_name_resolution_kinds():
    src = "def f(float(N) A, float s) -> (O) { O(i) = A(i) * s + N + i + A.0 + x where x = 1 }"
    rhs = tcpy.parse(src).defs[0].stmts[0].rhs
    kinds = {type(n).__name__ for n in rhs.walk()}
    assert kinds == {"Binary", "Access", "IndexVar", "SizeVar", "DimRef", "LetVar"}
    scalar_read = [n for n in rhs.walk() if isinstance(n, ast.Access) and n.tensor == "s"]
    assert scalar_read == [ast.Access("s", ())] and scalar_read[0].type is S.FLOAT32


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("1", S.INT32),
        ("1.0", S.FLOAT32),
        ("1 + 1.0", S.FLOAT32),
        ("D(i) + F(i)", S.FLOAT64),
        ("H(i) * 2", S.FLOAT16),
        ("H(i) * F(i)", S.FLOAT32),
        ("I8(i) + U8(i)", S.INT8),
        ("U8(i) + U16(i)", S.UINT16),
        ("I8(i) + U32(i)", S.INT32),
        ("I64(i) + 1", S.INT64),
        ("I8(i) > 0", S.BOOL),
        ("F(i) > 0 && I8(i) < 0", S.BOOL),
        ("!(F(i) > 0)", S.BOOL),
        ("exp(I8(i))", S.FLOAT32),
        ("exp(D(i))", S.FLOAT64),
        ("pow(H(i), H(i))", S.FLOAT32),
        ("max(I8(i), U8(i))", S.INT8),
        ("F(i) > 0 ? I8(i) : D(i)", S.FLOAT64),
        ("int64(F(i))", S.INT64),
        ("-U8(i)", S.UINT8),
        ("i + N + F.0", S.INT32),  # TC's index type (issue 34, item 4); computed in 64 bits
        ("int64(i * N)", S.INT64),
        ("I8(i) + i", S.INT32),
        ("I64(i) + i", S.INT64),
    ],
)
def test_expression_types(expr, expected):
    src = (
        "def f(float(N) F, double(N) D, half(N) H, int8(N) I8, uint8(N) U8, uint16(N) U16,"
        f" uint32(N) U32, int64(N) I64) -> (O) {{ O(i) = {expr} }}"
    )
    d = tcpy.parse(src).defs[0]
    assert d.stmts[0].rhs.type is expected
    assert d.tensor("O").scalar is expected


def test_declared_output_type_wins_and_widening_is_allowed():
    src = "def f(float(N) A) -> (double(N) O) { O(i) = A(i) }"
    assert tcpy.parse(src).defs[0].tensor("O").scalar is S.FLOAT64


def test_temporaries_and_roles():
    src = """def f(float(N) A) -> (O) {
        t(i) = A(i) * 2
        u +=! t(i)
        O(i) = t(i) / u
    }"""
    d = tcpy.parse(src).defs[0]
    assert [(t.name, t.role, t.rank) for t in d.tensors] == [
        ("A", "input", 1), ("O", "output", 1), ("t", "temporary", 1), ("u", "temporary", 0)
    ]
    assert [t.name for t in d.temporaries] == ["t", "u"]
    assert [t.name for t in d.outputs] == ["O"]


def test_init_reduction_without_reduction_vars_is_kept_as_written():
    (s,) = tcpy.parse("def f(float(N) A) -> (O) { O(i) +=! A(i) }").defs[0].stmts
    assert (s.op, s.reduction_vars) == ("+=!", ())


def test_inline_lets_substitutes_in_order_and_drops_lets():
    src = "def f(float(N) A, float(N) B) -> (O) { O(i) = y * x where x = A(i), y = x + 1, exists B(i) }"
    (s,) = tcpy.parse(src).defs[0].stmts
    inlined = inline_lets(s)
    assert str(inlined) == "O(i) = (A(i) + 1) * A(i) where exists B(i)"
    assert not any(isinstance(n, ast.LetVar) for n in inlined.rhs.walk())
    assert inlined.rhs.type is S.FLOAT32
    assert inline_lets(inlined) is inlined


def test_map_expr_rebuilds_bottom_up():
    e = tcpy.parse("def f(float(N) A) -> (O) { O(i) = A(i + 1) * 2 }").defs[0].stmts[0].rhs
    doubled = map_expr(e, lambda n: ast.IntLit(n.value * 10) if isinstance(n, ast.IntLit) else None)
    assert str(doubled) == "A(i + 10) * 20"


def test_select_def():
    program = tcpy.parse(MATMUL + "\ndef g(float a) -> (b) { b = a }\n")
    assert select_def(program, "g").name == "g"
    with pytest.raises(TCLookupError, match="no def named 'h'; the source defines 'matmul', 'g'"):
        select_def(program, "h")
    with pytest.raises(TCLookupError, match="several defs"):
        select_def(program)
    assert select_def(tcpy.parse(MATMUL)).name == "matmul"
    with pytest.raises(TCLookupError, match="defines no def"):
        select_def(tcpy.parse("# nothing\n"))


def test_check_program_does_not_mutate_its_input():
    unchecked = parse_program(MATMUL)
    checked = check_program(unchecked)
    assert unchecked.defs[0].stmts[0].output_vars == ()
    assert isinstance(unchecked.defs[0].stmts[0].lhs[0], ast.Name)
    assert checked == check_program(unchecked)


H = "def f(float(N, M) A, float x) -> (B) {\n"

# (source, error class, words the message must contain, line, column)
ERRORS = [
    (H + "  B(i) +=! A(i, j) where j in 0:Q }", TCSemanticError, ["unknown name 'Q'", "range of 'j'"], 2, 33),
    (H + "  B(i) +=! A(i, j) where j in 0:i }", TCSemanticError, ["index variable 'i'", "range of 'j'"], 2, 33),
    (H + "  B(i) +=! A(i, j) where j in 0:A(0, 0) }", TCSemanticError, ["tensor 'A' cannot be read"], 2, 33),
    (H + "  B(i) +=! A(i, j) where j in 0:M / 2.0 }", TCSemanticError, ["must be an integer", "float"], 2, 33),
    (H + "  B(A) = 1 }", TCSemanticError, ["'A' is a tensor", "index variable"], 2, 5),
    (H + "  B(M) = 1 }", TCSemanticError, ["'M' is a size variable", "index variable"], 2, 5),
    (H + "  B(i) = A(i, 0) where N in 0:3 }", TCSemanticError, ["'N' is a size variable"], 2, 24),
    (H + "  B(i) = A }", TCSemanticError, ["'A' is a tensor with 2 dimensions"], 2, 10),
    (H + "  B(i) = A(i, 0, 1) }", TCSemanticError, ["expected 2 indices for 'A' but found 3"], 2, 10),
    (H + "  B(i) = A(i) }", TCSemanticError, ["expected 2 indices for 'A' but found 1"], 2, 10),
    (H + "  A(i, j) = 0 }", TCSemanticError, ["cannot write to 'A'", "inputs are immutable"], 2, 3),
    (H + "  x = 0 }", TCSemanticError, ["cannot write to 'x'", "inputs are immutable"], 2, 3),
    (H + "  T(i) += A(i, j)\n B(i) = T(i) }", TCSemanticError, ["temporary 'T' is accumulated with '+='", "'+=!'"],
     2, 3),
    (H + "  T(i) *= A(i, j)\n B(i) = T(i) }", TCSemanticError, ["'*='", "'*=!'", "from 1"], 2, 3),
    (H + "  B(i + 1) = A(i, 0) }", TCSemanticError, ["plain index variables", "'i + 1'"], 2, 5),
    (H + "  B(2) = A(0, 0) }", TCSemanticError, ["plain index variables", "'2'"], 2, 5),
    (H + "  B(i, i) = A(i, i) }", TCSemanticError, ["'i' appears twice"], 2, 8),
    (H + "  B(i) = softplus(A(i, 0)) }", TCSemanticError, ["unknown function or tensor 'softplus'"], 2, 10),
    (H + "  B(i) = pow(A(i, 0)) }", TCSemanticError, ["'pow' takes 2 arguments but is given 1"], 2, 10),
    (H + "  B(i) = exp(A(i, 0), 1) }", TCSemanticError, ["'exp' takes 1 argument but is given 2"], 2, 10),
    ("def f(float(N) A, float(N) A) -> (B) { B(i) = A(i) }", TCSemanticError, ["duplicate name 'A'", "parameter"], 1, 28),
    ("def f(float(N) A) -> (B, B) { B(i) = A(i) }", TCSemanticError, ["duplicate name 'B'", "output"], 1, 26),
    ("def f(float(N) A) -> (A) { A(i) = 1 }", TCSemanticError, ["duplicate name 'A'"], 1, 23),
    ("def f(float(N) A, float(A) C) -> (B) { B(i) = C(i) }", TCSemanticError, ["'A' is a tensor", "size variable"], 1, 25),
    ("def f(float(N) A) -> (B, C) { B(i) = A(i) }", TCSemanticError, ["output 'C' is never written"], 1, 26),
    ("def f(float(N) A) -> (float(N) B, C) {\n C(i) = A(i) }", TCSemanticError, ["'B' is never written"], 1, 32),
    ("def f(double(N) A) -> (float(N) B) { B(i) = A(i) }", TCSemanticError,
     ["assigning double to float output 'B' needs a cast"], 1, 45),
    ("def f(float(N) A) -> (int8(N) B) { B(i) = int32(A(i)) }", TCSemanticError, ["int32 to int8"], 1, 43),
    ("def f(float(N) A) -> (B) {\n B(i) = A(i)\n B(i) = double(A(i)) }", TCSemanticError,
     ["assigning double to float output 'B'"], 3, 9),
    ("def f(float(N) A) -> (float(N) B) { B(i, j) = A(i) where j in 0:N }", TCSemanticError,
     ["declared with 1 dimension", "2 indices"], 1, 37),
    (H + "  B(i) = A(i, x) }", TCSemanticError, ["index 1 of 'A' must be an integer but is float"], 2, 15),
    (H + "  B(i) = A(i, 0) ? 1 : 0 }", TCSemanticError, ["condition of '?:' must be bool but is float"], 2, 10),
    (H + "  B(i) = A(i, 0) > 0 || x ? 1 : 0 }", TCSemanticError, ["right operand of '||' must be bool"], 2, 25),
    (H + "  B(i) = !x }", TCSemanticError, ["operand of '!' must be bool"], 2, 11),
    (H + "  B(i) = T(i)\n  T(i) = A(i, 0) }", TCSemanticError, ["temporary 'T' is read before it is written"], 2, 10),
    ("def f(float(N) A) -> (B, C) {\n C(i) = B(i)\n B(i) = A(i) }", TCSemanticError,
     ["output 'B' is read before it is written"], 2, 9),
    ("def f(float(N) A) -> (B, C) {\n C = B.0\n B(i) = A(i) }", TCSemanticError, ["output 'B' is read before"], 2, 6),
    (H + "  B(i) = A(i, j) }", TCSemanticError, ["'j' appears only on the right-hand side", "reduction"], 2, 15),
    (H + "  B(i) = A(i, 0) + A.2 }", TCSemanticError, ["'A' has 2 dimensions", "'A.2' does not exist"], 2, 20),
    (H + "  B(i) = A(i, 0) + Z.0 }", TCSemanticError, ["unknown tensor 'Z'"], 2, 20),
    ("def f(float(N) exp) -> (B) { B(i) = 1 }", TCSemanticError, ["'exp' is a builtin function"], 1, 16),
    (H + "  B(sqrt) = 1 }", TCSemanticError, ["'sqrt' is a builtin function"], 2, 5),
    ("def f(float(N) A) -> (B) {\n  tanh(i) = A(i)\n  B(i) = A(i) }", TCSemanticError, ["'tanh' is a builtin"], 2, 3),
    (H + "  B(i) = log }", TCSemanticError, ["call it as log(...)"], 2, 10),
    (H + "  B(i) = i(0) }", TCSemanticError, ["'i' is a scalar variable"], 2, 10),
    (H + "  B(i) = M(0) }", TCSemanticError, ["'M' is a size variable, not a tensor"], 2, 10),
    ("def f(float(N) A) -> (float(P) B) { B(i) = A(i) }", TCSemanticError, ["'P' of output 'B'"], 1, 29),
    ("def f(float(N) A) -> (B) { B(i) = A(i) }\ndef f(float a) -> (b) { b = a }", TCSemanticError,
     ["def 'f' is defined twice"], 2, 5),
    (H + "  B(i) = x where x = A(i, 0) }", TCSemanticError, ["'x' is a tensor", "let"], 2, 18),
    (H + "  B(i) = y where y = A(i, 0), y = 2 }", TCSemanticError, ["'y' is already defined"], 2, 31),
    (H + "  B(i) = A(i, 0) + 2147483648 }", TCSemanticError, ["does not fit in int32"], 2, 20),
    (H + "  B(i) A(i, 0) }", TCSyntaxError, ["expected an assignment operator", "found 'A'"], 2, 8),
    (H + "  B(i) =+ A(i, 0) }", TCSyntaxError, ["'=+' is not an operator", "'+=!'"], 2, 9),
    (H + "  B(i) = (A(i, 0) }", TCSyntaxError, ["unbalanced parentheses", "'(' at 2:10"], 2, 19),
    (H + "  B(i) = A(i, 0)) }", TCSyntaxError, ["this ')' closes no '('"], 2, 17),
    ("def f(float(N) A) (B) { }", TCSyntaxError, ["expected '->'"], 1, 19),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i)\n", TCSyntaxError, ["ends before the '}'"], 2, 14),
    (H + "  B(i) = A(i, 0); }", TCSyntaxError, ["';'"], 2, 17),
    ("def f(float(N) A) -> (B) { B(i) = A(i) where in 0:N }", TCSyntaxError, ["expected a where clause"], 1, 46),
]


@pytest.mark.parametrize("src, cls, words, line, column", ERRORS)
def test_error(src, cls, words, line, column):
    with pytest.raises(cls) as info:
        tcpy.parse(src)
    err = info.value
    for w in words:
        assert w in err.message
    assert (err.line, err.column) == (line, column), str(err)
    assert err.def_name == "f"
    rendered = str(err)
    assert rendered.startswith(f"<string>:{line}:{column}: error: in def 'f': ")
    caret_line = rendered.splitlines()[2]
    assert caret_line.index("^") == 4 + column - 1


def test_filename_is_reported():
    with pytest.raises(TCSemanticError) as info:
        tcpy.parse("def f(float(N) A) -> (B) { B(i) = Q(i) }", filename="kernels.tc")
    assert str(info.value).startswith("kernels.tc:1:35: error: in def 'f': unknown function or tensor 'Q'")


def test_crlf_and_tabs_keep_columns():
    src = "def f(float(N) A) -> (B) {\r\n\tB(i) = A(i) + Q(i)\r\n}\r\n"
    with pytest.raises(TCSemanticError) as info:
        tcpy.parse(src)
    assert (info.value.line, info.value.column) == (2, 16)
    assert str(info.value).splitlines()[1:] == ["     B(i) = A(i) + Q(i)", "                   ^~~~"]
