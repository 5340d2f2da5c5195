"""The C renderer: compiled by Cython when installed, identical output when run uncompiled."""
import importlib.machinery
import os
import shutil
import subprocess
import sys

import pytest

import tcpy
import tcpy.codegen.emit as emit
from tcpy.codegen import stale_modules

PRINT_GEMM_C = """
import tcpy, tcpy.codegen.emit as emit
from tcpy import demo
print(emit.COMPILED)
print(tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64-v3")).c_source((37, 45), (45, 600)))
"""


@pytest.mark.skipif(os.environ.get("TCPY_PURE_PYTHON", "") not in ("", "0"), reason="TCPY_PURE_PYTHON is set")
def test_the_installed_package_runs_the_compiled_renderer():
    assert emit.COMPILED is True, "tcpy/codegen/emit.py changed since the last build: run `pip install -e .`"
    assert not emit.__file__.endswith(".py")


def test_the_uncompiled_renderer_writes_the_same_c():
    def run(pure: str) -> list[str]:
        env = {**os.environ, "TCPY_PURE_PYTHON": pure}
        out = subprocess.run([sys.executable, "-c", PRINT_GEMM_C], capture_output=True, text=True, env=env,
                             check=True).stdout
        return out.split("\n", 1)

    (compiled_flag, compiled_c), (pure_flag, pure_c) = run("0"), run("1")
    assert (compiled_flag, pure_flag) == ("True", "False")
    assert pure_c == compiled_c


def test_a_compiled_module_older_than_its_source_is_stale(tmp_path):
    """An edit after the last build is noticed: the package then loads the source (see
    tcpy.codegen), so an editable install never runs a stale renderer."""
    source, built = tmp_path / "emit.py", tmp_path / f"emit{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    source.write_text("")
    built.write_bytes(b"")
    os.utime(source, (1_000_000, 1_000_000))
    os.utime(built, (1_000_001, 1_000_001))  # built right after the source was written: current
    assert stale_modules(tmp_path) == []
    os.utime(source, (1_000_100, 1_000_100))  # edited later
    assert stale_modules(tmp_path) == ["emit"]
    built.unlink()  # nothing compiled (a pure-Python install): nothing stale
    assert stale_modules(tmp_path) == []


def test_a_stale_renderer_runs_from_its_source_with_a_warning(tmp_path):
    """The package's own selection, on a copy of it whose compiled emit is older than emit.py."""
    package = tmp_path / "tcpy"
    shutil.copytree(os.path.dirname(tcpy.__file__), package, ignore=shutil.ignore_patterns("__pycache__"))
    emit_py = package / "codegen" / "emit.py"
    (built,) = [p for p in (package / "codegen" / f"emit{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES)
                if p.exists()]
    os.utime(built, (1_000_000, 1_000_000))
    os.utime(emit_py, (2_000_000, 2_000_000))
    script = ("import warnings; warnings.simplefilter('always')\n"
              "import tcpy.codegen.emit as emit; print(emit.COMPILED, emit.__file__)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TCPY_PURE_PYTHON": "0"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True,
                         cwd=tmp_path)
    assert run.stdout.split() == ["False", str(emit_py)]
    assert "older than its source" in run.stderr and "pip install -e ." in run.stderr
