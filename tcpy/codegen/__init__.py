"""C code generation: :mod:`.emit` renders a kernel's loop IR as C.

The renderer is Python source compiled by Cython (pure-Python mode) when tcpy is installed.
``TCPY_PURE_PYTHON=1`` makes this package load the ``.py`` sources instead of the compiled
modules beside them, so a developer can edit the renderer without rebuilding (and coverage can
see it); ``emit.COMPILED`` says which one runs.
"""
import importlib.util
import os
import sys
from pathlib import Path

_PURE_MODULES = ("emit",)

if os.environ.get("TCPY_PURE_PYTHON", "") not in ("", "0"):
    for _name in _PURE_MODULES:
        _spec = importlib.util.spec_from_file_location(f"{__name__}.{_name}", Path(__file__).with_name(f"{_name}.py"))
        _module = importlib.util.module_from_spec(_spec)
        sys.modules[_spec.name] = _module
        _spec.loader.exec_module(_module)
