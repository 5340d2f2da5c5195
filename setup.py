"""Build tcpy's Cython extension modules: the C emitter and the kernel launcher.

The runtime header in csrc/ is copied into the package so generated kernels can include it
from an installed tcpy.
"""
import shutil
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent


class BuildPyWithRuntimeHeader(build_py):
    """Ship csrc/*.h as tcpy/include/*.h."""

    def run(self):
        include = ROOT / "tcpy" / "include"
        include.mkdir(exist_ok=True)
        for header in (ROOT / "csrc").glob("*.h"):
            shutil.copy2(header, include / header.name)
        super().run()


extensions = [
    Extension("tcpy.codegen.emit", ["tcpy/codegen/emit.pyx"]),
    Extension("tcpy.runtime.launch", ["tcpy/runtime/launch.pyx"], include_dirs=[numpy.get_include()]),
]

setup(
    ext_modules=cythonize(extensions, language_level=3, compiler_directives={"binding": True}),
    cmdclass={"build_py": BuildPyWithRuntimeHeader},
)
