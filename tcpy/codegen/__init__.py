"""C code generation: :mod:`.emit` renders a kernel's loop IR as C, :mod:`.contraction` a
contraction engine statement.

The renderer is Python source compiled by Cython (pure-Python mode) when tcpy is installed:
every module of this package but the packages' ``__init__`` files (see setup.py).
``TCPY_PURE_PYTHON=1`` makes this package load the ``.py`` sources instead of the compiled
modules beside them, so a developer can edit the renderer without rebuilding (and coverage can
see it); each module's ``COMPILED`` says which one runs. A compiled module older than its source
(an edit since the last ``pip install -e .``) is not used either: the source runs, with a
warning, so an editable install never runs stale code.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path

from ..errors import TCWarning

# Files written by one build or install land within a second or two of each other; an edit
# to a source afterwards makes it newer than its compiled module by more than that.
_BUILD_SLACK_SECONDS = 2.0


def compiled_modules(directory: Path) -> dict[str, Path]:
    """The modules under ``directory`` that have a compiled extension beside their ``.py``
    source, by dotted name relative to it (``emit``, ``contraction.kernel``), with their source."""
    found = {}
    for source in sorted(directory.rglob("*.py")):
        stem = source.with_suffix("")
        if any(stem.with_name(stem.name + suffix).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES):
            found[".".join(stem.relative_to(directory).parts)] = source
    return found


def stale_modules(directory: Path) -> list[str]:
    """The modules under ``directory`` whose compiled extension is older than their ``.py``
    source."""
    stale = []
    for name, source in compiled_modules(directory).items():
        stem = source.with_suffix("")
        built = [stem.with_name(stem.name + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        newest = max(path.stat().st_mtime for path in built if path.exists())
        if source.stat().st_mtime > newest + _BUILD_SLACK_SECONDS:
            stale.append(name)
    return stale


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Imports the given modules of this package from their ``.py`` files (Python's own finder
    prefers a compiled extension beside them)."""

    def __init__(self, sources: dict[str, Path]):
        self.sources = sources

    def find_spec(self, fullname, path=None, target=None):
        source = self.sources.get(fullname)
        return importlib.util.spec_from_file_location(fullname, source) if source is not None else None


def _select_modules() -> None:
    here = Path(__file__).parent
    compiled = compiled_modules(here)
    if os.environ.get("TCPY_PURE_PYTHON", "") not in ("", "0"):
        names = list(compiled)
    else:
        names = stale_modules(here)
        if names:
            listed = [f"{__name__}.{n}" for n in names]
            which = (f"{listed[0]} is older than its source" if len(listed) == 1 else
                     f"{', '.join(listed[:-1])} and {listed[-1]} are older than their sources")
            warnings.warn(f"the compiled {which} in {here}: running the source instead (slower); rebuild with "
                          "`pip install -e .`", TCWarning, stacklevel=3)
    if names:
        sys.meta_path.insert(0, _SourceFinder({f"{__name__}.{n}": compiled[n] for n in names}))


_select_modules()
