"""How a statement runs is decided once (tcpy.transform.engines) and read by every later pass."""
import ast
from pathlib import Path

import numpy as np

import tcpy
from tcpy import demo
from tcpy.loopir import ContractionNest, NestKind

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "tcpy"
# The planner's entry points: recognising a contraction and planning it.
PLANNER = {"recognize", "plan", "contraction_of", "engine_of"}
# The deciding pass, and the planner itself (its functions call each other).
ALLOWED = {PACKAGE_DIR / "transform" / "engines.py", PACKAGE_DIR / "transform" / "contraction.py"}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in PLANNER:
                yield name, node.lineno


def test_only_the_deciding_pass_calls_the_planner():
    modules = [*sorted((PACKAGE_DIR / "transform").glob("*.py")), *sorted((PACKAGE_DIR / "codegen").glob("*.py")),
               PACKAGE_DIR / "loopnest.py"]
    assert len(modules) > 8
    found = [f"{path.relative_to(PACKAGE_DIR.parent)}:{line} calls {name}"
             for path in modules if path not in ALLOWED for name, line in _calls(path)]
    assert found == []


def test_a_planner_call_would_be_found(tmp_path):
    module = tmp_path / "pass_.py"
    module.write_text("from .contraction import plan\n\ndef f(con, t):\n    return plan(con, t, 1)\n")
    assert list(_calls(module)) == [("plan", 4)]


def test_every_statement_is_stamped_and_the_nests_follow_the_stamps():
    kernel = tcpy.define(demo.ATTENTION, options=tcpy.Options(target="x86-64-v3", num_threads=2, fuse=False))
    shapes = ((1, 2, 40, 16), (1, 2, 40, 16), (1, 2, 40, 16), np.float32(0.25))
    ir = kernel.specialize(*shapes).ir
    stamped = {i for i, s in enumerate(ir.program.statements) if s.engine is not None}
    engine_nests = {n.stmt for n in ir.nests if n.kind is NestKind.COMPUTE
                    and any(isinstance(node, ContractionNest) for node in n.body)}
    assert stamped == engine_nests == {0, 5}  # the two products
    for index in stamped:
        (node,) = [node for n in ir.nests if n.stmt == index for node in n.body]
        assert node.plan is ir.program.statements[index].engine.plan  # read, not planned again
