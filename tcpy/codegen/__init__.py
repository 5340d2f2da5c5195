"""C code generation: :mod:`.emit` renders a kernel's loop IR as C.

The renderer is Python source compiled by Cython (pure-Python mode) when tcpy is installed.
``TCPY_PURE_PYTHON=1`` makes this package load the ``.py`` sources instead of the compiled
modules beside them, so a developer can edit the renderer without rebuilding (and coverage can
see it); ``emit.COMPILED`` says which one runs. A compiled module older than its source (an edit
since the last ``pip install -e .``) is not used either: the source runs, with a warning, so an
editable install never runs stale code.
"""
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path

from ..errors import TCWarning

_COMPILED_MODULES = ("emit",)

# Files written by one build or install land within a second or two of each other; an edit
# to a source afterwards makes it newer than its compiled module by more than that.
_BUILD_SLACK_SECONDS = 2.0


def stale_modules(directory: Path, names=_COMPILED_MODULES) -> list[str]:
    """The modules among ``names`` whose compiled extension in ``directory`` is older than
    their ``.py`` source."""
    stale = []
    for name in names:
        source = directory / f"{name}.py"
        built = [directory / f"{name}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        built = [path for path in built if path.exists()]
        if source.exists() and built and \
                source.stat().st_mtime > max(p.stat().st_mtime for p in built) + _BUILD_SLACK_SECONDS:
            stale.append(name)
    return stale


def _load_source(name: str) -> None:
    """Import ``tcpy.codegen.<name>`` from its ``.py`` file, not from the compiled module."""
    spec = importlib.util.spec_from_file_location(f"{__name__}.{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def _select_modules() -> None:
    here = Path(__file__).parent
    if os.environ.get("TCPY_PURE_PYTHON", "") not in ("", "0"):
        sources = list(_COMPILED_MODULES)
    else:
        sources = stale_modules(here)
        if sources:
            warnings.warn(f"the compiled {', '.join(f'tcpy.codegen.{n}' for n in sources)} is older than its "
                          f"source in {here}: running the source instead (slower); rebuild with "
                          "`pip install -e .`", TCWarning, stacklevel=3)
    for name in sources:
        _load_source(name)


_select_modules()
