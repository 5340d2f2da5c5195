"""Property: printing an AST and parsing the text back gives the same AST.

Random syntax trees cover every construct of the grammar (all operators at every nesting,
ternaries, casts to every type, builtin and min/max calls, dimension references, all
assignment operators, where clauses of all three kinds, ``<=>``, rank-0 statements, typed
and inferred returns, several defs); a second property checks whole checked programs.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.lang import ast
from tcpy.lang.builtins import BUILTINS
from tcpy.lang.parser import KEYWORDS, parse_program
from tcpy.lang.types import TYPE_NAMES, ScalarType

names = st.from_regex(r"[_a-zA-Z][_a-zA-Z0-9]{0,5}", fullmatch=True).filter(
    lambda s: s not in KEYWORDS and s not in BUILTINS
)
scalar_types = st.sampled_from(sorted(set(TYPE_NAMES.values()), key=lambda t: t.name))
int_lits = st.integers(0, 2**31 - 1).map(ast.IntLit)
float_lits = st.floats(0, 1e30, allow_nan=False, allow_infinity=False).map(ast.FloatLit)
BINARY_OPS = ("||", "&&", "<", ">", "<=", ">=", "==", "!=", "+", "-", "*", "/", "%")


def _calls(children):
    builtin = st.sampled_from(sorted(BUILTINS)).flatmap(
        lambda f: st.lists(children, min_size=BUILTINS[f], max_size=BUILTINS[f]).map(
            lambda args: ast.Call(f, tuple(args))
        )
    )
    min_max = st.builds(lambda f, a, b: ast.Call(f, (a, b)), st.sampled_from(["min", "max"]), children, children)
    return builtin | min_max


def _extend(children):
    return st.one_of(
        st.builds(ast.Unary, st.sampled_from(["-", "!"]), children),
        st.builds(ast.Binary, st.sampled_from(BINARY_OPS), children, children),
        st.builds(ast.Ternary, children, children, children),
        st.builds(ast.Cast, scalar_types, children),
        st.builds(ast.Access, names, st.lists(children, min_size=1, max_size=3).map(tuple)),  # A() prints as A
        _calls(children),
    )


exprs = st.recursive(
    st.one_of(int_lits, float_lits, names.map(ast.Name), st.builds(ast.DimRef, names, st.integers(0, 7))),
    _extend,
    max_leaves=12,
)

clauses = st.one_of(
    st.builds(ast.RangeConstraint, names, exprs, exprs),
    st.builds(ast.Let, names, exprs),
    st.builds(ast.Exists, exprs),
)

stmts = st.builds(
    lambda target, lhs, op, rhs, equivalent, where: ast.Stmt(
        target, tuple(lhs), op[0], op[1], rhs, tuple(where), equivalent
    ),
    names,
    st.lists(exprs, max_size=3),
    st.sampled_from([(None, False)] + [(r, b) for r in ast.REDUCTIONS for b in (False, True)]),
    exprs,
    st.none() | st.builds(lambda n, a: ast.Equivalent(n, tuple(a)), names, st.lists(exprs, max_size=2)),
    st.lists(clauses, max_size=3),
)

tensor_types = st.builds(
    lambda scalar, dims: ast.TensorType(scalar, tuple(dims)),
    scalar_types,
    st.lists(names.map(ast.Name) | st.integers(0, 64).map(ast.IntLit), max_size=3),
)
params = st.builds(ast.Param, names, tensor_types)
results = params | st.builds(ast.Param, names, st.none())
defs = st.builds(
    lambda name, ps, rs, ss: ast.Def(name, tuple(ps), tuple(rs), tuple(ss)),
    names,
    st.lists(params, max_size=3),
    st.lists(results, max_size=2),
    st.lists(stmts, max_size=3),
)
programs = st.lists(defs, max_size=3).map(lambda ds: ast.Program(tuple(ds)))


@settings(max_examples=250, deadline=None)
@given(exprs)
def test_expression_round_trip(expr):
    src = f"def f() -> () {{ y = {expr} }}"
    assert parse_program(src).defs[0].stmts[0].rhs == expr


@settings(max_examples=150, deadline=None)
@given(programs)
def test_program_round_trip(program):
    text = str(program)
    assert parse_program(text) == program


# Checked programs: a small generator of well-typed defs over float inputs.
_value_leaves = st.sampled_from(["A(i, k)", "A(k, i)", "B(i)", "B(k)", "s", "1.5", "2", "float(k)", "i", "N"])


def _value(children):
    return st.one_of(
        st.builds(lambda a, op, b: f"({a} {op} {b})", children, st.sampled_from("+-*/"), children),
        st.builds(lambda a: f"-{a}", children),
        st.builds(lambda f, a: f"{f}({a})", st.sampled_from(["exp", "tanh", "fabs", "sqrt"]), children),
        st.builds(lambda f, a, b: f"{f}({a}, {b})", st.sampled_from(["min", "max", "pow", "fmax"]), children, children),
        st.builds(lambda c, a, b: f"({c} > 0 ? {a} : {b})", children, children, children),
        st.builds(lambda t, a: f"{t}({a})", st.sampled_from(["float", "double", "half"]), children),
    )


values = st.recursive(_value_leaves, _value, max_leaves=8)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # big strategy repr
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["=", "+=!", "max=!", "*=!", "min=!"]), values), min_size=1, max_size=3))
def test_checked_program_round_trip(statements):
    lines = []
    for n, (op, value) in enumerate(statements):
        if "k" in value:
            op = "+=!" if op == "=" else op
            value += " where k in 0:N"
        lines.append(f"    O{n}(i) {op} {value}")
    outs = ", ".join(f"O{n}" for n in range(len(statements)))
    src = f"def g(float(N, N) A, float(N) B, float s) -> ({outs}) {{\n" + "\n".join(lines) + "\n}\n"
    checked = tcpy.parse(src)
    assert tcpy.parse(str(checked)) == checked
    (d,) = checked.defs
    assert [t.name for t in d.outputs] == [f"O{n}" for n in range(len(statements))]
    for stmt in d.stmts:
        assert all(isinstance(e.type, ScalarType) for e in stmt.rhs.walk())
        assert not any(isinstance(e, ast.Name) for e in stmt.rhs.walk())


TOKENS = [
    "def", "f", "g", "(", ")", "{", "}", "->", ",", "float", "int32", "half", "A", "B", "N", "i", "j", "k",
    "=", "+=!", "+=", "max=!", "min=", "*=!", "+", "-", "*", "/", "%", "?", ":", "<", ">=", "==", "!=", "&&",
    "||", "!", "where", "in", "exists", "<=>", "min", "max", "exp", "pow", "0", "1", "2.5", ".", "#c\n", "\n",
    "$", ";", "[",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join))
def test_token_soup_raises_only_tc_errors(text):
    try:
        tcpy.parse(text)
    except tcpy.TCProgramError as err:
        assert err.span is not None and err.source == text
        str(err)


@settings(max_examples=100, deadline=None)
@given(programs)
def test_sema_on_arbitrary_programs_raises_only_tc_errors(program):
    try:
        checked = tcpy.parse(str(program))
    except tcpy.TCSemanticError as err:
        assert err.span is not None and err.def_name is not None
    else:
        assert tcpy.parse(str(checked)) == checked
