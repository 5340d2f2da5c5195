"""The C renderer and the run-time planner: compiled by Cython when installed, identical output
when run uncompiled."""
import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tcpy
import tcpy.codegen
import tcpy.codegen.emit as emit
from tcpy.compiled import PLANNER_MODULES, compiled_modules, stale_modules

PACKAGE_DIR = Path(tcpy.__file__).parent

PRINT_GEMM_C = """
import tcpy, tcpy.codegen.emit as emit, tcpy.codegen.contraction.kernel as kernel
from tcpy import demo
print(emit.COMPILED and not kernel.__file__.endswith(".py"))
print(tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64-v3")).c_source((37, 45), (45, 600)))
"""


# the plan buffers of generic kernels at a few shapes each (GEMM's paths, a Winograd convolution,
# attention's chain), one line per plan
PRINT_PLANS = """
import tcpy, tcpy.transform.runtime_plan as planner
from tcpy import demo
print(not planner.__file__.endswith(".py"))
for source, shapes in ((demo.GEMM, [((37, 45), (45, 600)), ((5, 3), (3, 7)), ((300, 200), (200, 500))]),
                       (demo.CONV2D, [((2, 16, 30, 30), (24, 16, 3, 3)), ((1, 3, 9, 9), (8, 3, 3, 3))]),
                       (demo.ATTENTION, [((1, 2, 300, 64),) * 3 + (0.1,), ((1, 3, 17, 32),) * 3 + (0.1,)])):
    for threads in (1, 2):
        kernel = tcpy.define(source, options=tcpy.Options(target="x86-64-v3", num_threads=threads,
                                                          specialize="never"))
        for shape in shapes:
            sizes = kernel._sizes(shape, {})
            generic = kernel._generic_plan(sizes)
            for buffer in kernel._engine_plans(generic, sizes):
                print(buffer.tolist())
"""


@pytest.mark.skipif(os.environ.get("TCPY_PURE_PYTHON", "") not in ("", "0"), reason="TCPY_PURE_PYTHON is set")
def test_the_installed_package_runs_the_compiled_renderer_and_planner():
    assert emit.COMPILED is True, "tcpy/codegen/emit.py changed since the last build: run `pip install -e .`"
    modules = compiled_modules(PACKAGE_DIR)
    assert {"codegen.emit", "codegen.cwriter", "codegen.contraction.kernel", "codegen.contraction.winograd"} <= set(modules)
    assert {name.replace("/", ".") for name in PLANNER_MODULES} <= set(modules)
    for name in modules:  # the whole renderer and planner, not only emit.py
        module = importlib.import_module(f"tcpy.{name}")
        assert not module.__file__.endswith(".py"), f"{module.__name__} runs from its source"


def test_the_uncompiled_renderer_writes_the_same_c():
    def run(pure: str) -> list[str]:
        env = {**os.environ, "TCPY_PURE_PYTHON": pure}
        out = subprocess.run([sys.executable, "-c", PRINT_GEMM_C], capture_output=True, text=True, env=env,
                             check=True).stdout
        return out.split("\n", 1)

    (compiled_flag, compiled_c), (pure_flag, pure_c) = run("0"), run("1")
    assert (compiled_flag, pure_flag) == ("True", "False")
    assert pure_c == compiled_c


def test_the_uncompiled_planner_makes_the_same_plans():
    def run(pure: str) -> list[str]:
        env = {**os.environ, "TCPY_PURE_PYTHON": pure}
        return subprocess.run([sys.executable, "-c", PRINT_PLANS], capture_output=True, text=True, env=env,
                              check=True).stdout.splitlines()

    compiled, pure = run("0"), run("1")
    assert (compiled[0], pure[0]) == ("True", "False")
    assert len(compiled) > 15 and pure[1:] == compiled[1:]


def test_a_compiled_module_older_than_its_source_is_stale(tmp_path):
    """An edit after the last build is noticed: the package then loads the source (see
    tcpy.compiled), so an editable install never runs a stale renderer or planner."""
    source, built = tmp_path / "emit.py", tmp_path / f"emit{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    source.write_text("")
    built.write_bytes(b"")
    os.utime(source, (1_000_000, 1_000_000))
    os.utime(built, (1_000_001, 1_000_001))  # built right after the source was written: current
    assert stale_modules(tmp_path) == []
    os.utime(source, (1_000_100, 1_000_100))  # edited later
    assert stale_modules(tmp_path) == ["emit"]
    nested = tmp_path / "contraction"  # a module of a package inside the renderer
    nested.mkdir()
    nested_built = nested / built.name.replace("emit", "kernel")
    (nested / "kernel.py").write_text("")
    nested_built.write_bytes(b"")
    os.utime(nested_built, (1_000_001, 1_000_001))
    os.utime(nested / "kernel.py", (1_000_200, 1_000_200))
    assert stale_modules(tmp_path) == ["contraction.kernel", "emit"]
    built.unlink()  # nothing compiled (a pure-Python install): nothing stale
    nested_built.unlink()
    assert stale_modules(tmp_path) == []


def test_a_stale_renderer_runs_from_its_source_with_a_warning(tmp_path):
    """The package's own selection, on a copy of it whose compiled emit and stores (a module of
    the contraction package) are older than their sources: those two run from source, the
    others stay compiled."""
    package = tmp_path / "tcpy"
    shutil.copytree(os.path.dirname(tcpy.__file__), package, ignore=shutil.ignore_patterns("__pycache__"))
    sources = [package / "codegen" / "emit.py", package / "codegen" / "contraction" / "stores.py"]
    for source in sources:
        built = [source.with_name(source.stem + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        (built,) = [path for path in built if path.exists()]
        os.utime(built, (1_000_000, 1_000_000))
        os.utime(source, (2_000_000, 2_000_000))
    script = ("import warnings; warnings.simplefilter('always')\n"
              "import tcpy.codegen.emit as emit, tcpy.codegen.contraction.stores as s, tcpy.codegen.cwriter as w\n"
              "print(emit.COMPILED, emit.__file__, s.__file__, w.__file__.endswith('.py'))")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TCPY_PURE_PYTHON": "0"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True,
                         cwd=tmp_path)
    assert run.stdout.split() == ["False", *map(str, sources), "False"]
    assert "tcpy.codegen.contraction.stores and tcpy.codegen.emit are older than their sources" in run.stderr
    assert "pip install -e ." in run.stderr


def test_the_named_scratch_slots_match_the_runtime_header():
    """Every slot the renderer names exists in the runtime header, and each has one name."""
    from tcpy.codegen.cwriter import ScratchSlot
    from tcpy.runtime.build import runtime_include_dir
    header = (Path(runtime_include_dir()) / "tcpy_runtime.h").read_text()
    (count,) = [int(line.split()[2]) for line in header.splitlines() if line.startswith("#define TCPY_SCRATCH_SLOTS")]
    assert sorted(int(slot) for slot in ScratchSlot) == list(range(count))
    assert f"tcpy_scratch({ScratchSlot.B_COLUMNS}, " == "tcpy_scratch(5, "  # as the C text names it
