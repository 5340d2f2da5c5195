"""Build tcpy's Cython extension modules: the C renderer, the run-time planner and the kernel
launcher.

The renderer (every module of ``tcpy/codegen/`` but the packages' ``__init__.py``) and the
run-time planner (``tcpy.compiled.PLANNER_MODULES``) are Python source in Cython's pure-Python
mode: they are compiled here, and stay importable uncompiled (``TCPY_PURE_PYTHON=1``, see
tcpy/compiled.py).

``pip install .`` and ``pip install -e .`` both work on a machine with only Python, pip and a C
compiler: the build requirements (setuptools, Cython, NumPy) come from pyproject.toml.

The runtime header that generated kernels include lives in ``csrc/``; it is copied into the built
package as ``tcpy/include/`` so an installed tcpy finds it. (A source checkout or an editable
install uses ``csrc/`` directly, see ``tcpy.runtime.build.runtime_include_dir``.)
"""
import ast
import os
import shutil
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent


class BuildPyWithRuntimeHeader(build_py):
    """Ship csrc/*.h as tcpy/include/*.h in the built package (not in the source tree)."""

    def run(self):
        super().run()
        include = Path(self.build_lib) / "tcpy" / "include"
        include.mkdir(parents=True, exist_ok=True)
        for header in sorted((ROOT / "csrc").glob("*.h")):
            shutil.copy2(header, include / header.name)

    def get_outputs(self, include_bytecode=True):
        # Declared so that wheel building and `pip install` record the copied headers.
        headers = [str(Path(self.build_lib) / "tcpy" / "include" / h.name) for h in (ROOT / "csrc").glob("*.h")]
        return super().get_outputs(include_bytecode) + headers


# The renderer's and the planner's C flags: -O2 and no debug info. Their modules call the Python C
# API everywhere, where -O3 gains a few percent at most, and they build twice as fast.
FAST_BUILD = ["-O2", "-g0"]


def renderer_extensions() -> list[Extension]:
    """One extension per module of the renderer (the packages' ``__init__`` files stay Python:
    tcpy/codegen/__init__.py chooses between the compiled modules and their sources)."""
    sources = sorted(path.relative_to(ROOT) for path in (ROOT / "tcpy" / "codegen").rglob("*.py")
                     if path.name != "__init__.py")
    return [Extension(".".join(path.with_suffix("").parts), [str(path)], extra_compile_args=FAST_BUILD)
            for path in sources]


def planner_extensions() -> list[Extension]:
    """One extension per module of the run-time planner, read from tcpy/compiled.py (not
    imported: the package is not built yet)."""
    tree = ast.parse((ROOT / "tcpy" / "compiled.py").read_text())
    (names,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "PLANNER_MODULES" for t in node.targets)]
    return [Extension("tcpy." + name.replace("/", "."), [f"tcpy/{name}.py"], extra_compile_args=FAST_BUILD)
            for name in names]


numpy_api = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
extensions = [
    *renderer_extensions(),
    Extension(
        "tcpy.runtime.launch",
        ["tcpy/runtime/launch.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=numpy_api,
        # linked with the kernels' libgomp: omp_get_max_threads() follows threadpoolctl
        extra_compile_args=["-fopenmp"],
        extra_link_args=["-fopenmp"],
    ),
]

jobs = os.cpu_count() or 1
setup(
    ext_modules=[
        *cythonize(extensions, language_level=3, compiler_directives={"binding": True}, nthreads=jobs),
        # the planner is plain Python: its annotations are documentation, not C types (a str
        # annotation would turn away a str subclass such as an enum's member)
        *cythonize(planner_extensions(), language_level=3, nthreads=jobs,
                   compiler_directives={"binding": True, "annotation_typing": False}),
    ],
    cmdclass={"build_py": BuildPyWithRuntimeHeader},
    options={"build_ext": {"parallel": jobs}},
)
