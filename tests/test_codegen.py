"""The C renderer: compiled by Cython when installed, identical output when run uncompiled."""
import os
import subprocess
import sys

import pytest

import tcpy.codegen.emit as emit

PRINT_GEMM_C = """
import tcpy, tcpy.codegen.emit as emit
from tcpy import demo
print(emit.COMPILED)
print(tcpy.define(demo.GEMM, options=tcpy.Options(target="x86-64-v3")).c_source((37, 45), (45, 600)))
"""


@pytest.mark.skipif(os.environ.get("TCPY_PURE_PYTHON", "") not in ("", "0"), reason="TCPY_PURE_PYTHON is set")
def test_the_installed_package_runs_the_compiled_renderer():
    assert emit.COMPILED is True
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
