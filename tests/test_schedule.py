"""Schedules and loop IR per target, with no C compiler: register tiles fit the register file,
golden loop-IR dumps, and builds for other ISA levels."""
import collections
import dataclasses
import shutil
import typing
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy import demo
from tcpy.api import SEMANTIC_FLAGS
from tcpy.runtime.build import build_library
from tcpy.loopir import Const, Guard, Node, NestKind, Point, RegisterTile, TileUpdate, map_nodes
from tcpy.schedule import register_tile_shapes
from tcpy.target import PRESETS, Target

GOLDEN = Path(__file__).parent / "golden" / "loopir"
GEMM_F64 = demo.GEMM.replace("float(", "double(")


def compute_schedules(kernel, *shapes):
    """Schedules of the def's own statements (not of the copies passes add)."""
    ir = kernel.specialize(*shapes).ir
    return [n.schedule for n in ir.nests if n.kind is NestKind.COMPUTE and ir.origins[n.stmt] >= 0]


def registers_used(target: Target, element_bytes: int, rows: int, cols: int) -> int:
    """Accumulators + one register per vector of a streamed row + the broadcast operand."""
    vectors = -(-cols // target.lanes(element_bytes))
    return rows * vectors + vectors + 1


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("source, element_bytes", [(demo.GEMM, 4), (GEMM_F64, 8)], ids=["float", "double"])
@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (37, 300, 45)])
def test_register_tiles_fit_the_register_file(preset, source, element_bytes, m, n, k):
    target = Target.preset(preset)
    kernel = tcpy.define(source, options=tcpy.Options(target=target, contraction=False))
    (sched,) = compute_schedules(kernel, (m, k), (k, n))
    assert sched.register_tile is not None
    _, rows, _, cols = sched.register_tile
    assert cols % target.lanes(element_bytes) == 0  # whole vectors
    assert registers_used(target, element_bytes, rows, cols) <= target.vector_registers


@pytest.mark.parametrize("preset", PRESETS)
def test_every_offered_register_tile_fits(preset):
    target = Target.preset(preset)
    for element_bytes in (2, 4, 8):
        shapes = register_tile_shapes(target, element_bytes)
        assert shapes, f"no register tile for {preset}"
        for rows, cols in shapes:
            assert registers_used(target, element_bytes, rows, cols) <= target.vector_registers


def test_register_tiles_follow_the_vector_width():
    cols = {}
    for preset in ("x86-64", "x86-64-v3", "x86-64-v4"):
        kernel = tcpy.define(demo.GEMM, options=tcpy.Options(target=preset, contraction=False))
        (sched,) = compute_schedules(kernel, (512, 512), (512, 512))
        cols[preset] = sched.register_tile[3]
    assert cols == {"x86-64": 8, "x86-64-v3": 16, "x86-64-v4": 32}


def test_register_tile_pass_splits_whole_and_partial_blocks():
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64-v3", contraction=False))
    ir = kernel.specialize((37, 45), (45, 300)).ir
    tiles = [node for nest in ir.nests for node in _walk(nest.body) if isinstance(node, RegisterTile)]
    assert tiles and all(t.rows == 6 and t.cols == 16 for t in tiles)
    assert all(any(isinstance(n, TileUpdate) for n in _walk(t.fast)) for t in tiles)
    assert not any(isinstance(n, TileUpdate) for t in tiles for n in _walk(t.slow))


def _walk(nodes):
    for node in nodes:
        yield node
        for attr in ("body", "then", "other", "fast", "slow"):
            yield from _walk(getattr(node, attr, ()))


LOOP_IR_CASES = {
    "gemm": (demo.GEMM, ((100, 70), (70, 600))),
    "conv2d": (demo.CONV2D, ((2, 8, 12, 12), (16, 8, 3, 3))),
    "attention": (demo.ATTENTION, ((1, 2, 40, 16), (1, 2, 40, 16), (1, 2, 40, 16), 0.25)),
}


@pytest.mark.parametrize("case", sorted(LOOP_IR_CASES))
def test_loop_ir_golden(case, golden):
    source, args = LOOP_IR_CASES[case]
    # the plain loop nests (the contraction engine's nests are one line each; see test_contraction)
    kernel = tcpy.define(source, options=tcpy.Options(target="x86-64-v3", num_threads=2, contraction=False))
    shapes = tuple(a if isinstance(a, tuple) else np.float32(a) for a in args)
    golden.check(GOLDEN / f"{case}.expected", kernel.loop_ir(*shapes))


def test_x86_64_v3_build_has_no_avx512():
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64-v3"))
    source = kernel.c_source((64, 64), (64, 64))
    flags = tcpy.Target.preset("x86-64-v3").compiler_flags("gcc", "12.2.0")
    assert "-march=x86-64-v3" in flags
    assert not any("512" in f for f in flags)
    for avx512 in ("avx512", "__m512", "_mm512", "vector_size(64)"):
        assert avx512 not in source


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_x86_64_v3_kernel_runs_no_avx512_instructions_and_matches_the_host_build():
    if not Target.preset("x86-64-v3").can_run_here():
        pytest.skip("this CPU cannot run x86-64-v3 code")
    rng = np.random.default_rng(0)
    A, B = rng.random((70, 45), np.float32), rng.random((45, 600), np.float32)
    v3 = tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64-v3"))
    host = tcpy.define(demo.GEMM)
    np.testing.assert_allclose(v3(A, B), host(A, B), rtol=1e-5)
    library = build_library(v3.c_source(A, B), flags=list(SEMANTIC_FLAGS), target=Target.preset("x86-64-v3"))
    disassembly = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True).stdout
    assert "vfmadd" in disassembly  # AVX2 + FMA code...
    assert "%zmm" not in disassembly  # ...and no AVX-512 register


def test_targets_are_named_in_explain_and_c_source():
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64"))
    assert "target: x86-64 (x86_64, SSE2" in kernel.explain((8, 8), (8, 8))
    assert "target: x86-64 (x86_64, SSE2" in kernel.c_source((8, 8), (8, 8))


def test_unknown_target_is_an_argument_error():
    with pytest.raises(tcpy.TCArgumentError, match="unknown target 'pentium'; expected 'host' or one of x86-64"):
        tcpy.Options(target="pentium")


def test_a_target_that_is_not_a_name_is_an_argument_error():
    with pytest.raises(tcpy.TCArgumentError, match="target must be a Target or a preset name, got int"):
        tcpy.Options(target=3)


def test_tcpy_target_environment_variable(monkeypatch):
    monkeypatch.setenv("TCPY_TARGET", "x86-64-v3")
    assert tcpy.Options().target.name == "x86-64-v3"
    monkeypatch.setenv("TCPY_TARGET", "host")
    assert tcpy.Options().target == Target.host()


def test_one_walk_reaches_every_node_type():
    # map_nodes goes through every node's children(): into an online attention chain's rows
    # (and its shorter last block of keys and whole rows), into register tiles, both branches of
    # a guard (isl's guards are rare in TC's rectangular domains: one is built here)
    from test_chain import tiny_caches
    v3 = Target.preset("x86-64-v3")
    attention = tcpy.define(demo.ATTENTION, options=tcpy.Options(num_threads=2, target=tiny_caches(v3)))
    gemm = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    loops = tcpy.define(gemm, options=tcpy.Options(target=v3, num_threads=2, contraction=False))
    engine = tcpy.define(gemm, options=tcpy.Options(target=v3, num_threads=2))
    bodies = [nest.body for nest in attention.specialize((1, 2, 13, 16), (1, 2, 70, 16), (1, 2, 70, 16), 0.25).ir.nests]
    bodies += [nest.body for kernel in (loops, engine) for nest in kernel.specialize((37, 50), (50, 45)).ir.nests]
    nodes = (Guard(Const(1), sum(bodies[:len(bodies) // 2], ()), sum(bodies[len(bodies) // 2:], ())),)
    counted = collections.Counter()
    assert map_nodes(nodes, lambda node: counted.update([type(node)])) == nodes
    assert set(counted) == set(typing.get_args(Node))
    # a rewrite rebuilds every kind of parent: each point, wherever it is, is replaced
    renumbered = map_nodes(nodes, lambda node: dataclasses.replace(node, stmt=-1) if isinstance(node, Point) else None)
    points = collections.Counter()
    map_nodes(renumbered, lambda node: points.update([node.stmt]) if isinstance(node, Point) else None)
    assert points == {-1: counted[Point]}
