"""Golden tests for the front end.

``golden/good/*.tc``: programs that must parse and check. The expected file holds the canonical
source (``str(program)``) and a dump of what sema found: size variables, tensors, and per
statement the output/reduction variables and the typed, resolved expression trees.
Printing and parsing the canonical source again must give the same checked program.

``golden/bad/*.tc``: programs that must fail; the expected file holds the error class and the
rendered diagnostic. Run ``pytest --accept`` to rewrite expected files after a deliberate change.
"""
from pathlib import Path

import pytest

import tcpy
from tcpy.errors import TCProgramError
from tcpy.lang import ast
from tcpy.lang.visit import inline_lets

GOLDEN = Path(__file__).parent / "golden"
GOOD = sorted((GOLDEN / "good").glob("*.tc"))
BAD = sorted((GOLDEN / "bad").glob("*.tc"))


def sexpr(e: ast.Expr) -> str:
    """A typed S-expression of a checked expression: ``(node detail... children...):type``."""
    match e:
        case ast.IntLit(value) | ast.FloatLit(value):
            head = f"{value!r}"
        case ast.IndexVar(name):
            head = f"index {name}"
        case ast.SizeVar(name):
            head = f"size {name}"
        case ast.LetVar(name):
            head = f"let {name}"
        case ast.DimRef(tensor, dim):
            head = f"dim {tensor}.{dim}"
        case ast.Access(tensor, indices):
            head = " ".join([f"read {tensor}"] + [sexpr(i) for i in indices])
        case ast.Call(func, args):
            head = " ".join([f"call {func}"] + [sexpr(a) for a in args])
        case ast.Cast(to, operand):
            head = f"cast {to} {sexpr(operand)}"
        case ast.Unary(op, operand):
            head = f"{op} {sexpr(operand)}"
        case ast.Binary(op, lhs, rhs):
            head = f"{op} {sexpr(lhs)} {sexpr(rhs)}"
        case ast.Ternary(cond, then, other):
            head = f"? {sexpr(cond)} {sexpr(then)} {sexpr(other)}"
        case _:
            raise TypeError(e)
    return f"({head}):{e.type}"


def dump(program: ast.Program) -> str:
    lines = []
    for d in program.defs:
        lines.append(f"def {d.name}")
        lines.append(f"  size vars: {', '.join(d.size_vars) or '-'}")
        for t in d.tensors:
            lines.append(f"  {t.role} {t.name}: {t.scalar} rank {t.rank}")
        for n, s in enumerate(d.stmts, 1):
            lines.append(f"  stmt {n}: {s.target} {s.op}")
            lines.append(f"    output vars: {', '.join(s.output_vars) or '-'}")
            lines.append(f"    reduction vars: {', '.join(s.reduction_vars) or '-'}")
            lines.append(f"    rhs: {sexpr(s.rhs)}")
            for c in s.where:
                if isinstance(c, ast.RangeConstraint):
                    lines.append(f"    where {c.var} in {sexpr(c.lo)} : {sexpr(c.hi)}")
                elif isinstance(c, ast.Let):
                    lines.append(f"    where let {c.name} = {sexpr(c.expr)}")
                else:
                    lines.append(f"    where exists {sexpr(c.expr)}")
            inlined = inline_lets(s)
            if inlined is not s:
                lines.append(f"    inlined: {inlined}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_good_program(path, golden):
    program = tcpy.parse(path.read_text(), path.name)
    text = str(program)
    assert tcpy.parse(text) == program, "printing and re-parsing changed the program"
    golden.check(path.with_suffix(".expected"), f"{text}\n{dump(program)}")


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_program(path, golden):
    with pytest.raises(TCProgramError) as info:
        tcpy.parse(path.read_text(), path.name)
    golden.check(path.with_suffix(".err"), f"{type(info.value).__name__}\n{info.value}\n")


def test_enough_goldens():
    assert len(GOOD) >= 40 and len(BAD) >= 30
