"""How a statement runs is decided once (tcpy.transform.engines) and read by every later pass."""
import ast
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy import demo
from tcpy.loopir import BlockChain, ContractionNest, NestKind
from tcpy.target import Target

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "tcpy"
DECIDING_PASS = PACKAGE_DIR / "transform" / "engines.py"
# The planner's entry points (recognising a contraction and planning it), and the modules that
# may call them: the deciding pass and the planner itself (its functions call each other).
ENGINE_PLANNER = {"recognize", "plan", "winograd_over_gemm", "contraction_of", "engine_of"}
ALLOWED = {DECIDING_PASS, *(PACKAGE_DIR / "transform" / name for name in ("contraction.py", "recognition.py"))}
# The loop scheduler: only the deciding pass calls it.
LOOP_SCHEDULER = {"choose_schedule"}
# A chain's products on a block of rows are planned when its plan is decided, by the chain pass
# (the block, its rows and where b is packed are the chain's own decisions, made after fusion).
CHAIN_PASS = PACKAGE_DIR / "transform" / "chains.py"
BLOCK_PLANNER = {"plan_block"}


def _calls(path: Path, names):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in names:
                yield name, node.lineno


def test_only_the_deciding_pass_calls_the_planner_and_the_scheduler():
    modules = [*sorted((PACKAGE_DIR / "transform").glob("*.py")), *sorted((PACKAGE_DIR / "codegen").rglob("*.py")),
               PACKAGE_DIR / "loopnest.py", PACKAGE_DIR / "lower_chains.py", PACKAGE_DIR / "api.py",
               PACKAGE_DIR / "tuning.py"]
    assert len(modules) > 8
    found = [f"{path.relative_to(PACKAGE_DIR.parent)}:{line} calls {name}"
             for path in modules if path not in ALLOWED for name, line in _calls(path, ENGINE_PLANNER)]
    found += [f"{path.relative_to(PACKAGE_DIR.parent)}:{line} calls {name}"
              for path in modules if path != DECIDING_PASS for name, line in _calls(path, LOOP_SCHEDULER)]
    found += [f"{path.relative_to(PACKAGE_DIR.parent)}:{line} calls {name}"
              for path in modules if path != CHAIN_PASS for name, line in _calls(path, BLOCK_PLANNER)]
    assert found == []


def test_a_planner_call_would_be_found(tmp_path):
    module = tmp_path / "pass_.py"
    module.write_text("from .contraction import plan\n\ndef f(con, t):\n    return plan(con, t, 1)\n")
    assert list(_calls(module, ENGINE_PLANNER)) == [("plan", 4)]
    module.write_text("from .. import schedule\n\ndef f(s, e, t, o):\n    return schedule.choose_schedule(s, e, {}, t, o)\n")
    assert list(_calls(module, LOOP_SCHEDULER)) == [("choose_schedule", 4)]
    module.write_text("from .engines import plan_block\n\ndef f(b, o):\n    return plan_block(b, o, True)\n")
    assert list(_calls(module, BLOCK_PLANNER)) == [("plan_block", 4)]


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


LOOPS_ONLY = """
def f(float(M, K) A, float(K, N) B, float(N) bias) -> (C, D) {
    C(m, n) +=! A(m, k) * B(k, n)
    D(m, n) = C(m, n) + bias(n)
}
"""


def test_loop_statements_are_stamped_with_their_schedules_and_the_nests_follow_them():
    options = tcpy.Options(target="x86-64-v3", num_threads=2, contraction=False, fuse=False)
    kernel = tcpy.define(LOOPS_ONLY, options=options)
    ir = kernel.specialize((256, 128), (128, 256), (256,)).ir
    statements = ir.program.statements
    assert all((s.engine is None) != (s.loops is None) for s in statements)
    compute = {n.stmt: n.schedule for n in ir.nests if n.kind is NestKind.COMPUTE}
    assert set(compute) == set(range(len(statements)))
    for index, schedule in compute.items():
        assert schedule == statements[index].loops.compute  # read, not scheduled again
    product = statements[-2].loops.compute  # (C, after the copy the packing pass added)
    assert product.register_tile is not None and product.parallel_dims > 0
    explained = str(kernel.explain((256, 128), (128, 256), (256,)))
    assert "register tile" in explained
    assert "why: leading output loops parallel" in explained


def test_a_fused_group_stamps_its_statements_again_for_the_shared_loops():
    options = tcpy.Options(target="x86-64-v3", num_threads=2)
    source = (Path(__file__).parent / "golden" / "good" / "softmax_temporaries.tc").read_text()
    ir = tcpy.define(source, options=options).specialize((512, 512)).ir
    (group,) = ir.program.groups
    for index in group.statements:
        schedule = ir.program.statements[index].loops.compute
        assert schedule.parallel_dims == 0  # the shared loops around them are the parallel ones
        assert any("fused group" in reason for reason in schedule.reasons)


# ----------------------------------------------------------------------------- plan overrides

GEMM_SHAPES = ((96, 200), (200, 400))  # packed path, grid 1x1x2x1 by default at 2 threads
# plans are compared on a preset (never the host's); the kernels run, so it must run here
RUNNABLE_V3 = "x86-64-v3" if Target.preset("x86-64-v3").can_run_here() else "x86-64"


def _engine_plans(kernel, *shapes):
    ir = kernel.specialize(*shapes).ir
    return [node.plan for nest in ir.nests for node in nest.body if isinstance(node, ContractionNest)]


def _check_against_reference(source, options, *arrays):
    kernel = tcpy.define(source, options=options)
    got = kernel(*arrays)
    want = tcpy.define(source, backend="reference")(*arrays)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    return kernel


@pytest.mark.parametrize("overrides, expected", [
    ({"mr": 4, "nr": 8}, {"mr": 4, "nr": 8}),
    ({"kc": 64}, {"kc": 64}),
    ({"mc": 24, "nc": 64}, {"mc": 24, "nc": 64}),
    ({"path": "small"}, {"path": "small"}),
    ({"path": "stream"}, {"path": "stream"}),
    ({"grid": (1, 2, 1, 1)}, {"grid": (1, 2, 1, 1)}),
], ids=["micro-tile", "kc", "mc-nc", "small", "stream", "grid"])
def test_each_plan_field_can_be_set(overrides, expected):
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal(s).astype(np.float32) for s in GEMM_SHAPES)
    options = tcpy.Options(target=RUNNABLE_V3, num_threads=2, plan=overrides)
    (default,) = _engine_plans(tcpy.define(demo.GEMM, options=tcpy.Options(target=RUNNABLE_V3, num_threads=2)),
                               *GEMM_SHAPES)
    assert any(getattr(default, k) != v for k, v in expected.items())  # (the override changes something)
    kernel = tcpy.define(demo.GEMM, options=options)
    np.testing.assert_allclose(kernel(A, B), A @ B, rtol=1e-4, atol=1e-3)
    (planned,) = _engine_plans(kernel, A, B)
    assert {k: getattr(planned, k) for k in expected} == expected
    assert "set by Options.plan" in str(kernel.explain(A, B))


def test_a_chain_row_block_can_be_set():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float32) for _ in range(3))
    options = tcpy.Options(target=RUNNABLE_V3, num_threads=2, plan={"rows": 12})
    kernel = _check_against_reference(demo.ATTENTION, options, q, k, v, np.float32(0.25))
    (chain,) = [n for nest in kernel.specialize(q, k, v, np.float32(0.25)).ir.nests for n in nest.body
                if isinstance(n, BlockChain)]
    assert chain.rows == 12


@pytest.mark.parametrize("overrides, message", [
    ({"nr": 12}, "Options.plan['nr'] must be a multiple of 8 for this contraction, got 12"),
    ({"mr": 9}, "Options.plan['mr'] must be a micro-tile of at most 8 rows"),
    ({"kc": 66}, "Options.plan['kc'] must be a multiple of 4 for this contraction, got 66"),
    ({"grid": (1, 2, 2, 1)}, "Options.plan['grid'] must be (batch, M, N, K) cells of at most 2 thread(s)"),
    ({"grid": (2, 1, 1, 1)}, "Options.plan['grid'] must be (batch, M, N, K) cells of at most 2 thread(s) in all and "
                             "at most (1, 16, 25, 1) for this contraction on the packed path, got (2, 1, 1, 1)"),
    ({"path": "direct"}, "Options.plan['path'] must be a path this contraction can run (packed, small, stream), "
                         "got 'direct'"),
    ({"rows": 7}, "Options.plan['rows'] must be a multiple of the chain's micro-tile rows"),
])
def test_a_plan_a_statement_cannot_run_with_is_an_option_error(overrides, message):
    source, shapes = (demo.ATTENTION, ((1, 2, 40, 16),) * 3 + (np.float32(0.25),)) if "rows" in overrides \
        else (demo.GEMM, GEMM_SHAPES)
    kernel = tcpy.define(source, options=tcpy.Options(target="x86-64-v3", num_threads=2, plan=overrides))
    with pytest.raises(tcpy.TCOptionError) as err:
        kernel.c_source(*shapes)
    assert message in str(err.value)


@pytest.mark.parametrize("plan, message", [
    ({"bogus": 1}, "Options.plan must be fields among path, grid, mr, nr, kc, mc, nc, rows, got 'bogus' (str)"),
    ({"path": "fast"}, "Options.plan['path'] must be one of 'packed', 'small', 'stream', 'direct', 'batch_lanes', "
                       "'direct_conv', got 'fast' (str)"),
    ({"grid": (1, 2)}, "Options.plan['grid'] must be 4 ints from 1 to 65536"),
    ({"kc": 0}, "Options.plan['kc'] must be an int from 1 to"),
    ({"mr": True}, "Options.plan['mr'] must be an int from 1 to"),
    ([("mr", 4)], "Options.plan must be a mapping from plan field to value"),
])
def test_bad_plan_options_are_refused_at_once(plan, message):
    with pytest.raises(tcpy.TCOptionError) as err:
        tcpy.Options(plan=plan)
    assert message in str(err.value)


# ----------------------------------------------------------------------------- the passes, one by one

ATTENTION_SHAPES = ((1, 2, 40, 16), (1, 2, 40, 16), (1, 2, 40, 16), np.float32(0.25))


def test_the_ir_after_each_pass_can_be_read():
    kernel = tcpy.define(demo.ATTENTION, options=tcpy.Options(target="x86-64-v3", num_threads=2))
    engines = kernel.loop_ir(*ATTENTION_SHAPES, after="engines")
    assert engines.startswith("program attention sizes")
    assert engines.count("  engine: ") == 2 and "fused" not in engines  # the two products, not fused yet
    assert engines.count("  loops: ") == 4  # the softmax's statements, with their schedules
    fused = kernel.loop_ir(*ATTENTION_SHAPES, after="fusion")
    assert "fused S0-S5 over b, h, l" in fused
    assert kernel.loop_ir(*ATTENTION_SHAPES, after="register_tiles") == kernel.loop_ir(*ATTENTION_SHAPES)
    with pytest.raises(tcpy.TCOptionError, match="loop_ir's after= must name a pass .*got 'fuse'"):
        kernel.loop_ir(*ATTENTION_SHAPES, after="fuse")


def test_tcpy_debug_2_prints_the_ir_after_each_pass(monkeypatch, capsys):
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64-v3", num_threads=2))
    monkeypatch.setenv("TCPY_DEBUG", "2")
    kernel.c_source((64, 64), (64, 64))
    err = capsys.readouterr().err
    assert "--- gemm after engines\nprogram gemm" in err and "--- gemm after lower\nkernel gemm" in err
    assert [line.split()[-1] for line in err.splitlines() if line.startswith("--- gemm after")] == [
        "zeros", "engines", "packing", "epilogues", "fusion", "chains", "phases", "lower", "register_tiles"]
    monkeypatch.setenv("TCPY_DEBUG", "1")  # compiler commands only
    kernel.c_source((64, 65), (65, 64))
    assert "after" not in capsys.readouterr().err
