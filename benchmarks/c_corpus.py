"""Dump the generated C of a fixed corpus of programs into a directory, so that two commits
compare by ``diff -r``: a refactoring of the compiler that must not change its output is
checked by running this script on both commits.

Run it as::

    python benchmarks/c_corpus.py OUT_DIR [--programs N] [--seed S] [--only GROUP]

The corpus (no C compiler needed, nothing is built or run):

* ``golden``: the programs of the loop-IR goldens (tests/golden/loopir), with their options;
* ``bench``: every kernel of benchmarks/bench.py (default, long and resnet suites) and of the
  demo, for the x86-64, x86-64-v3 and x86-64-v4 presets at 1 and 2 threads;
* ``drawn-*``: programs drawn at a fixed seed from the hypothesis strategies of the tests
  (tests/strategies.py and the contraction, convolution, Winograd, chain, online, epilogue and
  row-fusion strategies); a program whose options name no target gets the presets in turn.

Each program is one file ``GROUP/NNNN-NAME.c``: a comment with the source, shapes and options,
then the C (or the error a program raised). Files are written in a fixed order with no
timestamps, so equal compilers give equal trees.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]  # a checkout, its tests and bench.py

import tcpy  # noqa: E402
from tcpy import demo  # noqa: E402
from tcpy.errors import TCError  # noqa: E402
from tcpy.target import Target  # noqa: E402

PRESETS = ("x86-64", "x86-64-v3", "x86-64-v4")


def shapes_of(args) -> tuple:
    """Arrays as their shapes (specialisation reads sizes only); scalars stay as they are."""
    return tuple(a.shape if isinstance(a, np.ndarray) else a for a in args)


def describe(options: dict) -> str:
    """The options as stable text (a Target by its key, not its address)."""
    def show(value):
        return f"Target{value.key()}" if isinstance(value, Target) else repr(value)
    return "{" + ", ".join(f"{k}: {show(v)}" for k, v in sorted(options.items())) + "}"


def render(source: str, shapes: tuple, options: dict) -> str:
    """The file for one program: a header naming it, then its C or the error it raised."""
    header = f"/* options {describe(options)}\n   shapes {shapes!r}\n{source.strip()}\n*/\n"
    try:
        kernel = tcpy.define(source, options=tcpy.Options(**options))
        return header + kernel.c_source(*shapes)
    except TCError as err:
        return header + f"/* {type(err).__name__}: {err} */\n"


# ----------------------------------------------------------------------------- the fixed programs

def golden_programs():
    """The loop-IR goldens' programs with their options (see test_schedule and test_online)."""
    from test_chain import tiny_caches
    from test_schedule import LOOP_IR_CASES
    for name in sorted(LOOP_IR_CASES):
        source, args = LOOP_IR_CASES[name]
        shapes = tuple(a if isinstance(a, tuple) else np.float32(a) for a in args)
        options = {"target": "x86-64-v3", "num_threads": 2, "contraction": False}
        yield name, source, shapes, options
        yield f"{name}-engine", source, shapes, {"target": "x86-64-v3", "num_threads": 2}
    shapes = ((1, 2, 13, 16), (1, 2, 70, 16), (1, 2, 70, 16), np.float32(0.25))
    yield "attention_online", demo.ATTENTION, shapes, {"num_threads": 2,
                                                        "target": tiny_caches(Target.preset("x86-64-v3"))}


def bench_programs():
    """Every kernel of bench.py's suites and of the demo, per preset and thread count."""
    import bench
    cases = [*bench.cases(quick=False), *bench.resnet_cases(), *demo.DEMO_CASES,
             *(demo.attention_case(*shape) for shape in bench.LONG_ATTENTION)]
    seen = set()
    rng = np.random.default_rng(0)
    for case in cases:
        if (case.source, case.shapes) in seen:
            continue
        seen.add((case.source, case.shapes))
        shapes = shapes_of(case.make_args(rng))
        label = f"{case.name}-{case.shapes}".replace(" ", "_").replace("/", "-")
        for target in PRESETS:
            for threads in (1, 2):
                yield f"{label}-{target}-t{threads}", case.source, shapes, {"target": target, "num_threads": threads}


def draw_examples(strategy, count: int, seed: int) -> list:
    """``count`` values of a hypothesis strategy, the same ones on every run with this seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    drawn = []

    @with_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        drawn.append(value)

    collect()
    return drawn


def _with_target(options: dict, index: int) -> dict:
    """The drawn options, with a preset in turn when they name no target and 2 threads when
    they leave the count open (the host's count would make the corpus depend on the host)."""
    options = dict(options or {})
    if options.get("target") is None:
        options["target"] = PRESETS[index % len(PRESETS)]
    if options.get("num_threads") is None:
        options["num_threads"] = 2
    return options


def drawn_programs(count: int, seed: int, wanted=lambda group: True):
    """(group, name, source, shapes, options) of programs drawn from the tests' strategies
    (of the groups ``wanted`` accepts)."""
    import strategies
    import test_chain
    import test_contraction
    import test_conv
    import test_epilogue
    import test_fusion
    import test_online
    import test_winograd

    def gen_program(p):
        return p.source, shapes_of(p.args), p.options

    def case(c):
        return c.source, shapes_of(c.args), c.options

    def tuple_case(t):  # (source, args, options, ...)
        return t[0], shapes_of(t[1]), t[2]

    def epilogue(drawn):
        return case(drawn[0])

    def row_program(t):
        source, shape, threads = t
        return source, (shape,), {"num_threads": threads}

    def online(t):
        dtype, u, args, threads, target = t
        source = test_online.SOFTMAX_TIMES_V.format(u=u).replace("float", dtype)
        return source, shapes_of(args), {"num_threads": threads,
                                         "target": test_chain.tiny_caches(Target.preset(target))}

    groups = [
        ("programs", strategies.programs(), gen_program, count),
        ("kernels", strategies.kernel_programs(), gen_program, count // 2),
        ("contractions", test_contraction.contractions(), case, count // 2),
        ("convolutions", test_conv.convolutions(), case, count // 4),
        ("winograd", test_winograd.winograd_convolutions(), tuple_case, count // 4),
        ("epilogues", test_epilogue.epilogue_cases(), epilogue, count // 4),
        ("chains", test_chain.chains(), tuple_case, count // 4),
        ("online", test_online.cases(), online, count // 8),
        ("rows", test_fusion.row_programs(), row_program, count // 8),
    ]
    for group, strategy, unpack, n in groups:
        if not wanted(f"drawn-{group}"):
            continue
        for i, value in enumerate(draw_examples(strategy, n, seed)):
            source, shapes, options = unpack(value)
            yield f"drawn-{group}", f"{i:04d}", source, shapes, _with_target(options, i)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write (created; files in it are replaced)")
    parser.add_argument("--programs", type=int, default=120,
                        help="programs drawn from tests/strategies.py (the other strategies draw fewer)")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--only", default=None, help="only groups whose name contains this text")
    args = parser.parse_args(argv)

    def wanted(group):
        return not args.only or args.only in group

    def fixed(group, programs):
        if wanted(group):
            for i, (name, source, shapes, options) in enumerate(programs()):
                yield group, f"{i:04d}-{name}", source, shapes, options

    start, written = time.perf_counter(), 0
    corpus = itertools.chain(fixed("golden", golden_programs), fixed("bench", bench_programs),
                             drawn_programs(args.programs, args.seed, wanted))
    for group, name, source, shapes, options in corpus:
        path = args.out / group / f"{name}.c"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(source, shapes, options))
        written += 1
    print(f"{written} files in {args.out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
