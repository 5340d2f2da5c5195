"""Which of tcpy's modules run compiled.

Two parts of tcpy are Python source that ``setup.py`` compiles with Cython (pure-Python mode) at
install time: the C renderer (every module of :mod:`tcpy.codegen`), and the run-time planner
that a size-generic kernel runs at every new call shape (``PLANNER_MODULES``: recognition of a
contraction at the call's sizes, the engine's plan and its plan buffer, the chains' block plans,
the ranges they read). Both stay importable uncompiled: ``TCPY_PURE_PYTHON=1`` makes tcpy load
the ``.py`` sources instead of the compiled modules beside them, so a developer can edit them
without rebuilding (and coverage can see them). A compiled module older than its source (an
edit since the last ``pip install -e .``) is not used either: the source runs, with a warning,
so an editable install never runs stale code.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path

from .errors import TCWarning

#: The run-time planner's modules (relative to the package), compiled besides the renderer: a
#: new call shape's planning runs through them (compiled, attention's and softmax's plans take a
#: fifth less time; a GEMM's or a convolution's, whose time goes to building objects, as long).
PLANNER_MODULES = (
    "binding", "contraction_ir", "ranges/affine", "ranges/index_values", "ranges/inference",
    "transform/contraction", "transform/direct_conv", "transform/engines", "transform/recognition",
    "transform/runtime_chains", "transform/runtime_plan", "transform/winograd",
)

# Files written by one build or install land within a second or two of each other; an edit
# to a source afterwards makes it newer than its compiled module by more than that.
_BUILD_SLACK_SECONDS = 2.0


def compiled_modules(directory: Path) -> dict[str, Path]:
    """The modules under ``directory`` that have a compiled extension beside their ``.py``
    source, by dotted name relative to it (``emit``, ``contraction.kernel``), with their source."""
    found = {}
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for built in directory.rglob("*" + suffix):
            source = built.with_name(built.name[:-len(suffix)] + ".py")
            if source.exists():
                found[".".join(source.with_suffix("").relative_to(directory).parts)] = source
    return dict(sorted(found.items()))


def stale_modules(directory: Path) -> list[str]:
    """The modules under ``directory`` whose compiled extension is older than their ``.py``
    source."""
    return [name for name, source in compiled_modules(directory).items() if _stale(source)]


def _stale(source: Path) -> bool:
    """Whether the compiled extension beside ``source`` is older than it."""
    stem = source.with_suffix("")
    built = [stem.with_name(stem.name + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    newest = max(path.stat().st_mtime for path in built if path.exists())
    return source.stat().st_mtime > newest + _BUILD_SLACK_SECONDS


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Imports the given modules from their ``.py`` files (Python's own finder prefers a
    compiled extension beside them)."""

    def __init__(self, sources: dict[str, Path]):
        self.sources = sources

    def find_spec(self, fullname, path=None, target=None):
        source = self.sources.get(fullname)
        return importlib.util.spec_from_file_location(fullname, source) if source is not None else None


def select_modules() -> None:
    """Make the modules of tcpy that must not run compiled (all of them under
    ``TCPY_PURE_PYTHON``, else the stale ones, with a warning) import from their sources.
    Called by the package before it imports any of them."""
    directory = Path(__file__).parent
    compiled = compiled_modules(directory)
    if os.environ.get("TCPY_PURE_PYTHON", "") not in ("", "0"):
        names = list(compiled)
    else:
        names = [name for name, source in compiled.items() if _stale(source)]  # (one walk of the package)
        if names:
            listed = [f"{__package__}.{n}" for n in names]
            which = (f"{listed[0]} is older than its source" if len(listed) == 1 else
                     f"{', '.join(listed[:-1])} and {listed[-1]} are older than their sources")
            warnings.warn(f"the compiled {which} in {directory}: running the source instead (slower); rebuild with "
                          "`pip install -e .`", TCWarning, stacklevel=2)
    if names:
        sys.meta_path.insert(0, _SourceFinder({f"{__package__}.{n}": compiled[n] for n in names}))
